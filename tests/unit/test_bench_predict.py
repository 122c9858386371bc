"""`labctl bench predict`'s pure parts: the grid, the rows from runs, the error's statistics (labctl/bench/predict.py)."""

import pytest

from labctl.bench.predict import Case, error_stats, grid, markdown, percentile, row_of


def test_the_grid_covers_what_the_issue_asks_and_fits_the_lab():
    cases = grid(8)
    assert len(cases) >= 24
    # make demo's own run first: the first prediction a newcomer sees
    assert (cases[0].workload, cases[0].nodes, cases[0].bw, cases[0].args) == ("toy", 3, None, ("--epochs", "3"))
    assert cases[0].name == "3 nodes, unshaped, toy --epochs 3 (make demo's run)"
    assert {c.nodes for c in cases[1:]} == {2, 3, 4, 8} and {c.workload for c in cases[1:]} == {"gpt"}
    assert {c.bw for c in cases} == {None, "1gbit", "100mbit"}
    assert {"1", "25"} <= {c.args[c.args.index("--bucket-cap-mb") + 1] for c in cases if "--bucket-cap-mb" in c.args}
    assert any("--global-batch" in c.args for c in cases)  # accumulation 4
    assert any(c.nproc_per_node == 2 for c in cases) and any(c.slow_cpus for c in cases)
    assert {"zero", "fsdp"} <= {c.args[-1] for c in cases if "--strategy" in c.args}
    assert [c.nodes for c in cases if c.spine] == [4, 4, 8]  # two groups joined by a slower link
    # a pipeline of a stage a node: equal stages unshaped and at 100mbit, stages by speed beside a straggler
    piped = [c for c in cases if "pp" in c.args]
    assert [(c.nodes, c.bw, c.slow_cpus, "auto" in c.args) for c in piped] == [
        (3, None, None, False), (3, "100mbit", None, False), (3, "1gbit", 0.25, True)]
    # tensor parallelism, each block over a node's 2 processes: replicated across 2 nodes unshaped and at
    # 100mbit, sharded across them at 1gbit
    split = [c for c in cases if c.args and "tp" in c.args[-1]]
    assert [(c.nodes, c.nproc_per_node, c.bw, c.args[-1]) for c in split] == [
        (2, 2, None, "tp"), (2, 2, "100mbit", "tp"), (2, 2, "1gbit", "fsdp+tp")]
    assert len(grid(8)) == 39 and len(grid(2)) == 15
    assert all(c.nodes <= 4 for c in grid(5)) and grid(1) == []
    assert len({c.name for c in cases}) == len(cases)  # every case says what it is


def summary(predicted, measured, trusted=True):
    return {"predicted_step_ms": predicted, "step_ms": measured, "world_size": 4, "step_model_error": measured / predicted - 1,
            "predicted_exposed_comm_ms": 1.0, "exposed_comm_ms": 2.0, "step_model": {"step_ms": predicted},
            "step_model_trusted": trusted}


def test_a_cases_row_is_the_median_prediction_against_the_median_step():
    row = row_of(Case(4, "1gbit"), [summary(100.0, 90.0), summary(110.0, 120.0), summary(104.0, 99.0)])
    assert (row.predicted_step_ms, row.measured_step_ms) == (104.0, 99.0)
    assert row.error == pytest.approx(99 / 104 - 1, abs=1e-4)
    assert row.step_model == {"step_ms": 104.0} and len(row.run_errors) == 3


def test_the_errors_median_and_90th_percentile_are_of_their_absolute_values():
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], 90) == pytest.approx(10.0)
    rows = [row_of(Case(2), [summary(100.0, 100.0 * (1 + e))]) for e in (0.01, -0.02, 0.03, -0.2, 0.05)]
    stats = error_stats(rows)
    assert stats["median_abs_error"] == pytest.approx(0.03) and stats["max_abs_error"] == pytest.approx(0.2)
    assert "5 cases predicted: median absolute error 3.0%" in markdown(rows, stats, "t")


def test_a_case_too_short_to_predict_is_shown_and_counted_apart_and_each_row_gives_its_runs_spread():
    predicted = [row_of(Case(2), [summary(100.0, 100.0 * (1 + e)), summary(100.0, 100.0 * (1 + e / 2))])
                 for e in (0.02, -0.04, 0.06)]
    # a case is too short where most of its runs said so; one run of three saying so is shown in its row
    short = row_of(Case(3, None, ("--epochs", "3"), workload="toy"),
                   [summary(5.0, 7.0, trusted=False), summary(5.0, 6.0, trusted=False), summary(5.0, 6.5)])
    mostly = row_of(Case(4), [summary(50.0, 51.0, trusted=False), summary(50.0, 52.0), summary(50.0, 53.0)])
    assert [r.trusted for r in predicted] == [True] * 3 and short.trusted is False and mostly.trusted is True
    stats = error_stats([short, mostly, *predicted])
    assert (stats["rows"], stats["too_short"]) == (4, 1) and stats["max_abs_error"] < 0.1  # the +30% is not in it
    assert stats["all_cases"]["rows"] == 5 and stats["all_cases"]["max_abs_error"] == pytest.approx(0.3)
    text = markdown([short, mostly, *predicted], stats, "t")
    assert "| too short (+30%) |" in text and "4 cases predicted: median absolute error" in text
    assert "(+2.0% to +6.0%, 1 of 3 too short) |" in text and "(+1.0% to +2.0%)" in text
    assert "; 1 too short to predict (every 5 cases counted: " in text and ", 30.0%)" in text


def test_bench_predict_prints_its_table_and_statistics(capsys):
    """The command's own rendering of a report (it once named a helper it did not import)."""
    from labctl.bench.predict import PredictReport
    from labctl.cli import render_bench

    rows = [row_of(Case(2), [summary(100.0, 103.0), summary(100.0, 101.0)]),
            row_of(Case(3, None, ("--epochs", "3"), workload="toy"), [summary(5.0, 7.0, trusted=False)])]
    render_bench.print_predict(PredictReport(rows, error_stats(rows), "a title", []), as_json=False)
    out = capsys.readouterr()
    assert "too short (+40%)" in out.out and "+2.0% (+1.0% to +3.0%)" in out.out
    assert "1 cases predicted" in out.err + out.out
