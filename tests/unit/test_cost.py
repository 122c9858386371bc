"""The cost model against hand-computed cases."""

import pytest

from labctl.bench import cost
from labctl.bench.cost import (
    PRESETS,
    SPELLED,
    CostQuery,
    Link,
    bytes_per_rank,
    collective_time_s,
    op_cost,
    parse_params,
    resolve_link,
    step_report,
)
from labctl.errors import ConfigError


def test_gpt2_760m_bf16_two_ranks():
    # S = 760e6 x 2 B = 1.52 GB; ring allreduce over 2 ranks moves 2(1)/2 x S = 1.52 GB = 12.16 Gbit
    # per rank; at 85% of 1 Gbit/s that is 12.16 / 0.85 = 14.306 s (+ 2 x 50 us latency).
    rows = step_report(CostQuery(760e6, "bf16"), 2, [resolve_link("1GbE"), resolve_link("10GbE"), resolve_link("400G-RoCE")])
    assert rows[0]["payload_bytes"] == pytest.approx(1.52e9)
    assert rows[0]["comm_s"] == pytest.approx(12.16 / 0.85 + 2 * 50e-6, rel=1e-9)
    assert rows[0]["comm_s"] == pytest.approx(14.3, abs=0.05)
    assert rows[1]["comm_s"] == pytest.approx(1.43, abs=0.01)
    assert rows[2]["comm_s"] == pytest.approx(0.036, abs=0.001)


@pytest.mark.parametrize("n, collective, factor", [
    (2, "allreduce", 1.0), (4, "allreduce", 1.5), (8, "allreduce", 1.75),
    (4, "reduce_scatter", 0.75), (4, "allgather", 0.75), (1, "allreduce", 0.0),
])
def test_busbw_factors(n, collective, factor):
    assert op_cost(SPELLED[collective], n).busbw == factor
    assert bytes_per_rank(1000.0, n, collective) == pytest.approx(1000.0 * factor)


def test_latency_term_and_single_rank():
    link = Link(1e9, 1e-3, name="x")
    # 4 ranks, 4 bytes: bandwidth term negligible, 2(n-1) = 6 hops of 1 ms.
    assert collective_time_s(4, 4, link, 1.0) == pytest.approx(6e-3, rel=1e-3)
    assert collective_time_s(4, 4, link, 1.0, "allgather") == pytest.approx(3e-3, rel=1e-3)
    assert collective_time_s(10**9, 1, link) == 0.0


def test_grad_accum_divides_the_ratio():
    one, eight = (step_report(CostQuery(1e8, "fp32", compute_s=0.5, grad_accum=k), 4, [PRESETS["1gbe"]])[0] for k in (1, 8))
    assert one["comm_s"] == eight["comm_s"]
    assert eight["comm_over_compute"] == pytest.approx(one["comm_over_compute"] / 8)
    assert eight["step_s_no_overlap"] == pytest.approx(8 * 0.5 + eight["comm_s"])


@pytest.mark.parametrize("text, params", [("760e6", 760e6), ("760M", 760e6), ("1.3B", 1.3e9), ("125m", 125e6)])
def test_parse_params(text, params):
    assert parse_params(text) == pytest.approx(params)


@pytest.mark.parametrize("call, fragment", [
    (lambda: parse_params("big"), "parameter count"),
    (lambda: parse_params("0"), "from 1"),
    (lambda: resolve_link("100mbps"), "preset"),
    (lambda: step_report(CostQuery(1e6, "int8"), 2, [PRESETS["1gbe"]]), "--dtype"),
    (lambda: step_report(CostQuery(1e6, "fp32", efficiency=1.5), 2, [PRESETS["1gbe"]]), "--efficiency"),
    (lambda: step_report(CostQuery(1e6, "fp32", grad_accum=0), 2, [PRESETS["1gbe"]]), "--grad-accum"),
    (lambda: bytes_per_rank(1.0, 2, "alltoall"), "--collective"),
])
def test_errors(call, fragment):
    with pytest.raises(ConfigError, match=fragment):
        call()


def test_resolve_link_presets_and_rates():
    assert resolve_link("nvlink").rate_bps == 3.6e12
    assert resolve_link("250mbit") == Link(250e6, 50e-6) and resolve_link("250mbit").name == "250mbit"


