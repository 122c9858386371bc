"""The timeline picture as data: one lane per rank, its bars by kind, on one time axis. Pure;
draw.py turns it into a PNG with matplotlib."""

from __future__ import annotations

from dataclasses import dataclass

from labctl.trace.breakdown import RankRow, Segment, rank_row
from labctl.trace.records import RunRecords, Step

# The picture's bar kinds: breakdown's three, its waiting drawn in two shades (the kind's colour,
# hatched for the part that is the all-reduce itself rather than another rank).
LEGEND = {"compute": "compute",
          "overlap": "compute, all-reduce in flight (overlapped)",
          "waiting": "waiting for the slowest rank",
          "exposed": "waiting: the exposed all-reduce",
          # a pipeline stage's (--strategy pp): its micro-batches, numbered, and the time between them
          "forward": "forward of micro-batch N",
          "backward": "backward of micro-batch N",
          "bubble": "bubble: waiting for a neighbour stage"}


@dataclass(frozen=True)
class Lane:
    label: str  # rank 2 (node2)
    bars: dict[str, list[tuple[float, float]]]  # kind -> (start, width) in ms from the picture's zero
    waited_for: bool  # the rank the others waited for: marked
    note: str  # its shares of the window's wall time, e.g. "compute 31%, waiting 62%"
    marks: list[tuple[float, str]] = ()  # (ms, text) written on a bar: a pipeline's micro-batch numbers


@dataclass(frozen=True)
class Picture:
    title: str
    lanes: list[Lane]
    ticks: list[tuple[float, str]]  # (ms, "step N"): where the reference lane's steps begin
    span_ms: float  # the time axis' extent


def lane_note(row: RankRow, staged: bool = False) -> str:
    waiting = row.fraction(row.waiting_s + row.exposed_s)
    return f"compute {row.fraction(row.compute_s):.0%}, {'bubble' if staged else 'waiting'} {waiting:.0%}"


def bar_kind(p: Segment) -> str:
    """The picture's kind of a segment: breakdown's, with the exposed all-reduce, a stage's forward and
    backward, and its bubble told apart (the segment's shade)."""
    return p.shade or p.kind


def build_picture(run: RunRecords, steps: dict[int, list[tuple[Step, list[Segment]]]], waited_for: int | None,
                  title: str) -> Picture:
    """The window's steps (`steps`: every rank's, with their segments) as lanes, from the first step's
    earliest start."""
    starts = [parts[0].start for chosen in steps.values() for _, parts in chosen if parts]
    zero = min(starts, default=0.0)
    lanes = []
    for r in run.ranks:
        chosen = steps.get(r.rank, [])
        bars: dict[str, list[tuple[float, float]]] = {kind: [] for kind in LEGEND}
        marks = []
        for _, parts in chosen:
            for p in parts:
                kind = bar_kind(p)
                bars[kind].append(((p.start - zero) * 1e3, (p.end - p.start) * 1e3))
                if p.micro is not None:
                    marks.append((((p.start + p.end) / 2 - zero) * 1e3, str(p.micro)))
        staged = any(s.pipeline for s, _ in chosen)
        lanes.append(Lane(r.label, bars, r.rank == waited_for,
                          lane_note(rank_row(r, chosen), staged) if chosen else "no steps", marks))
    reference = next((chosen for chosen in steps.values() if chosen), [])
    ticks = [((parts[0].start - zero) * 1e3, f"step {s.step}") for s, parts in reference if parts]
    ends = [p.end for chosen in steps.values() for _, parts in chosen for p in parts]
    return Picture(title, lanes, ticks, (max(ends, default=zero) - zero) * 1e3)
