"""`labctl trace` on synthetic runs: clock alignment (a rank 250 ms off, a late barrier stamp), the
breakdown's arithmetic, the rank waited for, the step choices, and the refusals."""

from __future__ import annotations

import json

import pytest

from labctl.errors import ConfigError, LabError, StateError
from labctl.trace import find_run, write_trace
from labctl.trace.align import align, best_barrier
from labctl.trace.breakdown import (
    EXPOSED,
    choose_steps,
    parse_steps,
    rank_row,
    segments,
    step_segments,
    waited_for,
    window,
)
from labctl.trace.records import Step, read_run

BASE = 1_795_600_000.0  # unix seconds
PERIOD_S = 0.100  # a step every 100 ms on every rank
COMPUTE_MS = {0: 30.0, 1: 30.0, 2: 80.0}  # rank 2 is the straggler
EXPOSED_MS, OPTIMIZER_MS = 5.0, 2.0


def near(value: float):
    """Unix times in doubles hold about a quarter of a microsecond: sums of them, to 10 us."""
    return pytest.approx(value, abs=1e-5)


def step_record(rank: int, step: int, skew_s: float = 0.0) -> dict:
    """Step `step` of `rank`: forward and backward for its compute time, the first bucket handed over at 60%
    of it, the last at its end; everyone's backward returns 5 ms after the straggler's last bucket."""
    compute = COMPUTE_MS[rank]
    start = BASE + step * PERIOD_S + skew_s
    backward_end = start + (max(COMPUTE_MS.values()) + EXPOSED_MS) / 1e3
    return {"kind": "step", "rank": rank, "step": step, "compute_ms": compute,
            "comm_ms": (backward_end - 0.0001 - (start + 0.6 * compute / 1e3)) * 1e3,
            "comm_wait_ms": (backward_end - start) * 1e3 - compute, "wall_ms": PERIOD_S * 1e3,
            "t_start": start, "t_comm_start": start + 0.6 * compute / 1e3, "t_comm_end": backward_end - 0.0001,
            "t_backward_end": backward_end, "t_end": backward_end + OPTIMIZER_MS / 1e3}


def clock_record(rank: int, event: str, skew_s: float = 0.0, late: dict | None = None) -> dict:
    """Five barriers 1 ms apart; `late` {barrier: seconds} stamps some of them late on this rank."""
    at = BASE - 0.010 if event == "start" else BASE + 0.5
    times = [at + j * 0.001 + skew_s + (late or {}).get(j, 0.0) for j in range(5)]
    return {"kind": "clock", "event": event, "rank": rank, "host": f"node{rank}", "t": times[0], "t_barriers": times}


