"""labctl's delay, jitter and loss on a real netem kernel (issue 16, part 2).

The machines this suite runs on have no sch_netem, so here labctl's tc programs run in a QEMU VM
with Debian's stock kernel (tests/netem/: netem_vm.py says how). One boot serves every test
below (about a minute of wall time; in the guest's time, 7.5 s to boot and 33 s of measuring);
`make netem-vm` installs QEMU and prepares the kernel and initramfs, and the tests fail, never
skip, when that was not done. Both nodes (network namespaces A and B joined by veth) get the
same shape, as `labctl shape` shapes every node, so a delay D on egress adds 2*D to a round trip,
and with --ingress 4*D.

The VM's clock counts instructions (netem_vm.QEMU_CLOCK), so every time below is the guest's own:
the same on a fast machine, a slow one or a busy one, and this module runs beside other tests. The
only spread left is netem's own random draws (jitter, loss). Tolerances, from 6 runs on this
project's machine (2 cores, one boot each, 53 to 73 s of wall time, the kernel up in 7.46 s of
guest time). "base" is the unshaped round trip of the same boot (median 0.166 ms in every run:
the guest's own cost, which rides on every shaped round trip too):
- delay 10 ms each way: netem never sends early, so no round trip is under 20 ms (the minimum
  measured 20.204 to 20.208). The median exceeds 20 ms + base by 0.058 to 0.062 ms; we allow
  0.5 ms. A netem that did nothing gives ~0.2 ms and fails at once; one that delayed 10% more
  fails too.
- the same delay under a 1gbit tbf, and ingress (5 ms on egress and 5 ms on the ifb of each
  node): the same 20 ms, the same bounds (excess 0.058 to 0.062 ms both); egress alone would give
  10 ms, so this fails if the ifb redirect does not delay.
- jitter 10 ms +- 5 ms: netem without a distribution table draws the delay uniformly from
  [5, 15] ms, so a round trip is 20 ms + the sum of two such draws: a triangular spread over
  [10, 30] ms, p10 and p90 at -+5.53 ms, stdev 4.08 ms. Measured over 400 pings: min 10.7 to 11.6,
  p10 14.2 to 15.2, median 19.9 to 20.8, p90 25.2 to 26.4, max 29.6 to 30.3, stdev 3.92 to 4.32.
  For 400 draws the sampling error of the median is about 0.26 ms and of p10 and p90 about
  0.34 ms. We assert the median within 1.5 ms of 20 ms + base, p10 and p90 within 2 ms of theory +
  base (about 6 standard errors each), min >= 10 ms, p90-p10 at least 5 times the no-jitter
  case's, stdev between 3.5 and 5 ms, and at most 2% of samples over 30.5 ms.
- loss 1% on A's egress: iperf3 UDP A -> B, about 12,500 datagrams (5 s at 2 Mbit/s of 100-byte
  payloads). The count lost must lie in the 99.9% two-sided binomial interval for p = 1% (for
  12,500: 90 to 163, 0.72% to 1.30%); measured 109 to 132 (0.87% to 1.06%).
  A netem that dropped nothing fails; one that dropped 2% does too.
- links between groups (`labctl shape --to`): each node's link to the other alone, at 1gbit with
  10 ms of netem under its htb class, the rest of the link unshaped: the same 20 ms round trip and
  bounds as the delay above, so the u32 filter on the peer's address sends the traffic through
  the class and its netem; and tc's class and filter lines read back as that route.
- rate 100 Mbit/s + 5 ms: iperf3 TCP A -> B for 5 s. TCP's goodput on a 100 Mbit/s wire is at
  most 100 * 1448/1514 = 95.6 Mbit/s (headers); measured 95.11 to 95.21. We allow 92% to 105% of
  that (88 to 100.4). Unshaped, the same VM moves 2.24 to 2.25 Gbit/s; we require over 5 times the
  rate, so the cap is tbf's and not the emulator's.
"""

