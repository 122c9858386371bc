"""The metrics a cross-rank timeline is built from: absolute step times on one clock per process,
the "clock" records at the start and end barriers, and the SUMMARY's kernel fields."""

import json
import time

import pytest
import torch

from trainer.instrument import StepTiming, wall, wall_now
from trainer.train import main
from hostrun import LAUNCH_VARS, torchrun

SMALL = ["--samples", "512", "--features", "8", "--classes", "3", "--hidden", "16", "--lr", "0.01"]


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_clock_is_unix_seconds_read_through_perf_counter():
    before = time.time()
    now = wall_now()
    assert before - 0.5 < now < time.time() + 0.5  # unix seconds, near the wall clock
    assert wall(None) is None  # a step without communication has no comm times
    p = time.perf_counter()
    assert wall(p + 2.5) - wall(p) == pytest.approx(2.5)


def test_step_records_keep_durations_and_times_to_the_microsecond():
    t = StepTiming(1, 1.23456789, 0.0, 0.0, 2.0, 64, 4.0, t_start=1795600000.123456789, t_end=1795600000.1271)
    r = t.record()
    assert r["compute_ms"] == 1.235 and r["t_start"] == 1795600000.123457 and r["t_comm_start"] is None
    assert r["tokens_per_s"] == 16000.0 and "step" not in r


def test_summary_says_which_cpu_kernels_ran(tmp_path, monkeypatch):
    for var in LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    s = main(SMALL + ["--epochs", "1", "--no-metrics"])
    assert s["cpu_kernels"] == "native" and s["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    keys = list(s)
    assert keys[keys.index("threads") + 1: keys.index("threads") + 3] == ["cpu_kernels", "cpu_capability"]
    monkeypatch.setenv("DDPLAB_CPU_KERNELS", "avx2")  # what labctl writes for a lab pinned to AVX2 kernels
    assert main(SMALL + ["--epochs", "1", "--no-metrics"])["cpu_kernels"] == "avx2"


def test_two_ranks_leave_a_timeline(tmp_path):
    proc = torchrun(tmp_path / "torchrun", "-m", "trainer", *SMALL, "--global-batch", "32", "--micro-batch", "8",
                    "--steps", "4", "--run-dir", tmp_path, "--timeout-s", "60", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        records = read_jsonl(tmp_path / f"metrics-rank{rank}.jsonl")
        assert [(r["kind"], r.get("event", r.get("step"))) for r in records] == [
            ("clock", "start"), ("prediction", None), ("step", 1), ("step", 2), ("step", 3), ("step", 4), ("clock", "end")]
        start, prediction, *steps, end = records
        assert all(r["rank"] == rank for r in records)
        assert prediction["step_ms"] > prediction["compute_ms"] > 0  # each rank's own, for labctl trace
        previous_end = start["t"]
        for s in steps:
            # two micro-steps a rank, the first under no_sync: one all-reduce, inside backward
            times = [s["t_start"], s["t_comm_start"], s["t_comm_end"], s["t_backward_end"], s["t_end"]]
            assert previous_end <= times[0] and times == sorted(times), s
            assert s["t_comm_end"] - s["t_comm_start"] == pytest.approx(s["comm_ms"] / 1e3, abs=5e-6)  # both rounded to the microsecond
            previous_end = s["t_end"]
        assert previous_end <= end["t"]
    # labctl trace puts each rank's prediction beside its measured step
    from labctl.trace import write_trace

    report = write_trace(tmp_path)
    for row in report.rows:
        predicted = read_jsonl(tmp_path / f"metrics-rank{row.rank}.jsonl")[1]["step_ms"]
        assert row.predicted_step_ms == predicted and row.step_ms > 0
        assert row.as_dict()["predicted_step_ms"] == predicted
    from labctl.cli.render_trace import prediction_line

    assert prediction_line(report).startswith("step model: rank 0 predicted ")
