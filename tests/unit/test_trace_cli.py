"""`labctl trace` in-process: which run it reads, what it prints and writes, and its refusals (exit 2
for input, 1 for a run with nothing to draw), with and without matplotlib."""

from __future__ import annotations

import json
import os
import sys

import pytest
from click.testing import CliRunner

from labctl.cli import main
from test_trace import write_run


@pytest.fixture(autouse=True)
def workspace(tmp_path, monkeypatch):
    """An empty workspace as the current folder, no DDPLAB_* from the shell, no engine to reach."""
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith("DDPLAB_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def lab_run(workspace, lab: str = "ddplab", run_id: str = "20261125-120000-abcd"):
    """A run of the lab's, as `labctl run` leaves it: runs/<id>/ and runs/latest pointing at it."""
    folder = write_run(workspace / ".lab" / lab / "runs" / run_id, steps=20)
    (folder.parent / "latest").symlink_to(run_id)
    return folder


def test_trace_reads_the_latest_run_and_says_where_its_files_are(workspace):
    folder = lab_run(workspace)
    result = invoke("trace")
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "where each rank's wall time went, steps 2-20 (19, steady steps, as SUMMARY)" in out
    assert "rank 2 (node2) (waited for)" in out
    assert "the others waited for rank 2 (node2): 0.95 s in all over 19 steps (steps 2-20)" in out
    assert 'clocks: aligned on the "start" barrier (rank 0\'s clock); residual at the "end" barrier: 0.000 ms' in out
    assert f"timeline: {folder / 'timeline.png'} (steps 7-14)" in out
    assert f"merged trace: {folder / 'trace-merged.json'} (open it in https://ui.perfetto.dev" in out
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith("metrics")) == [
        "breakdown.json", "timeline.png", "trace-merged.json"]


def test_trace_takes_a_run_id_of_a_lab_or_a_path_and_prints_json(workspace):
    folder = lab_run(workspace, lab="demo")
    by_id = invoke("trace", "20261125-120000-abcd", "--lab", "demo", "--json", "--steps", "4:6")
    assert by_id.exit_code == 0, by_id.output
    report = json.loads(by_id.output)
    assert (report["steps"], report["window"], report["steady_steps"]) == ([4, 6], [4, 6], False)
    assert report["waited_for"] == "rank 2 (node2)" and report["waited_for_rank"] == 2
    assert [r["label"] for r in report["ranks"]] == ["rank 0 (node0)", "rank 1 (node1)", "rank 2 (node2)"]
    assert report["files"]["png"] == str(folder / "timeline.png")
    assert report["alignment"]["offsets_ms"] == {"0": 0.0, "1": 0.0, "2": 0.0}
    by_path = invoke("trace", ".lab/demo/runs/20261125-120000-abcd", "--json", "--steps", "4:6")
    assert json.loads(by_path.output) == report


@pytest.mark.parametrize("args, code, fragment", [
    (["trace"], 2, "no run yet in"),
    (["trace", "nope"], 2, "no run 'nope': neither a run id in"),
    (["trace", "--steps", "5:3"], 2, "invalid --steps='5:3': must be A:B (steps A to B)"),
    (["trace", "nope", "--steps", "x"], 2, "invalid --steps='x'"),  # the option first, before any folder
    (["trace", "."], 1, "holds no metrics and no profiler traces: nothing to put on a timeline"),
])
def test_trace_refuses_with_what_it_needs(args, code, fragment):
    result = invoke(*args)
    assert result.exit_code == code, result.output
    assert fragment in " ".join(result.output.split())


def test_steps_outside_the_run_are_exit_2_naming_its_steps(workspace):
    lab_run(workspace)
    result = invoke("trace", "--steps", "30:40")
    assert result.exit_code == 2 and "invalid --steps='30:40': this run's steps are 1-20" in result.output


def test_without_matplotlib_the_trace_and_table_come_and_one_line_says_how_to_get_the_picture(workspace, no_matplotlib):
    folder = lab_run(workspace)
    result = invoke("trace")
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "no picture: it is drawn with matplotlib; pip install 'ddplab[plot]'" in out
    assert "the others waited for rank 2 (node2)" in out and "timeline:" not in out
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith("metrics")) == [
        "breakdown.json", "trace-merged.json"]


def test_lab_trace_reads_what_the_cli_reads(workspace):
    """The Python API's Lab.trace: the latest run by default, a run id, or a RunResult's folder (what
    `labctl run --trace` passes); the same report as the command's --json."""
    from labctl.api import Lab
    from labctl.run.result import RunResult

    folder = lab_run(workspace, lab="demo")
    lab = Lab("demo", workspace=workspace)
    latest = lab.trace(steps="4:6").as_dict()
    assert latest == json.loads(invoke("trace", "--lab", "demo", "--json", "--steps", "4:6").output)
    assert lab.trace("20261125-120000-abcd", steps=(4, 6)).as_dict() == latest
    assert lab.trace(RunResult(run_dir=folder, outcomes=[], first_failure=None), steps="4:6").as_dict() == latest
