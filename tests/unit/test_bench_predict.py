"""`labctl bench predict`'s pure parts: the grid, the rows from runs, the error's statistics (labctl/bench/predict.py)."""

import pytest

from labctl.bench.predict import Case, error_stats, grid, markdown, percentile, row_of


def test_the_grid_covers_what_the_issue_asks_and_fits_the_lab():
    cases = grid(8)
    assert len(cases) >= 24
    assert {c.nodes for c in cases} == {2, 4, 8}
    assert {c.bw for c in cases} == {None, "1gbit", "100mbit"}
    assert {"1", "25"} <= {c.args[c.args.index("--bucket-cap-mb") + 1] for c in cases if "--bucket-cap-mb" in c.args}
    assert any("--global-batch" in c.args for c in cases)  # accumulation 4
    assert any(c.nproc_per_node == 2 for c in cases) and any(c.slow_cpus for c in cases)
    assert {"zero", "fsdp"} <= {c.args[-1] for c in cases if "--strategy" in c.args}
    assert [c.nodes for c in cases if c.spine] == [4, 4, 8]  # two groups joined by a slower link
    assert all(c.nodes <= 4 for c in grid(5)) and grid(1) == []
    assert len({c.name for c in cases}) == len(cases)  # every case says what it is


def summary(predicted, measured):
    return {"predicted_step_ms": predicted, "step_ms": measured, "world_size": 4, "step_model_error": measured / predicted - 1,
            "predicted_exposed_comm_ms": 1.0, "exposed_comm_ms": 2.0, "step_model": {"step_ms": predicted}}


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
    assert "5 cases: median absolute error 3.0%" in markdown(rows, stats, "t")
