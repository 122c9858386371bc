"""Where each rank's time went, step by step, on the aligned time axis: HTA's temporal breakdown
(compute, communication, idle) and its comm/compute overlap, from the metrics of any backend.

A step of one rank, from its times (trainer/instrument.py says how each is measured), in order:

  compute    t_start -> t_comm_start: forward, and backward until the first gradient bucket is ready
  overlap    t_comm_start -> arrived: backward goes on while the first buckets' all-reduce runs;
             arrived = t_backward_end - comm_wait_ms, when the last bucket was handed over
  waiting    arrived -> t_backward_end, the time backward() sat blocked, in two parts: waiting for
             the slowest rank (until the last rank, on the aligned axis, handed its last bucket
             over), then the all-reduce's exposed part (the transfer no compute hid)
  compute    t_backward_end -> t_end: the optimizer step

A pipeline stage's step (--strategy pp: its record's `pipeline`) is its own forward and backward of
each micro-batch (compute), the gaps between them, where it waits for a neighbour stage's activations
or gradients, and the gap after its last backward (the schedule's last sends, the tied embedding's
sum): the pipeline's bubble, waiting by another name; then the optimizer.

Between one step's t_end and the next's t_start ("other": data, logging) the rank does neither.

The rank the others waited for, and the waiting total, are defined as the trainer's summarize()
defines them (SUMMARY's slowest_rank and waited_for_slowest_s), so the two can be compared: the rank
with the most compute_ms over the steps, and the mean over the other ranks of how much less
compute_ms they did. By default over the same steady steps as summarize(): every step every rank
recorded but each rank's first. (The per-rank "waiting" column is measured on the aligned timeline
instead; it also holds the slowest rank's slower optimizer and data loading, so it can be larger.)
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from labctl.errors import ConfigError
from labctl.trace.align import Alignment
from labctl.trace.records import RankRecords, Step

COMPUTE, OVERLAP, WAITING = "compute", "overlap", "waiting"
EXPOSED = "all-reduce, exposed"  # the waiting that is communication, not another rank
BUBBLE = "bubble"  # how a pipeline stage's waiting is named (its segments' `what` begins so)
WINDOW_STEPS = 8  # the picture's default: 8 steps from the middle of the steady ones
PIPELINE_WINDOW_STEPS = 2  # a pipeline's: its micro-batches stay wide enough to tell apart
STEPS_ALLOWED = "A:B (steps A to B), A: (from A) or :B (up to B), with step numbers from 1 and A <= B, e.g. 10:20"


@dataclass(frozen=True)
class Segment:
    kind: str  # COMPUTE, OVERLAP or WAITING
    what: str  # in words, for the merged trace: "optimizer", "waiting for rank 2", ...
    start: float  # aligned unix seconds
    end: float
    shade: str = ""  # how the picture tells it apart within its kind: "exposed", "forward", "backward", "bubble"
    micro: int | None = None  # a pipeline stage's micro-batch, written on its bar


@dataclass(frozen=True)
class RankRow:
    """One rank's line of the table, over the table's steps (seconds; fractions of wall time)."""

    rank: int
    label: str
    wall_s: float
    compute_s: float  # overlap included: compute is compute, hidden communication or not
    exposed_s: float  # the all-reduce after the last rank arrived, unhidden
    waiting_s: float  # waiting for the slowest rank to hand its gradients over
    comm_s: float  # t_comm_start -> t_comm_end, summed
    overlap_s: float  # the part of comm_s with compute going on
    step_ms: float | None = None  # the mean step, t_start -> t_end, as the SUMMARY's step_ms
    predicted_step_ms: float | None = None  # what the trainer's step model said before step 1

    def fraction(self, seconds: float) -> float:
        return seconds / self.wall_s if self.wall_s else 0.0

    @property
    def other_s(self) -> float:
        return max(0.0, self.wall_s - self.compute_s - self.exposed_s - self.waiting_s)

    @property
    def overlap_fraction(self) -> float | None:
        return self.overlap_s / self.comm_s if self.comm_s else None

    def as_dict(self) -> dict:
        return {"rank": self.rank, "label": self.label, "wall_s": round(self.wall_s, 4),
                "compute": round(self.fraction(self.compute_s), 4),
                "exposed_comm": round(self.fraction(self.exposed_s), 4),
                "waiting": round(self.fraction(self.waiting_s), 4), "other": round(self.fraction(self.other_s), 4),
                "comm_overlapped": None if self.overlap_fraction is None else round(self.overlap_fraction, 4),
                "compute_s": round(self.compute_s, 4), "exposed_comm_s": round(self.exposed_s, 4),
                "waiting_s": round(self.waiting_s, 4), "comm_s": round(self.comm_s, 4),
                "step_ms": None if self.step_ms is None else round(self.step_ms, 3),
                "predicted_step_ms": self.predicted_step_ms}


def parse_steps(text: str) -> tuple[int | None, int | None]:
    """`--steps A:B` as (A, B), None for an open end; ConfigError (exit 2) otherwise."""
    first, sep, last = str(text).strip().partition(":")
    try:
        bounds = (int(first) if first.strip() else None, int(last) if last.strip() else None)
    except ValueError:
        bounds = None
    if not sep or bounds is None or bounds == (None, None) or any(b is not None and b < 1 for b in bounds) or (
            None not in bounds and bounds[0] > bounds[1]):
        raise ConfigError("--steps", text, f"must be {STEPS_ALLOWED}")
    return bounds


def common_steps(ranks: list[RankRecords]) -> list[int]:
    """Step numbers every rank recorded."""
    numbers = [{s.step for s in r.steps} for r in ranks if r.steps]
    return sorted(set.intersection(*numbers)) if numbers else []


def steady_steps(ranks: list[RankRecords]) -> list[int]:
    """summarize()'s steps: every rank's but its first (when it has more), those every rank has."""
    numbers = [{s.step for s in r.steps[1:] or r.steps} for r in ranks if r.steps]
    return sorted(set.intersection(*numbers)) if numbers else []


def choose_steps(ranks: list[RankRecords], steps: tuple[int | None, int | None] | None, given: str = "") -> list[int]:
    """The table's steps: the steady ones, or those of `steps` (A, B) every rank recorded."""
    if steps is None:
        return steady_steps(ranks)
    every = common_steps(ranks)
    first, last = steps
    chosen = [n for n in every if (first is None or n >= first) and (last is None or n <= last)]
    if not chosen:
        have = f"this run's steps are {every[0]}-{every[-1]}" if every else "this run has no step records"
        raise ConfigError("--steps", given or f"{first or ''}:{last or ''}", have)
    return chosen