def test_cost_with_a_delay_adds_it_to_every_links_latency():
    [plain] = cost.links_to_price(["1gbit"], None)
    [delayed] = cost.links_to_price(["1gbit"], None, delay="5ms")
    assert delayed.name == "1gbit + 5ms" and delayed.delay_s == pytest.approx(plain.delay_s + 0.005)
    assert all(link.name.endswith(" + 5ms") for link in cost.links_to_price([], ("100mbit", 10**8), delay="5ms"))
    # 64 KiB of gradients across 3 ranks: 4 steps x 5 ms dwarf the bytes
    [row] = cost.estimate(cost.CostQuery(16 * 1024, "fp32", "3", ["1gbit"], delay="5ms")).rows
    assert 0.020 < row["comm_s"] < 0.022
    with pytest.raises(ConfigError, match="--delay='soon': must be a time"):
        cost.links_to_price(["1gbit"], None, delay="soon")


# --- a whole optimizer step of each strategy: the trainer's --strategy -----------------------------

def test_a_strategys_step_by_hand_fsdp_and_zero_send_one_and_a_half_times_ddps_bytes():
    link = PRESETS["1gbe"]  # 1 Gbit/s, alpha 50 us
    S = 1e8 * 4  # 1e8 fp32 parameters
    rows = {s: step_report(CostQuery(1e8, "fp32", strategy=s), 4, [link])[0] for s in ("ddp", "zero", "fsdp")}
    # by hand, n = 4: an allreduce moves 2 x 3/4 x S through each NIC, an all-gather or reduce-scatter 3/4 x S
    assert rows["ddp"]["bytes_per_rank_per_step"] == pytest.approx(1.5 * S)
    assert rows["zero"]["bytes_per_rank_per_step"] == pytest.approx(1.5 * S + 0.75 * S)
    assert rows["fsdp"]["bytes_per_rank_per_step"] == pytest.approx(3 * 0.75 * S)
    assert rows["fsdp"]["bytes_per_rank_per_step"] == pytest.approx(1.5 * rows["ddp"]["bytes_per_rank_per_step"])
    # time: bytes / (rate x 0.85) plus 2(n-1) hops of alpha for the allreduce, n-1 for each of the others
    wire = 8 / (1e9 * 0.85)
    assert rows["ddp"]["comm_s"] == pytest.approx(1.5 * S * wire + 6 * 50e-6)
    assert rows["fsdp"]["comm_s"] == pytest.approx(2.25 * S * wire + 3 * 3 * 50e-6)
    # what one rank holds: 4 bytes of parameter, 4 of gradient, 8 of Adam's moments per parameter
    assert [rows[s]["state_bytes_per_rank"] for s in ("ddp", "zero", "fsdp")] == \
           pytest.approx([16e8, 8e8 + 8e8 / 4, 16e8 / 4])
    assert all(r["strategy"] == s for s, r in rows.items())


def test_a_bf16_step_keeps_an_fp32_master_copy_and_fsdp_gathers_again_each_micro_step():
    [row] = step_report(CostQuery(1e6, "bf16", strategy="ddp"), 2, [PRESETS["1gbe"]])
    assert row["state_bytes_per_rank"] == 16e6  # 2 + 2 + 12 bytes a parameter (the ZeRO paper's K = 12)
    S = 2e6
    [row] = step_report(CostQuery(1e6, "bf16", strategy="fsdp", grad_accum=4), 2, [PRESETS["1gbe"]])
    assert row["bytes_per_rank_per_step"] == pytest.approx((2 * 4 + 1) * 0.5 * S)


def test_a_strategy_prices_a_step_so_a_collective_beside_it_is_refused():
    with pytest.raises(ConfigError, match="--collective"):
        step_report(CostQuery(1e6, "fp32", collective="allgather", strategy="fsdp"), 2, [PRESETS["1gbe"]])
    with pytest.raises(ConfigError, match="--strategy"):
        step_report(CostQuery(1e6, "fp32", strategy="mesh"), 2, [PRESETS["1gbe"]])


# --- every op as its backend runs it: what `bench collectives` measures --------------------------

