"""The step model's arithmetic (trainer/stepmodel.py) and the calibration's pure parts (trainer/calibrate.py)."""

import json

import pytest

from trainer import stepmodel
from trainer.tclinks import parse_qdiscs, ring_hops
from trainer.stepmodel import ComputeTimes, Job, Link, ddp_buckets, predict

MB = 1 << 20


def test_buckets_close_once_they_reach_the_cap():
    assert ddp_buckets([400_000, 700_000, 300_000, 100], MB) == (1_100_000, 300_100)
    assert ddp_buckets([10] * 5, 25 * MB) == (50,)
    assert ddp_buckets([], MB) == ()


def test_one_rank_is_compute_and_optimizer():
    p = predict(Job(world=1), ComputeTimes(4.0, 6.0, 1.5), None)
    assert (p.step_ms, p.comm_ms, p.exposed_comm_ms) == (11.5, 0.0, 0.0)


def test_accumulation_multiplies_the_compute_not_the_allreduce():
    link = Link(rate_bps=100e6)
    one = predict(Job(world=2, buckets=(1_000_000,)), ComputeTimes(4.0, 6.0, 1.0), link)
    four = predict(Job(world=2, accum=4, buckets=(1_000_000,)), ComputeTimes(4.0, 6.0, 1.0), link)
    assert four.step_ms - one.step_ms == pytest.approx(30.0)
    assert four.comm_ms == one.comm_ms == pytest.approx(1_000_000 * 8 / 100e6 * 1e3)  # 2(n-1)/n = 1 at n=2


def test_one_bucket_is_all_exposed_and_small_buckets_hide_behind_backward():
    link = Link(rate_bps=1e9)
    compute = ComputeTimes(forward_ms=10.0, backward_ms=40.0, optimizer_ms=0.0)
    one = predict(Job(world=2, buckets=(4_000_000,)), compute, link)
    assert one.exposed_comm_ms == pytest.approx(32.0)  # ready when backward ends: nothing hides
    four = predict(Job(world=2, buckets=(1_000_000,) * 4), compute, link)
    # each 8 ms bucket is ready every 10 ms of backward: only the last one's 8 ms is exposed
    assert four.exposed_comm_ms == pytest.approx(8.0)
    assert four.comm_ms == pytest.approx(one.comm_ms)


def test_the_ring_pays_the_delay_every_hop_and_hides_the_stack_behind_a_long_transfer():
    link = Link(rate_bps=1e9, stack_s=0.001, delay_s=0.005)
    assert link.op_s("all_reduce", 1000, 3, "gloo") * 1e3 == pytest.approx(4 * 5.0 + 4 * 1.0)  # latency-bound
    big = 3_000_000  # 4 MB through each NIC: 32 ms, longer than the 4 hops' 4 ms of stack
    assert link.op_s("all_reduce", big, 3, "gloo") * 1e3 == pytest.approx(4 * 5.0 + 32.0)
    assert link.op_s("all_reduce", 1000, 1, "gloo") == 0.0


def test_a_banked_burst_passes_unpaced():
    link = Link(rate_bps=100e6, burst_bytes=131_072)
    assert link.credit(idle_s=1.0) == 131_072
    assert link.credit(idle_s=0.0) == 0.0
    paced = link.op_s("all_reduce", 600_000, 2, "gloo", credit_bytes=131_072)
    assert paced == pytest.approx((600_000 - 131_072) * 8 / 100e6)


def test_the_lockstep_compute_shows_as_waiting_for_the_slowest_rank():
    compute = ComputeTimes(5.0, 10.0, 2.0, own_ms=15.0, lockstep_ms=21.0)
    p = predict(Job(world=3, buckets=(100,)), compute, Link(rate_bps=1e9))
    assert p.waiting_ms == pytest.approx(6.0)
    assert p.step_ms == pytest.approx(21.0 + p.exposed_comm_ms - 6.0 + 2.0)


def test_zero_adds_its_broadcasts_and_fsdp_its_gathers_outside_backward():
    link, compute = Link(rate_bps=1e9), ComputeTimes(5.0, 10.0, 1.0)
    ddp = predict(Job(world=3, buckets=(3_000_000,), param_bytes=3_000_000), compute, link)
    zero = predict(Job(world=3, strategy="zero", buckets=(3_000_000,), param_bytes=3_000_000), compute, link)
    # gloo's binomial broadcast of each rank's third: 2 rounds of 1 MB at 1 Gbit/s
    assert zero.step_ms - ddp.step_ms == pytest.approx(16.0)
    units = (1_000_000,) * 3  # two blocks and the root
    fsdp = predict(Job(world=3, strategy="fsdp", accum=2, param_bytes=3_000_000, units=units), compute, link)
    assert set(fsdp.terms) == {"all_gather_ms", "reduce_scatter_ms"}
    # a micro-step gathers every unit for forward, and the blocks again for backward: 5 calls, twice
    assert fsdp.terms["all_gather_ms"] == pytest.approx(2 * 5 * 2 / 3 * 1_000_000 * 8 / 1e9 * 1e3)
    assert fsdp.terms["reduce_scatter_ms"] == pytest.approx(3 * 4 / 3 * 1_000_000 * 8 / 1e9 * 1e3)  # gloo: all-reduces


