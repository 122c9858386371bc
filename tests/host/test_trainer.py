"""The DDP trainer under torchrun on this machine, two processes (its unit tests: tests/unit/test_trainer.py)."""

import json
import re

from hostrun import torchrun
from labctl.bench.cost import PRESETS
from labctl.bench.stepcost import run_rows
from test_trainer import read_jsonl

# torchrun, two processes ------------------------------------------------------------

def test_torchrun_two_processes(tmp_path, tmp_path_factory):
    proc = torchrun(tmp_path_factory.mktemp("torchrun"), "-m", "trainer", "--epochs", "2", "--run-dir", tmp_path,
                    "--timeout-s", "60", timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Traceback" not in output

    for rank in (0, 1):
        for epoch in (1, 2):
            pattern = rf"^\[rank {rank}/2 \S+\] epoch {epoch}/2 loss \d+\.\d{{4}}$"
            assert len(re.findall(pattern, proc.stdout, re.M)) == 1, output

    summary_lines = [line for line in proc.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert len(summary_lines) == 1, output
    summary = json.loads(summary_lines[0][len("SUMMARY "):])
    assert summary["world_size"] == 2
    assert summary["replicas_consistent"] is True
    assert summary["backend"] == "gloo"
    assert summary["steps"] == 2 * (4096 // 2 // 64)
    # two ranks on this machine, nothing shaped: the link's rate from a probe, its latency from another
    link = summary["step_model"]["calibration"]["link"]
    assert link["rate_from"].endswith("all-reduce") and link["rate_bps"] > 0 and link["probe_us"] > 0
    assert summary["predicted_step_ms"] > summary["step_model"]["compute_ms"] > 0
    # One cost model: `labctl cost --from-run` prices the run's own inputs on its own link to the
    # prediction the run printed (rounded as the SUMMARY rounds it), and a faster link to less.
    own, faster = run_rows(summary["step_model"]["inputs"], [PRESETS["100g-roce"]], 0.85)
    assert own["link"] == "this run's link" and round(own["predicted_step_s"] * 1e3, 3) == summary["predicted_step_ms"]
    assert own["compute_s"] == faster["compute_s"] and faster["comm_s"] < own["comm_s"]

    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["metrics-rank0.jsonl", "metrics-rank1.jsonl"]
    for rank in (0, 1):
        records = read_jsonl(tmp_path / f"metrics-rank{rank}.jsonl")
        assert [(r["kind"], r["rank"], r.get("epoch"), r.get("event")) for r in records] == [
            ("clock", rank, None, "start"), ("prediction", rank, None, None), ("epoch", rank, 1, None),
            ("epoch", rank, 2, None), ("clock", rank, None, "end")]
