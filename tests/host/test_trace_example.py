"""The README's user-script recipe, run as written: examples/trace/my_ddp_script.py under torchrun on
this machine (2 ranks, gloo) leaves what `labctl trace` merges: metrics with step and clock records,
and a torch.profiler trace per rank in DDPLAB_RUN_DIR."""

from __future__ import annotations

import json

from labctl.trace import write_trace
from hostrun import REPO, host_env, torchrun



def test_a_script_of_ones_own_gets_a_timeline_and_its_profiler_traces_merged(tmp_path, tmp_path_factory):
    env = host_env(DDPLAB_RUN_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    proc = torchrun(tmp_path_factory.mktemp("torchrun"), REPO / "examples" / "trace" / "my_ddp_script.py", "--steps", "8",
                    env=env, cwd=tmp_path, timeout=180)
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
    env = host_env(DDPLAB_RUN_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    proc = torchrun(tmp_path_factory.mktemp("torchrun"), REPO / "examples" / "trace" / "my_fsdp_script.py", "--steps", "5",
                    env=env, cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = write_trace(tmp_path)
    assert all(row.comm_s > 0 for row in report.rows)
    events = json.loads(report.merged.read_text())["traceEvents"]
    for rank in (0, 1):
        named = [e["name"] for e in events if e["pid"] == rank and e.get("cat") == "collective"]
        # 3 blocks gathered twice a step and the root once; every unit's gradients reduce-scattered once
        assert named.count("all_gather") == 5 * 7 and named.count("reduce_scatter") == 5 * 4, (rank, named[:12])