def test_zeros_broadcasts_pay_each_calls_latency_two_at_a_time_on_gloo():
    link = Link(rate_bps=1e12, stack_s=0.001)
    job = Job(world=4, strategy="zero", buckets=(100,), param_bytes=100, tensors=28)
    # 28 calls of 2 rounds (a binomial tree over 4 ranks) of 1 ms, gloo's two threads at once
    assert stepmodel.zero_broadcast_ms(job, link) == pytest.approx(28.0, rel=1e-3)
    assert predict(job, ComputeTimes(1.0, 1.0, 0.0), link).terms["broadcast_ms"] == pytest.approx(28.0, rel=1e-3)


def test_a_calibrated_link_prices_zeros_broadcasts_at_its_measured_turn_in_a_queue():
    """Where the calibration timed a queue of small broadcasts (Link.queue_s: a call's turn, its rounds,
    threads and the link's delay in it), each call costs that turn, not rounds of the lone stack's."""
    job = Job(world=4, strategy="zero", buckets=(100,), param_bytes=100, tensors=28)
    link = Link(rate_bps=1e12, stack_s=0.001, delay_s=0.002, queue_s=0.0009)
    assert stepmodel.zero_broadcast_ms(job, link) == pytest.approx(28 * 0.9, rel=1e-3)
    # and the bytes still go down the tree: a quarter of 4 MB, two rounds, at 1 Gbit/s, added
    big = Job(world=4, strategy="zero", buckets=(4e6,), param_bytes=4e6, tensors=28)
    slow = Link(rate_bps=1e9, queue_s=0.0009)
    assert stepmodel.zero_broadcast_ms(big, slow) == pytest.approx(28 * 0.9 + 2 * 1e6 * 8 / 1e9 * 1e3, rel=1e-3)
    # a run's inputs read back give the same link, its measured turn included (`labctl cost --from-run`)
    assert stepmodel.from_record(stepmodel.inputs_record(big, ComputeTimes(1.0, 1.0, 0.0), slow))[2] == slow


def test_tc_json_gives_the_slowest_tbf_each_way_and_netem_delay():
    qdiscs = [{"kind": "noqueue", "dev": "lo"},
              {"kind": "tbf", "dev": "eth0", "options": {"rate": 12_500_000, "burst": 131_062}},
              {"kind": "netem", "dev": "eth0", "options": {"delay": {"delay": 0.005}}},
              {"kind": "tbf", "dev": "ifb0", "options": {"rate": 125_000_000, "burst": 131_072}}]
    shaping = parse_qdiscs(qdiscs)
    assert shaping["egress"] == {"rate_bps": 100e6, "burst_bytes": 131_062, "delay_s": 0.005}
    assert shaping["ingress"]["rate_bps"] == 1e9
    assert parse_qdiscs([{"kind": "fq_codel", "dev": "eth0", "options": {}}]) == {}


def test_the_htb_under_tbf_that_sends_short_packets_first_is_no_shaper_of_its_own():
    # `tc -j qdisc show` in a node after `labctl shape --bw 1gbit` (iproute2 6.1, 2026-11-29)
    qdiscs = json.loads(
        '[{"kind":"noqueue","handle":"0:","dev":"lo","root":true,"refcnt":2,"options":{}},'
        '{"kind":"tbf","handle":"1:","dev":"eth0","root":true,"refcnt":3,"options":{"rate":125000000,"burst":131000,"lat":2000}},'
        '{"kind":"bfifo","handle":"21:","dev":"eth0","parent":"20:1","options":{"limit":381072}},'
        '{"kind":"htb","handle":"20:","dev":"eth0","parent":"1:1","options":{"r2q":10,"default":"0x2",'
        '"direct_packets_stat":0,"direct_qlen":1000}},'
        '{"kind":"bfifo","handle":"22:","dev":"eth0","parent":"20:2","options":{"limit":381072}}]')
    assert parse_qdiscs(qdiscs) == {"egress": {"rate_bps": 1e9, "burst_bytes": 131000}}


def test_the_ring_hops_between_nodes_take_the_slower_of_sender_and_receiver():
    shaping = {"a": {"egress": {"rate_bps": 100e6, "burst_bytes": 1.0}}, "b": {"ingress": {"rate_bps": 50e6}}}
    hops = ring_hops(["a", "a", "b", "b"], shaping)  # 0->1 and 2->3 stay on their node
    assert [h["rate_bps"] for h in hops] == [50e6, None]  # a->b: b's ingress is slower; b->a: unshaped
    assert ring_hops(["a", "a"], shaping) == []