from __future__ import annotations

import math
import shutil
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "netem"))

import netem_vm  # noqa: E402

from labctl.net.routes import parse_routed_link  # noqa: E402
from labctl.net.tc import netem_missing, parse_link_state  # noqa: E402

TIMER_SLACK_MS = 0.5
JITTER_QUANTILE_MS = 2.0
# The loss count's two-sided binomial interval: at 99.9% it failed, as it must about once in a
# thousand runs, in the thirtieth or so run here (89 lost of 12,499 at 1%, against 90..163). At 99.99%
# it is 84..171: half the loss (57..68 lost) and twice it (239..260) still fall far outside.
LOSS_CONFIDENCE = 0.9999


@pytest.fixture(scope="module")
def vm_run():
    if not shutil.which(netem_vm.QEMU):
        pytest.fail(f"{netem_vm.QEMU} is missing: `make netem-vm` installs QEMU and prepares the VM", pytrace=False)
    try:
        vm = netem_vm.prepare()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    run = netem_vm.boot(vm)
    summary = netem_vm.summarize(run)
    print(f"netem VM ({vm.version}): {summary}")
    return run, summary


def case(name: str) -> netem_vm.Case:
    return next(c for c in netem_vm.CASES if c.name == name)


def binomial_interval(n: int, p: float, confidence: float) -> tuple[int, int]:
    """The smallest lo and largest hi with P(X < lo) <= a/2 and P(X > hi) <= a/2, X ~ B(n, p)."""
    alpha = (1 - confidence) / 2
    log_p, log_q = math.log(p), math.log1p(-p)

    def pmf(k: int) -> float:
        return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)

    lo, below = 0, 0.0
    while below + pmf(lo) <= alpha:
        below += pmf(lo)
        lo += 1
    hi, above = n, 0.0
    while above + pmf(hi) <= alpha:
        above += pmf(hi)
        hi -= 1
    return lo, hi


def test_binomial_interval_matches_the_normal_approximation():
    lo, hi = binomial_interval(12_500, 0.01, LOSS_CONFIDENCE)
    z = statistics.NormalDist().inv_cdf(1 - (1 - LOSS_CONFIDENCE) / 2)  # 3.89 at 99.99%
    assert (lo, hi) == pytest.approx((125 - z * 11.12, 125 + z * 11.12), abs=3)


def test_the_probe_tells_a_kernel_without_netem_from_one_with_it(vm_run):
    run, _ = vm_run
    before, loaded, after = run.block("probe-before", "probe"), run.block("load-netem", "insmod"), \
        run.block("probe-after", "probe")
    assert before.rc != 0 and netem_missing(before.text), before.text
    assert loaded.rc == 0, loaded.text
    assert after.rc == 0 and not netem_missing(after.text), after.text


def test_labctl_reads_back_what_it_applied(vm_run):
    run, _ = vm_run
    for c in netem_vm.CASES:
        state = parse_link_state(run.block(c.name, "qdisc-A").text, run.block(c.name, "qdisc-A-ifb").text)
        if c.route is not None:
            routed = parse_routed_link(run.block(c.name, "qdisc-A").text, run.block(c.name, "class-A").text,
                                       run.block(c.name, "filter-A").text)
            assert routed.kind == "none" and len(routed.routes) == 1, (c.name, routed)  # the rest unshaped
            route = routed.routes[0]
            assert route.dsts == (netem_vm.ADDRESSES["B"],), (c.name, route)
            assert (route.state.rate_bps, route.state.delay_us) == (c.route.rate_bps, c.route.delay_us), (c.name, route)
            continue
        if c.shape is None:
            assert state.kind == "none", (c.name, state)
            continue
        assert (state.rate_bps, state.delay_us or 0, state.jitter_us or 0, state.loss_pct or 0.0, state.ingress) == \
            (c.shape.rate_bps, c.shape.delay_us, c.shape.jitter_us, c.shape.loss_pct, c.shape.ingress), (c.name, state)
        kind = "+".join(["tbf"] * bool(c.shape.rate_bps) + ["netem"] * c.shape.needs_netem)
        assert state.kind == kind, (c.name, state)


