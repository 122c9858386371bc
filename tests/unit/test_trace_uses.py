"""Where `labctl trace` is used: `bench straggler` draws its median even and balanced runs side by side
(one PNG in its output folder, said in its report; no matplotlib, no picture, the numbers all the
same), and the straggler scenario puts the broken run's timeline in its diagnosis and keeps it."""

from __future__ import annotations

import json

from test_bench_orchestration import FakeLab, engine, events, flag  # noqa: F401 (fixtures)
from test_trace import write_run
from test_trace_cli import no_matplotlib  # noqa: F401 (fixture)

from labctl.diagnose.scenarios import ScenarioOutcome, broken_timeline, remove_lab_folder
from labctl.bench import straggler
from labctl.diagnose.traps import SCENARIOS
from labctl.trace import write_comparison


def answer_with_metrics(plan):
    """Every run leaves 3 ranks' metrics with step times (rank 2 the straggler) and its SUMMARY."""
    write_run(plan.run_dir, steps=12)
    override = flag(plan.launches[0].argv, "--rank-micro-batch")
    micro = [int(p.split("=")[1]) for p in override.split(",")] if override else [16, 16, 16]
    return {"micro_batches": micro, "tokens_per_s": 1500.0 if override else 1000.0, "step_ms": 40.0,
            "compute_ms_per_step": 30.0, "slowest_node": "node2", "slowest_compute_ratio": 2.7,
            "waited_for_slowest_s": 0.5, "final_loss": 4.25, "run_dir": str(plan.run_dir), "accum_steps": 1}


def test_bench_straggler_draws_before_and_after_side_by_side(tmp_path, events, engine, capsys):  # noqa: F811
    from labctl.cli import render_bench

    result = straggler.measure(FakeLab(tmp_path, events, answer=answer_with_metrics),
                               straggler.StragglerOptions(repeats=1))
    assert result.timeline == tmp_path / ".lab" / "fake" / "bench-straggler" / "straggler-timeline.png"
    assert result.timeline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and result.timeline_note == ""
    render_bench.print_straggler(result, as_json=False)
    assert f"timelines, before and after: {result.timeline}" in capsys.readouterr().out
    render_bench.print_straggler(result, as_json=True)
    assert json.loads(capsys.readouterr().out)["timeline"] == str(result.timeline)


def test_bench_straggler_writes_its_timelines_where_told(tmp_path, events, engine):  # noqa: F811
    out = tmp_path / "out"
    result = straggler.measure(FakeLab(tmp_path, events, answer=answer_with_metrics),
                               straggler.StragglerOptions(repeats=1), out_dir=out)
    assert result.timeline == out / "straggler-timeline.png" and result.timeline.is_file()


def test_bench_straggler_without_matplotlib_says_how_to_get_the_picture(tmp_path, events, engine,  # noqa: F811
                                                                       no_matplotlib, capsys):  # noqa: F811
    from labctl.cli import render_bench

    result = straggler.measure(FakeLab(tmp_path, events, answer=answer_with_metrics),
                               straggler.StragglerOptions(repeats=1))
    assert result.timeline is None and "pip install 'ddplab[plot]'" in result.timeline_note
    assert result.speedup == 1.5
    render_bench.print_straggler(result, as_json=False)
    assert "no timeline picture: it is drawn with matplotlib" in " ".join(capsys.readouterr().err.split())


def test_write_comparison_puts_runs_on_one_png(tmp_path):
    before, after = write_run(tmp_path / "a", steps=10), write_run(tmp_path / "b", steps=10, skew={1: 0.25})
    path = write_comparison(tmp_path / "both.png", [("before", before), ("after", after)], title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (before / "timeline.png").exists()  # the runs' own folders are only read


# --------------------------------------------------------------------------------- the straggler scenario


def test_the_straggler_scenario_traces_its_broken_run():
    assert [name for name, s in SCENARIOS.items() if s.timeline] == ["straggler"]


def test_the_broken_runs_timeline_names_the_rank_waited_for_and_the_picture(tmp_path):
    run_dir = write_run(tmp_path / "runs" / "20261125-120000-abcd", steps=12)
    line, kept = broken_timeline(run_dir)
    assert line == (f"the others waited for rank 2 (node2): 0.55 s in all over 11 steps (steps 2-12); "
                    f"timeline: {run_dir / 'timeline.png'}")
    assert kept == run_dir and (run_dir / "timeline.png").is_file()
    empty = tmp_path / "runs" / "empty"
    empty.mkdir()
    line, kept = broken_timeline(empty)
    assert line.startswith(f"no timeline: {empty} holds no metrics and no profiler traces") and kept is None


def test_the_scenario_labs_folder_goes_but_the_kept_run(tmp_path):
    lab = tmp_path / ".lab" / "scn-straggler"
    broken, fixed = lab / "runs" / "a", lab / "runs" / "b"
    for folder in (broken, fixed):
        folder.mkdir(parents=True)
        (folder / "node0.log").write_text("x\n")
    (lab / "runs" / "latest").symlink_to("b")
    (lab / "node0.env").write_text("RANK=0\n")
    remove_lab_folder(lab, keep=broken)
    assert sorted(str(p.relative_to(lab)) for p in lab.rglob("*")) == ["runs", "runs/a", "runs/a/node0.log"]
    remove_lab_folder(lab, keep=None)
    assert not lab.exists()


def test_the_scenario_panel_shows_the_timeline(capsys):
    from labctl.cli import render

    outcome = ScenarioOutcome("straggler", "straggler: rank 1 on node1", 3.0, 0, ["node1: limited"], 0.5, "fix", True, 9.0, 60.0,
                      120, timeline="the others waited for rank 1 (node1): 1.2 s in all; timeline: /x/timeline.png")
    render.print_scenario(outcome, "One slow node drags everyone")
    out = " ".join(capsys.readouterr().out.split())
    assert "timeline (labctl trace): the others waited for rank 1 (node1): 1.2 s in all; timeline: /x/timeline.png" in out