def test_payload_efficiency_is_a_full_segment_in_its_frame():
    assert stepmodel.PAYLOAD_EFFICIENCY == pytest.approx(0.9564, abs=1e-4)


def test_a_nodes_cpu_quota_is_read_from_cgroup_v2_or_v1(tmp_path):
    from trainer.calibrate import cpu_quota

    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("50000 100000\n")
    assert cpu_quota(str(v2)) == 0.5
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(str(v2)) is None
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("25000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(str(tmp_path / "v1")) == 0.25
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(str(tmp_path / "v1")) is None
    assert cpu_quota(str(tmp_path / "none")) is None


def test_a_quota_slows_a_rank_by_its_cpu_time_over_what_it_may_use():
    from trainer.calibrate import sustained

    # 10 ms of wall and of CPU a micro-step, alone on a node held to half a CPU: 20 ms once throttled
    assert sustained({"forward": 4.0, "backward": 6.0, "cpu": 10.0, "local_ranks": 1, "quota": 0.5}) == 2.0
    # two ranks on a node of 4 CPUs: the quota never bites
    assert sustained({"forward": 4.0, "backward": 6.0, "cpu": 10.0, "local_ranks": 2, "quota": 4.0}) == 1.0
    assert sustained({"forward": 4.0, "backward": 6.0, "cpu": 10.0, "local_ranks": 1, "quota": None}) == 1.0


def test_a_ring_with_faster_hops_sends_chunks_while_waiting_for_the_last_rank():
    """Links between groups: a slow hop's sender gets as many chunks ahead of the last rank to be
    ready as that rank sits steps up the ring, the least over the slow hops, averaged over which
    rank is last; with every hop as slow, nothing is gained."""
    job = Job(world=4, buckets=(400_000,), param_bytes=400_000)
    compute = ComputeTimes(10.0, 10.0, 0.0, lockstep_ms=40.0)  # 20 ms of waiting for the slowest rank
    chunk_ms = 100_000 * 8 / 1e8 * 1e3  # 8 ms
    one_slow = Link(rate_bps=1e8, slow_senders=(0,))  # rank 0 -> rank 3 only: 0, 1, 2, 3 chunks ahead
    assert predict(job, compute, one_slow).sent_while_waiting_ms == pytest.approx((0 + 8 + 16 + 20) / 4)  # capped at the wait
    two_slow = Link(rate_bps=1e8, slow_senders=(0, 2))  # the last rank 1 or 3: one chunk ahead; 0 or 2: none
    assert predict(job, compute, two_slow).sent_while_waiting_ms == pytest.approx(chunk_ms / 2)
    every, unknown = Link(rate_bps=1e8, slow_senders=(0, 1, 2, 3)), Link(rate_bps=1e8)
    assert predict(job, compute, every).sent_while_waiting_ms == 0.0 == predict(job, compute, unknown).sent_while_waiting_ms
    assert predict(job, compute, unknown).step_ms - predict(job, compute, two_slow).step_ms == pytest.approx(chunk_ms / 2)
    forward = Link(rate_bps=1e8, slow_senders=(0,), ring_step=1)  # a ring turning the other way: 0, 3, 2, 1 ahead
    assert predict(job, compute, forward).sent_while_waiting_ms == pytest.approx((0 + 20 + 16 + 8) / 4)
    assert predict(job, ComputeTimes(10.0, 10.0, 0.0), one_slow).sent_while_waiting_ms == 0.0  # nobody to wait for


def test_fsdp_pays_its_own_hooks_each_micro_step():
    """FSDP2's work around each unit, calibrated on a one-rank mesh, is a term of its own, paid each micro-step."""
    job = Job(world=4, strategy="fsdp", accum=2, param_bytes=400_000, units=(100_000, 100_000, 200_000))
    link = Link(rate_bps=1e9)
    bare = predict(job, ComputeTimes(5.0, 5.0, 1.0), link)
    hooked = predict(job, ComputeTimes(5.0, 5.0, 1.0, wrapper_ms=20.0), link)
    assert hooked.terms["fsdp_hooks_ms"] == 40.0 and "fsdp_hooks_ms" not in bare.terms
    assert hooked.step_ms - bare.step_ms == pytest.approx(40.0)
    ddp = predict(Job(world=4, buckets=(400_000,)), ComputeTimes(5.0, 5.0, 1.0, wrapper_ms=20.0), link)
    # nothing FSDP adds; DDP's own work is in no term (docs/explanation/cost-model.md, "On a busy host")
    assert "fsdp_hooks_ms" not in ddp.terms