def write_run(folder, steps: int = 4, skew: dict | None = None, late: dict | None = None, end_jitter: dict | None = None):
    """A 3-rank run in `folder`; skew {rank: seconds} sets a rank's clock off, late {rank: {barrier: s}}."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in COMPUTE_MS:
        off = (skew or {}).get(rank, 0.0)
        records = [clock_record(rank, "start", off, (late or {}).get(rank))]
        records += [step_record(rank, s, off) for s in range(1, steps + 1)]
        records.append(clock_record(rank, "end", off + (end_jitter or {}).get(rank, 0.0)))
        (folder / f"metrics-rank{rank}.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return folder


# ---------------------------------------------------------------------------------------------- clocks


def test_a_rank_250_ms_off_is_put_back_within_1_ms(tmp_path):
    run = read_run(write_run(tmp_path / "skewed", skew={1: 0.250}))
    alignment = align(run.ranks)
    assert alignment.event == "start" and alignment.reference == 0
    assert alignment.offsets_s[1] == pytest.approx(0.250, abs=1e-3)
    assert alignment.offsets_s[2] == pytest.approx(0.0, abs=1e-3)
    assert alignment.residual_ms == pytest.approx(0.0, abs=1e-3)
    # aligned, the skewed run's breakdown is the straight run's
    straight = write_trace(write_run(tmp_path / "straight"))
    skewed = write_trace(tmp_path / "skewed")
    assert [r.as_dict() for r in skewed.rows] == [r.as_dict() for r in straight.rows]
    assert skewed.waited_for == straight.waited_for == 2


def test_trusting_the_wall_clocks_would_have_blamed_the_skewed_rank(tmp_path):
    run = read_run(write_run(tmp_path, skew={1: 0.250}))
    unaligned = align([r.__class__(r.rank, r.host, r.steps, {}, None) for r in run.ranks])
    assert unaligned.event is None and "no \"start\" clock record" in unaligned.why_not
    parts = segments(list(run.ranks), [2], unaligned)
    waits = {rank: [p for p in steps[0][1] if p.what.startswith("waiting for")] for rank, steps in parts.items()}
    assert waits[1] == [] and waits[0][0].what == "waiting for rank 1"  # rank 1 "arrives" 250 ms late


def test_the_barrier_whose_stamps_agree_best_is_the_one_used(tmp_path):
    # rank 2 was descheduled as it left the first start barrier: 68 ms late on a clock that is right
    run = read_run(write_run(tmp_path, skew={1: 0.250}, late={2: {0: 0.068}}))
    alignment = align(run.ranks)
    assert alignment.barrier == 1
    assert alignment.offsets_s[2] == pytest.approx(0.0, abs=1e-6)
    assert alignment.offsets_s[1] == pytest.approx(0.250, abs=1e-6)
    assert best_barrier({0: (1.0, 2.0, 3.0), 1: (1.5, 2.0001, 3.0)}) == 1  # two ranks: the median difference
    assert best_barrier({0: (), 1: (1.0,)}) is None


def test_the_residual_is_measured_at_the_end_barrier(tmp_path):
    run = read_run(write_run(tmp_path, skew={1: 0.250}, end_jitter={2: 0.0007}))
    alignment = align(run.ranks)
    assert alignment.residual_ms == pytest.approx(0.7, abs=1e-3)
    assert alignment.residual_by_rank_ms[2] == pytest.approx(0.7, abs=1e-3)
    assert alignment.as_dict()["offsets_ms"] == {"0": 0.0, "1": 250.0, "2": 0.0}


def test_metrics_with_a_single_barrier_time_still_align(tmp_path):
    write_run(tmp_path, skew={2: -0.040})
    for rank in COMPUTE_MS:  # metrics written before t_barriers: `t` alone
        path = tmp_path / f"metrics-rank{rank}.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for r in records:
            r.pop("t_barriers", None)
        path.write_text("\n".join(map(json.dumps, records)))
    assert align(read_run(tmp_path).ranks).offsets_s[2] == pytest.approx(-0.040, abs=1e-6)


# ------------------------------------------------------------------------------------------- breakdown


def test_a_step_is_compute_then_overlap_then_waiting_then_the_exposed_all_reduce_then_the_optimizer():
    s = Step(7, 10.0, 10.087, 10.085, t_comm_start=10.018, t_comm_end=10.0849, comm_wait_ms=55.0, compute_ms=30.0,
             wall_ms=100.0)
    parts = step_segments(s, 0.0, (10.080, 2))
    assert [(p.kind, p.what) for p in parts] == [
        ("compute", "forward and backward"), ("overlap", "backward, all-reduce in flight"),
        ("waiting", "waiting for rank 2"), ("waiting", EXPOSED), ("compute", "optimizer")]
    assert [round((p.end - p.start) * 1e3, 6) for p in parts] == [18.0, 12.0, 50.0, 5.0, 2.0]
    alone = Step(1, 0.0, 0.012, 0.010, compute_ms=10.0, wall_ms=12.0)  # world size 1: no communication
    assert [(p.what, round((p.end - p.start) * 1e3, 6)) for p in step_segments(alone, 0.0, (0.010, 0))] == [
        ("forward and backward", 10.0), ("optimizer", 2.0)]


def test_fractions_of_wall_time_per_rank(tmp_path):
    report = write_trace(write_run(tmp_path, steps=6))
    assert report.steps == [2, 3, 4, 5, 6]  # every rank's steps but its first, as summarize()
    fast, straggler = report.rows[0], report.rows[2]
    assert fast.wall_s == near(0.5)
    assert fast.fraction(fast.compute_s) == near((30 + 2) / 100)
    assert fast.fraction(fast.waiting_s) == near((80 - 30) / 100)
    assert fast.fraction(fast.exposed_s) == near(5 / 100)
    assert fast.fraction(fast.other_s) == near(13 / 100)
    assert fast.overlap_s == near(5 * 0.4 * 0.030)  # the last 40% of backward ran beside the all-reduce
    assert fast.overlap_fraction == near(12 / (85 - 18 - 0.1))
    assert straggler.fraction(straggler.compute_s) == near(82 / 100)
    assert straggler.waiting_s == near(0.0)
    assert straggler.fraction(straggler.exposed_s) == near(5 / 100)


def test_the_rank_waited_for_and_the_total_are_summarizes(tmp_path):
    from trainer.instrument import StepTiming, summarize

    run = read_run(write_run(tmp_path, steps=6))
    slowest, total_s = waited_for(list(run.ranks), [2, 3, 4, 5, 6])
    timings = [[StepTiming(s.step, s.compute_ms, 0.0, s.comm_wait_ms, 90.0, 1, s.wall_ms) for s in r.steps]
               for r in run.ranks]
    expected = summarize(timings, ["node0", "node1", "node2"])
    assert (slowest, round(total_s, 3)) == (expected["slowest_rank"], expected["waited_for_slowest_s"]) == (2, 0.25)
    report = write_trace(tmp_path)
    assert report.verdict() == "the others waited for rank 2 (node2): 0.25 s in all over 5 steps (steps 2-6)"


def test_a_tie_names_the_lowest_rank_as_summarize_does(tmp_path):
    run = read_run(write_run(tmp_path))
    equal = [r.__class__(r.rank, r.host, tuple(s.__class__(**{**s.__dict__, "compute_ms": 5.0}) for s in r.steps),
                         r.clocks) for r in run.ranks]
    assert waited_for(equal, [2, 3]) == (0, 0.0)


@pytest.mark.parametrize("text, expected", [("10:20", (10, 20)), ("3:", (3, None)), (":7", (None, 7)),
                                            (" 4:4 ", (4, 4)), ("1:60", (1, 60))])
def test_steps_parse(text, expected):
    assert parse_steps(text) == expected


@pytest.mark.parametrize("text", ["", ":", "5", "5:3", "0:4", "-1:2", "a:b", "1:2:3", "1.5:3", "nan:"])
def test_bad_steps_are_refused_with_what_is_allowed(text):
    with pytest.raises(ConfigError, match=r"--steps=.*must be A:B \(steps A to B\), A: \(from A\) or :B"):
        parse_steps(text)


def test_steps_outside_the_run_are_refused_naming_its_steps(tmp_path):
    run = read_run(write_run(tmp_path, steps=6))
    assert choose_steps(list(run.ranks), (3, 4)) == [3, 4]
    assert choose_steps(list(run.ranks), (None, 2)) == [1, 2]  # asked for: the first step too
    with pytest.raises(ConfigError, match="--steps='40:50': this run's steps are 1-6"):
        choose_steps(list(run.ranks), (40, 50), "40:50")
    with pytest.raises(ConfigError, match="this run's steps are 1-6"):
        write_trace(tmp_path, steps="7:")


def test_the_picture_shows_8_steps_from_the_middle_unless_told():
    assert window(list(range(2, 61))) == list(range(27, 35))
    assert window([2, 3, 4]) == [2, 3, 4]


def test_a_row_from_segments_sums_what_it_was_given(tmp_path):
    run = read_run(write_run(tmp_path))
    alignment = align(run.ranks)
    rows = [rank_row(r, segments(list(run.ranks), [3], alignment)[r.rank]) for r in run.ranks]
    assert [round(r.wall_s, 6) for r in rows] == [0.1, 0.1, 0.1]


# ------------------------------------------------------------------------------------- files, refusals


def test_write_trace_writes_its_three_files_into_the_run_folder(tmp_path):
    report = write_trace(write_run(tmp_path, steps=12), steps="3:5")
    assert (report.png, report.merged, report.breakdown) == (tmp_path / "timeline.png", tmp_path / "trace-merged.json",
                                                             tmp_path / "breakdown.json")
    assert report.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(report.breakdown.read_text()) == report.as_dict()
    assert report.window == report.steps == [3, 4, 5] and not report.steady
    assert report.as_dict()["waited_for"] == "rank 2 (node2)"


def test_a_folder_that_does_not_exist_is_a_user_error(tmp_path):
    with pytest.raises(LabError, match="no run folder") as caught:
        write_trace(tmp_path / "nope")
    assert caught.value.exit_code == 2


def test_a_folder_without_metrics_or_traces_says_what_it_needs(tmp_path):
    (tmp_path / "node0.log").write_text("hello\n")
    with pytest.raises(StateError, match="holds no metrics and no profiler traces") as caught:
        write_trace(tmp_path)
    assert caught.value.exit_code == 1
    assert "metrics-rank<R>.jsonl" in caught.value.hint and "trace-rank<R>.json" in caught.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node0.log"]  # nothing written


def test_metrics_without_step_times_are_refused(tmp_path):
    (tmp_path / "metrics-rank0.jsonl").write_text(json.dumps({"kind": "epoch", "epoch": 1, "loss": 0.5}) + "\n")
    with pytest.raises(StateError, match="hold no step records with times") as caught:
        write_trace(tmp_path)
    assert "--log-every" in caught.value.hint


def test_an_earlier_attempt_and_a_cut_last_line_are_left_out(tmp_path):
    write_run(tmp_path, steps=3)
    path = tmp_path / "metrics-rank0.jsonl"
    earlier = [clock_record(0, "start"), step_record(0, 1), {**step_record(0, 2), "compute_ms": 999.0}]
    path.write_text("\n".join(map(json.dumps, earlier)) + "\n" + path.read_text() + '{"kind": "step", "ra')
    run = read_run(tmp_path)
    assert [s.compute_ms for s in run.rank(0).steps] == [30.0, 30.0, 30.0]
    assert run.notes == ("rank 0: 1 line(s) of metrics-rank0.jsonl skipped (not a whole JSON record)",)


def test_find_run_takes_a_run_id_the_latest_or_a_path(tmp_path):
    lab = tmp_path / ".lab" / "demo"
    first = write_run(lab / "runs" / "20261125-100000-aaaa")
    (lab / "runs" / "latest").symlink_to(first.name)
    assert find_run(lab) == first.resolve()
    assert find_run(lab, "20261125-100000-aaaa") == first.resolve()
    assert find_run(lab, ".lab/demo/runs/20261125-100000-aaaa", cwd=tmp_path) == first.resolve()
    with pytest.raises(LabError, match="no run 'nope': neither a run id in") as caught:
        find_run(lab, "nope", cwd=tmp_path)
    assert caught.value.hint == "runs here: 20261125-100000-aaaa" and caught.value.exit_code == 2
    with pytest.raises(LabError, match="no run '~no-such-user-0'"):  # not a home folder: a name like any other
        find_run(lab, "~no-such-user-0", cwd=tmp_path)
    with pytest.raises(LabError, match="RUN is empty"):
        find_run(lab, " ")
    with pytest.raises(LabError, match="no run yet"):
        find_run(tmp_path / ".lab" / "other")
