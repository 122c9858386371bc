"""The README's user-script recipe, run as written: examples/trace/my_ddp_script.py under torchrun on
this machine (2 ranks, gloo) leaves what `labctl trace` merges: metrics with step and clock records,
and a torch.profiler trace per rank in DDPLAB_RUN_DIR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from labctl.trace import write_trace

REPO = Path(__file__).resolve().parents[2]
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def test_a_script_of_ones_own_gets_a_timeline_and_its_profiler_traces_merged(tmp_path, tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(DDPLAB_RUN_DIR=str(tmp_path), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "--log-dir", str(tmp_path_factory.mktemp("torchrun")),  # not a /tmp/torchelastic_* left behind
           str(REPO / "examples" / "trace" / "my_ddp_script.py"), "--steps", "8"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics-rank0.jsonl", "metrics-rank1.jsonl",
                                                          "trace-rank0.json", "trace-rank1.json"]
    report = write_trace(tmp_path)
    assert report.steps == list(range(2, 9)) and len(report.rows) == 2 and report.png.is_file()
    assert report.alignment.event == "start" and report.alignment.residual_ms is not None
    assert all(row.comm_s > 0 for row in report.rows)  # the comm hook's times made it into the records
    events = json.loads(report.merged.read_text())["traceEvents"]
    for rank in (0, 1):
        assert any(e["pid"] == rank and e["name"].startswith("ProfilerStep#") for e in events)


def test_an_fsdp2_script_of_ones_own_shows_its_all_gathers_and_reduce_scatters_on_every_rank(tmp_path, tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(DDPLAB_RUN_DIR=str(tmp_path), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "--log-dir", str(tmp_path_factory.mktemp("torchrun")),
           str(REPO / "examples" / "trace" / "my_fsdp_script.py"), "--steps", "5"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = write_trace(tmp_path)
    assert all(row.comm_s > 0 for row in report.rows)
    events = json.loads(report.merged.read_text())["traceEvents"]
    for rank in (0, 1):
        named = [e["name"] for e in events if e["pid"] == rank and e.get("cat") == "collective"]
        # 3 blocks gathered twice a step and the root once; every unit's gradients reduce-scattered once
        assert named.count("all_gather") == 5 * 7 and named.count("reduce_scatter") == 5 * 4, (rank, named[:12])
