"""The cost model against hand-computed cases."""

import pytest

from labctl.bench import cost
from labctl.bench.cost import (
    PRESETS,
    Link,
    busbw_factor,
    bytes_per_rank,
    collective_time_s,
    parse_params,
    resolve_link,
    step_report,
)
from labctl.errors import ConfigError


def test_gpt2_760m_bf16_two_ranks():
    # S = 760e6 x 2 B = 1.52 GB; ring allreduce over 2 ranks moves 2(1)/2 x S = 1.52 GB = 12.16 Gbit
    # per rank; at 85% of 1 Gbit/s that is 12.16 / 0.85 = 14.306 s (+ 2 x 50 us latency).
    rows = step_report(760e6, "bf16", 2, [resolve_link("1GbE"), resolve_link("10GbE"), resolve_link("400G-RoCE")])
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
    assert busbw_factor(n, collective) == factor
    assert bytes_per_rank(1000.0, n, collective) == pytest.approx(1000.0 * factor)


def test_latency_term_and_single_rank():
    link = Link("x", 1e9, 1e-3)
    # 4 ranks, 4 bytes: bandwidth term negligible, 2(n-1) = 6 hops of 1 ms.
    assert collective_time_s(4, 4, link, 1.0) == pytest.approx(6e-3, rel=1e-3)
    assert collective_time_s(4, 4, link, 1.0, "allgather") == pytest.approx(3e-3, rel=1e-3)
    assert collective_time_s(10**9, 1, link) == 0.0


def test_grad_accum_divides_the_ratio():
    one, eight = (step_report(1e8, "fp32", 4, [PRESETS["1gbe"]], compute_s=0.5, grad_accum=k)[0] for k in (1, 8))
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
    (lambda: step_report(1e6, "int8", 2, [PRESETS["1gbe"]]), "--dtype"),
    (lambda: step_report(1e6, "fp32", 2, [PRESETS["1gbe"]], efficiency=1.5), "--efficiency"),
    (lambda: step_report(1e6, "fp32", 2, [PRESETS["1gbe"]], grad_accum=0), "--grad-accum"),
    (lambda: busbw_factor(2, "alltoall"), "--collective"),
])
def test_errors(call, fragment):
    with pytest.raises(ConfigError, match=fragment):
        call()


def test_resolve_link_presets_and_rates():
    assert resolve_link("nvlink").rate_bps == 3.6e12
    assert resolve_link("250mbit") == Link("250mbit", 250e6, 50e-6)


def test_cost_with_a_delay_adds_it_to_every_links_latency():
    [plain] = cost.links_to_price(["1gbit"], None)
    [delayed] = cost.links_to_price(["1gbit"], None, delay="5ms")
    assert delayed.name == "1gbit + 5ms" and delayed.alpha_s == pytest.approx(plain.alpha_s + 0.005)
    assert all(link.name.endswith(" + 5ms") for link in cost.links_to_price([], ("100mbit", 10**8), delay="5ms"))
    # 64 KiB of gradients across 3 ranks: 4 steps x 5 ms dwarf the bytes
    [row] = cost.estimate(cost.CostQuery(16 * 1024, "fp32", "3", ["1gbit"], delay="5ms")).rows
    assert 0.020 < row["comm_s"] < 0.022
    with pytest.raises(ConfigError, match="--delay='soon': must be a time"):
        cost.links_to_price(["1gbit"], None, delay="soon")
