"""A cross-rank timeline from two ranks under torchrun on this machine: each rank's steps on one clock
between its "clock" records, and `labctl trace` putting each rank's prediction beside its measured step."""

import json

import pytest
from hostrun import torchrun
from test_trainer_timeline import SMALL


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


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
