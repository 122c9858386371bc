"""bench allreduce's pure parts: the calibrated model against a ring built to obey it, the sweep's
iteration rule, and the plot."""

from __future__ import annotations

import pytest

from labctl.bench import allreduce, cost


def test_the_calibrated_model_adds_the_delay_and_hides_the_stacks_latency_behind_large_transfers():
    wire, delay, base = 1e8, 0.01, 1e-3
    steps = 4  # a ring of 3

    def truth(size):  # a ring whose steps pay the delay, and the stack's latency only while it is the longer
        return (steps * delay + max(steps * base, cost.bytes_per_rank(size, 3) * 8 / wire)) * 1e6

    probe = {"size": 1024, "count": 256, "probe": True,
             "time_us": (steps * delay + steps * base + cost.bytes_per_rank(1024, 3) * 8 / wire) * 1e6}
    timings = [probe] + [{"size": s, "count": s // 4, "time_us": truth(s)} for s in (2**16, 2**20, 2**24)]
    cal = allreduce.calibrate(timings, 3, wire, delay)
    assert cal.wire_bps == wire and cal.delay_s == delay and abs(cal.base_s - base) < 1e-12
    rows = allreduce.build_rows(timings[1:], 3, allreduce.model_link(10**8, wire, delay_s=delay), wire, 0.85, cal)
    assert all(abs(r.meas_over_calibrated - 1) < 1e-9 for r in rows)
    # 64 KiB: its 7 ms of bytes outlast the stack's 4 ms, so the transfer counts, not the stack.
    assert abs(rows[0].calibrated_us - (steps * delay + cost.bytes_per_rank(2**16, 3) * 8 / wire) * 1e6) < 1e-6
    # The paper model: 85% of the link, and per hop 50 us plus the configured 10 ms delay, added.
    paper = cost.collective_time_s(2**20, 3, cost.named_link("shaped", 1e8, 50e-6 + 0.01), 0.85) * 1e6
    assert abs(rows[1].model_us - paper) < 1e-6
    # A small message is all latency: the stack's, measured, on top of the delay.
    assert abs(cal.time_s(4, 3) - steps * (delay + base)) < 1e-12 and cal.time_s(2**20, 1) == 0.0
    # No probe (an old trainer, or none asked), no wire, or no ring: no calibrated model.
    assert allreduce.calibrate(timings[1:], 3, wire) is None and allreduce.calibrate(timings, 3, None) is None
    assert allreduce.calibrate(timings, 1, wire) is None


def test_a_probe_faster_than_the_delay_allows_gives_no_negative_latency():
    probe = {"size": 1024, "count": 256, "probe": True, "time_us": 1000.0}
    assert allreduce.calibrate([probe], 3, 1e9, delay_s=0.01).base_s == 0.0


def test_small_sizes_get_more_iterations_within_the_budget_and_large_ones_keep_iters():
    from trainer.bench_allreduce import more

    assert more([0.001] * 4, 5, 21, 0.25)  # fewer than --iters: always
    assert more([0.001] * 5, 5, 21, 0.25) and not more([0.001] * 21, 5, 21, 0.25)  # small: up to --max-iters
    assert not more([0.1, 0.1, 0.1, 0.1, 0.1], 5, 21, 0.25)  # past the budget: --iters is enough
    assert not more([0.001] * 5, 5, 0, 0.25)  # no --max-iters: exactly --iters, as before


def test_calls_are_timed_back_to_back_as_many_as_fill_the_sample():
    from trainer.bench_collectives import MAX_CALLS, calls_per_sample, parse_args

    assert calls_per_sample(0.0117, 0.030) == 3  # a 1 MiB all-reduce at 1gbit: 3 calls fill 30 ms
    assert calls_per_sample(0.187, 0.030) == 1  # a 16 MiB one is a sample by itself
    assert calls_per_sample(1e-5, 0.030) == MAX_CALLS and calls_per_sample(0.0, 0.030) == MAX_CALLS
    assert calls_per_sample(0.001, 0.0) == 1  # no --fill-ms: one call a sample, as before
    assert parse_args(["--sizes", "1024", "--fill-ms", "30"]).fill_ms == 30.0
    for bad in (["--fill-ms", "-1"], ["--fill-ms", "30", "--warmup", "0"]):  # the warm-up call sets the pace
        with pytest.raises(SystemExit):
            parse_args(["--sizes", "1024", *bad])


def test_allreduce_plot_draws_both_models_into_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    timings = [{"size": s, "count": s // 4, "time_us": t} for s, t in ((65536, 4641.5), (1 << 20, 11194.9))]
    rows = allreduce.build_rows(timings, 3, allreduce.model_link(10**9, 956e6), 956e6,
                                calibrated=allreduce.Calibration(956e6, 1.0e-3))
    path = tmp_path / "plots" / "allreduce.png"
    allreduce.plot(rows, path, 10**9, 956e6, 3, "allreduce on gloo (cpu tensors), 3 nodes, " + "x" * 120)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_ops_row_takes_its_own_busbw_factor_and_its_backends_algorithm():
    wire, n = 1e9, 3
    cal = allreduce.Calibration(wire, 0.0)
    size = 3 * 2**20
    timings = [{"op": op, "size": size, "count": size // 4, "time_us": cal.time_s(size, n, op, "gloo") * 1e6,
                "backend": "gloo"} for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")]
    rows = {r.op: r for r in allreduce.build_rows(timings, n, allreduce.model_link(10**9, wire), wire, 0.85, cal)}
    assert all(abs(r.meas_over_calibrated - 1) < 1e-9 for r in rows.values())
    # gloo's reduce-scatter moves an all-reduce's bytes, so at nccl-tests' (n-1)/n its busbw reads half the wire
    assert rows["reduce_scatter"].time_us == pytest.approx(rows["all_reduce"].time_us)
    assert rows["all_gather"].busbw_over_wire == pytest.approx(1.0)
    assert rows["reduce_scatter"].busbw_over_wire == pytest.approx(0.5)
    assert rows["all_reduce"].busbw_over_wire == pytest.approx(1.0)
    assert rows["broadcast"].busbw_over_wire == pytest.approx(0.5)  # two rounds of the whole message
    assert rows["all_gather"].as_dict()["op"] == "all_gather"


def test_a_collectives_plot_draws_a_line_of_each_op_into_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    cal = allreduce.Calibration(956e6, 1.0e-3)
    timings = [{"op": op, "size": s, "count": s // 4, "time_us": t, "backend": "gloo"}
               for op in ("all_gather", "reduce_scatter") for s, t in ((3 << 20, 30000.0), (3 << 22, 110000.0))]
    rows = allreduce.build_rows(timings, 3, allreduce.model_link(10**9, 956e6), 956e6, calibrated=cal)
    path = tmp_path / "collectives.png"
    allreduce.plot(rows, path, 10**9, 956e6, 3, "collectives on gloo (cpu tensors), 3 nodes")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