def test_the_unshaped_round_trip_is_the_emulators_own(vm_run):
    _, summary = vm_run
    base = summary["base"]
    assert base["received"] == base["sent"], base
    assert base["median"] < 2.0, base


@pytest.mark.parametrize("name", [c.name for c in netem_vm.CASES if c.rtt_ms is not None])
def test_delay_on_both_nodes_adds_twice_to_the_round_trip(vm_run, name):
    _, summary = vm_run
    expected_ms = case(name).rtt_ms
    rtt, base = summary[name], summary["base"]["median"]
    assert rtt["received"] == rtt["sent"], rtt
    # netem holds a packet at least its delay: no round trip may be shorter (less 0.1 ms of rounding).
    assert rtt["min"] >= expected_ms - 0.1, rtt
    assert expected_ms + base - 0.5 <= rtt["median"] <= expected_ms + base + TIMER_SLACK_MS, (rtt, base)


def test_jitter_spreads_the_round_trip_as_configured(vm_run):
    run, summary = vm_run
    rtt, plain, base = summary["jitter"], summary["delay"], summary["base"]["median"]
    shape = case("jitter").shape
    mean_ms, jitter_ms = 2 * shape.delay_us / 1000, shape.jitter_us / 1000
    # The sum of two uniform draws on [-j, j] (one per node): triangular on [-2j, 2j], whose 10th
    # and 90th percentiles lie at -+2j(1 - sqrt(0.2)) and whose stdev is j*sqrt(2/3).
    quantile_offset = 2 * jitter_ms * (1 - math.sqrt(0.2))
    assert rtt["received"] == rtt["sent"], rtt
    assert rtt["min"] >= mean_ms - 2 * jitter_ms - 0.1, rtt
    assert abs(rtt["median"] - (mean_ms + base)) <= 1.5, (rtt, base)
    assert abs(rtt["p10"] - (mean_ms + base - quantile_offset)) <= JITTER_QUANTILE_MS, (rtt, base)
    assert abs(rtt["p90"] - (mean_ms + base + quantile_offset)) <= JITTER_QUANTILE_MS, (rtt, base)
    assert rtt["p90"] - rtt["p10"] >= 5 * (plain["p90"] - plain["p10"]), (rtt, plain)
    assert 3.5 <= rtt["stdev"] <= 5.0, (rtt, jitter_ms * math.sqrt(2 / 3))
    samples = netem_vm.ping_rtts_ms(run.block("jitter", "ping").text)
    late = [s for s in samples if s > mean_ms + 2 * jitter_ms + TIMER_SLACK_MS]
    assert len(late) <= 0.02 * len(samples), sorted(late)


def test_loss_drops_its_share_within_a_binomial_bound(vm_run):
    _, summary = vm_run
    loss = summary["loss"]
    p = case("loss").shape.loss_pct / 100
    assert loss["sent"] >= 2000, loss
    lo, hi = binomial_interval(loss["sent"], p, LOSS_CONFIDENCE)
    assert lo <= loss["lost"] <= hi, (loss, f"{LOSS_CONFIDENCE:.1%} interval {lo}..{hi}")


def test_rate_caps_tcp_throughput(vm_run):
    _, summary = vm_run
    rate_mbit = case("rate").shape.rate_bps / 1e6
    assert summary["tcp-base"]["mbit_s"] > 5 * rate_mbit, summary["tcp-base"]
    goodput_ceiling = rate_mbit * 1448 / 1514  # TCP payload per Ethernet frame at MTU 1500
    assert 0.92 * goodput_ceiling <= summary["rate"]["mbit_s"] <= 1.05 * goodput_ceiling, summary["rate"]
