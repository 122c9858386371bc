"""`labctl trace` of a pipeline (--strategy pp) on a synthetic run: each stage's forward and backward of
each micro-batch on its lane, numbered, the time between them named the bubble, and in the picture,
the merged trace and the table."""

from __future__ import annotations

import json

from labctl.trace import write_trace
from labctl.trace.breakdown import BUBBLE, COMPUTE, WAITING, step_segments
from labctl.trace.picture import bar_kind
from labctl.trace.records import read_run

BASE = 1_795_600_000.0
STAGES, MICRO, SLOT_S = 2, 2, 0.010  # 2 stages, 2 micro-batches, forward or backward 10 ms each


def gpipe_work(rank: int, start: float) -> list[list]:
    """GPipe on 2 stages, 2 micro-batches: stage 0 forwards both, waits, backwards both; stage 1 starts
    a slot late and turns each forward around at once."""
    if rank == 0:
        slots = [("forward", 0, 0), ("forward", 1, 1), ("backward", 0, 4), ("backward", 1, 5)]
    else:
        slots = [("forward", 0, 1), ("forward", 1, 2), ("backward", 0, 3), ("backward", 1, 4)]
    return [[kind, micro, start + slot * SLOT_S, start + (slot + 1) * SLOT_S] for kind, micro, slot in slots]


def write_pipeline_run(folder, steps: int = 4):
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(STAGES):
        records = [{"kind": "clock", "event": "start", "rank": rank, "host": f"node{rank}", "t_barriers": [BASE - 0.01]}]
        for step in range(1, steps + 1):
            start = BASE + step * 0.1
            work = gpipe_work(rank, start)
            records.append({"kind": "step", "rank": rank, "step": step, "t_start": start,
                            "t_backward_end": start + 6 * SLOT_S, "t_end": start + 6 * SLOT_S + 0.002,
                            "compute_ms": 4 * SLOT_S * 1e3, "comm_ms": 2 * SLOT_S * 1e3, "comm_wait_ms": 2 * SLOT_S * 1e3,
                            "wall_ms": 100.0, "pipeline": work})
        records.append({"kind": "clock", "event": "end", "rank": rank, "host": f"node{rank}", "t_barriers": [BASE + 1]})
        (folder / f"metrics-rank{rank}.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return folder


def test_a_stage_step_is_its_micro_batches_and_the_bubble_between_them(tmp_path):
    run = read_run(write_pipeline_run(tmp_path))
    first = run.rank(0).steps[0]
    assert [(w.kind, w.micro) for w in first.pipeline] == [("forward", 0), ("forward", 1), ("backward", 0), ("backward", 1)]
    parts = step_segments(first, 0.0, (0.0, 0))
    named = [(p.kind, p.what, round((p.end - p.start) * 1e3, 3)) for p in parts]
    assert named == [(COMPUTE, "forward, micro-batch 0", 10.0), (COMPUTE, "forward, micro-batch 1", 10.0),
                     (WAITING, f"{BUBBLE}: waiting for micro-batch 0's gradients", 20.0),
                     (COMPUTE, "backward, micro-batch 0", 10.0), (COMPUTE, "backward, micro-batch 1", 10.0),
                     (COMPUTE, "optimizer", 2.0)]
    assert [bar_kind(p) for p in parts] == ["forward", "forward", "bubble", "backward", "backward", "compute"]
    late = [p.what for p in step_segments(run.rank(1).steps[0], 0.0, (0.0, 0))]
    assert late[0] == f"{BUBBLE}: waiting for micro-batch 0's activations" and late[-2].startswith(f"{BUBBLE}: the last")


def test_the_trace_of_a_pipeline_draws_two_steps_numbers_its_micro_batches_and_names_the_bubble(tmp_path):
    report = write_trace(write_pipeline_run(tmp_path, steps=8))
    assert len(report.window) == 2 and report.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.as_dict()["pipeline"] and report.verdict().startswith("the stage with the most compute")
    # each stage: 40 ms of its 62 computing, the rest the bubble (20 ms), and the optimizer's 2 ms computing
    for row in report.as_dict()["ranks"]:
        assert round(row["waiting"], 3) == round(20 / 100, 3) and round(row["compute"], 3) == round(42 / 100, 3), row
    events = json.loads(report.merged.read_text())["traceEvents"]
    names = {e["name"] for e in events if e.get("pid") == 1 and e.get("ph") == "X"}
    assert {"forward, micro-batch 1", "backward, micro-batch 0", f"{BUBBLE}: waiting for micro-batch 0's activations"} <= names