@pytest.mark.parametrize("op, backend, hops, wire, busbw", [
    ("all_reduce", "nccl", 4, 4 / 3, 4 / 3), ("all_reduce", "gloo", 4, 4 / 3, 4 / 3),
    ("all_gather", "gloo", 2, 2 / 3, 2 / 3), ("reduce_scatter", "nccl", 2, 2 / 3, 2 / 3),
    # gloo reduce-scatters with an all-reduce of the whole input: an all-reduce's steps and bytes,
    # while nccl-tests' busbw factor stays the op's own
    ("reduce_scatter", "gloo", 4, 4 / 3, 2 / 3),
    ("broadcast", "nccl", 2, 1.0, 1.0), ("broadcast", "gloo", 2, 2.0, 1.0),  # a binomial tree: 2 rounds for 3
    ("all_to_all", "gloo", 1, 2 / 3, 2 / 3),
])
def test_each_op_on_three_ranks_by_hand(op, backend, hops, wire, busbw):
    c = cost.op_cost(op, 3, backend)
    assert (c.hops, c.wire, c.busbw) == (hops, pytest.approx(wire), pytest.approx(busbw))
    assert cost.op_cost(op, 1, backend).wire == 0.0


def test_an_unknown_op_is_refused_with_the_ops_there_are():
    with pytest.raises(ConfigError, match="all_reduce, all_gather, reduce_scatter, broadcast, all_to_all"):
        cost.op_cost("gather", 3)


def test_on_gloo_fsdp_sends_twice_ddps_bytes_since_its_reduce_scatter_is_an_all_reduce():
    link, n = PRESETS["1gbe"], 4
    rows = {s: step_report(CostQuery(1e8, "fp32", strategy=s, backend="gloo"), n, [link])[0]
            for s in ("ddp", "zero", "fsdp")}
    s = 4e8
    assert rows["ddp"]["bytes_per_rank_per_step"] == pytest.approx(2 * 3 / 4 * s)
    assert rows["zero"]["bytes_per_rank_per_step"] == pytest.approx(3 * 3 / 4 * s)  # ZeRO has no reduce-scatter
    assert rows["fsdp"]["bytes_per_rank_per_step"] == pytest.approx((2 * 3 / 4 + 2 * 3 / 4) * s)
    assert rows["fsdp"]["bytes_per_rank_per_step"] == pytest.approx(2 * rows["ddp"]["bytes_per_rank_per_step"])
    with pytest.raises(ConfigError, match="--backend"):
        step_report(CostQuery(1e8, "fp32", strategy="fsdp", backend="mpi"), n, [link])


def test_hsdp_sends_between_nodes_only_the_shards_all_reduce_and_a_node_carries_ddps_bytes():
    # 6 ranks, 2 a node (3 nodes), S = 400 MB: each rank all-reduces its 200 MB shard with its 2 peers
    # on the other nodes, 2(3-1)/3 x 200 MB; the node's link carries both of its ranks'.
    link = PRESETS["1gbe"]
    [h] = step_report(CostQuery(1e8, "fp32", strategy="hsdp", nproc_per_node=2), 6, [link])
    assert h["bytes_per_rank_per_step"] == pytest.approx(4 / 3 * 2e8)
    assert h["bytes_per_node_per_step"] == pytest.approx(4 / 3 * 4e8)
    assert h["comm_s"] == pytest.approx(4 / 3 * 4e8 * 8 / (1e9 * 0.85) + 4 * 50e-6)
    assert h["state_bytes_per_rank"] == pytest.approx(16 * 1e8 / 2)  # sharded over a node's 2 ranks
    # the flat strategies' rings cross each node once: a node sends one rank's bytes
    [d] = step_report(CostQuery(1e8, "fp32", strategy="ddp", nproc_per_node=2), 6, [link])
    assert d["bytes_per_node_per_step"] == d["bytes_per_rank_per_step"] == pytest.approx(10 / 6 * 4e8)


@pytest.mark.parametrize("per_node, fragment", [(1, "must be 2 or more for hsdp"), (4, "must divide the 6 ranks")])
def test_hsdp_needs_whole_nodes_of_two_ranks_or_more(per_node, fragment):
    with pytest.raises(ConfigError, match=fragment):
        step_report(CostQuery(1e8, "fp32", strategy="hsdp", nproc_per_node=per_node), 6, [PRESETS["1gbe"]])


def test_step_cost_cuts_buckets_and_derives_compute_from_a_flop_rate():
    from labctl.bench.stepcost import StepQuery, buckets, micro_step_s

    assert buckets(60 * 2**20, 25) == (25 * 2**20, 25 * 2**20, 10 * 2**20)
    assert buckets(2**20, 25) == (2**20,)
    seconds, how = micro_step_s(1e9, StepQuery(flops=6e12, tokens=1000))
    assert seconds == pytest.approx(1.0) and how.startswith("6 x")
    assert micro_step_s(1e9, StepQuery(compute_s=0.25)) == (0.25, "given")