def window(steps: list[int], size: int = WINDOW_STEPS) -> list[int]:
    """`size` consecutive steps from the middle of `steps`: past the warm-up, before the end."""
    begin = max(0, (len(steps) - size) // 2)
    return steps[begin:begin + size]


def by_number(rank: RankRecords, numbers: list[int]) -> list[Step]:
    wanted = set(numbers)
    return [s for s in rank.steps if s.step in wanted]


def latest_arrivals(ranks: list[RankRecords], numbers: list[int], alignment: Alignment) -> dict[int, tuple[float, int]]:
    """Per step, (the aligned time the last rank handed its last bucket over, that rank)."""
    out: dict[int, tuple[float, int]] = {}
    for rank in ranks:
        for s in by_number(rank, numbers):
            arrived = s.arrived - alignment.offset(rank.rank)
            if s.step not in out or arrived > out[s.step][0]:
                out[s.step] = (arrived, rank.rank)
    return out


def step_segments(s: Step, offset: float, latest: tuple[float, int]) -> list[Segment]:
    """One step of one rank as segments on the aligned axis (see the module's docstring)."""
    start, backward_end, end = s.t_start - offset, s.t_backward_end - offset, s.t_end - offset
    if s.pipeline:
        parts = stage_segments(s, offset)
    elif not s.has_comm:
        parts = [Segment(COMPUTE, "forward and backward", start, backward_end)]
    else:
        comm_start = min(max(s.t_comm_start - offset, start), backward_end)
        arrived = min(max(s.arrived - offset, comm_start), backward_end)
        waited_until = min(max(latest[0], arrived), backward_end)
        parts = [Segment(COMPUTE, "forward and backward", start, comm_start),
                 Segment(OVERLAP, "backward, all-reduce in flight", comm_start, arrived),
                 Segment(WAITING, f"waiting for rank {latest[1]}", arrived, waited_until),
                 Segment(WAITING, EXPOSED, waited_until, backward_end, "exposed")]
    parts.append(Segment(COMPUTE, "optimizer", backward_end, end))
    return [p for p in parts if p.end > p.start]


def stage_segments(s: Step, offset: float) -> list[Segment]:
    """A pipeline stage's step until backward returned: each forward and backward, and before each the
    bubble it waited in (for the activations a forward needs, the gradients a backward needs)."""
    parts, at = [], s.t_start - offset
    for work in s.pipeline:
        begin, finish = max(work.start - offset, at), max(work.end - offset, at)
        needs = "activations" if work.kind == "forward" else "gradients"
        parts.append(Segment(WAITING, f"{BUBBLE}: waiting for micro-batch {work.micro}'s {needs}", at, begin, BUBBLE))
        parts.append(Segment(COMPUTE, f"{work.kind}, micro-batch {work.micro}", begin, finish, work.kind, work.micro))
        at = finish
    end = max(s.t_backward_end - offset, at)
    return parts + [Segment(WAITING, f"{BUBBLE}: the last sends, the tied embedding's sum", at, end, BUBBLE)]


def is_pipeline(ranks: list[RankRecords]) -> bool:
    return any(s.pipeline for r in ranks for s in r.steps)


def segments(ranks: list[RankRecords], numbers: list[int], alignment: Alignment) -> dict[int, list[tuple[Step, list[Segment]]]]:
    """Every rank's steps among `numbers`, each with its segments."""
    latest = latest_arrivals(ranks, numbers, alignment)
    return {r.rank: [(s, step_segments(s, alignment.offset(r.rank), latest[s.step])) for s in by_number(r, numbers)]
            for r in ranks}


def rank_row(rank: RankRecords, steps: list[tuple[Step, list[Segment]]]) -> RankRow:
    def total(keep) -> float:
        return sum(p.end - p.start for _, parts in steps for p in parts if keep(p))

    overlap = total(lambda p: p.kind == OVERLAP)
    exposed = total(lambda p: p.what == EXPOSED)
    return RankRow(rank.rank, rank.label, sum(s.wall_ms for s, _ in steps) / 1e3,
                   total(lambda p: p.kind == COMPUTE) + overlap, exposed,
                   total(lambda p: p.kind == WAITING) - exposed,
                   sum(s.t_comm_end - s.t_comm_start for s, _ in steps if s.has_comm), overlap,
                   sum((s.t_end - s.t_start) * 1e3 for s, _ in steps) / len(steps) if steps else None,
                   rank.predicted_step_ms)


def waited_for(ranks: list[RankRecords], numbers: list[int]) -> tuple[int | None, float]:
    """(the rank the others waited for, how long they waited in all, seconds), as summarize() has
    them: the rank with the most compute_ms over `numbers`, and the mean over the others of how much
    less compute_ms they did. (None, 0.0) without steps."""
    totals = {r.rank: sum(s.compute_ms for s in by_number(r, numbers)) for r in ranks if r.steps}
    if not totals or not numbers:
        return None, 0.0
    slowest = max(sorted(totals), key=lambda r: totals[r])  # the lowest rank on a tie, as summarize()
    others = [totals[slowest] - t for r, t in totals.items() if r != slowest]
    return slowest, statistics.fmean(others) / 1e3 if others else 0.0
