"""Lining up the ranks' clocks by a moment they share, instead of trusting their wall clocks.

Every rank stamps the moment it leaves a barrier ("start", before the first step; the trainer passes
several back to back). Ranks leave a barrier within about one message's latency of each other, so
what their stamps disagree by is, to that latency, what their clocks disagree by: rank r's offset is
its stamp minus the reference rank's (the lowest rank), and subtracting it puts rank r on the
reference's clock.

Which of the barriers: a rank descheduled just as it leaves a barrier stamps it late (68 ms once,
on a node at a quarter of a CPU), never early, and the clocks' offsets are the same at every barrier.
So each barrier's stamps are tried as the offsets, and the one kept is the one that explains the
other barriers with the least lateness in all (per barrier, the sum over ranks of how much later
than the earliest corrected stamp each rank's corrected stamp is). A barrier disturbed by one late
rank would need the others to be late at every other barrier; a clean one needs lateness only
where the disturbance really was. (With two ranks this is the median of their differences.)

The residual is measured at the second shared moment, the "end" barriers, after aligning on the
first: the same choice among the end barriers gives each rank's offset at the end, and the residual
is how far those moved since the start (their spread across ranks, in ms). It is what is left of
the clocks' disagreement after alignment (drift over the run, and the barriers' own jitter), so it
says how far to trust the timeline's cross-rank comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labctl.trace.records import RankRecords

ALIGN_EVENT = "start"
CHECK_EVENT = "end"


@dataclass(frozen=True)
class Alignment:
    """How each rank's clock is put on the reference rank's."""

    event: str | None  # the clock event aligned on; None: the ranks' own clocks (no shared event recorded)
    reference: int | None  # the rank whose clock the others are put on
    offsets_s: dict[int, float] = field(default_factory=dict)  # rank's clock minus the reference's: subtract it
    residual_ms: float | None = None  # spread of residual_by_rank_ms; None where unmeasured
    residual_by_rank_ms: dict[int, float] = field(default_factory=dict)  # each offset's move from start to end
    barrier: int | None = None  # which of the start barriers was used, from 0
    why_not: str = ""  # where event is None: why

    def offset(self, rank: int) -> float:
        return self.offsets_s.get(rank, 0.0)

    def as_dict(self) -> dict:
        return {"event": self.event, "reference_rank": self.reference, "barrier": self.barrier,
                "offsets_ms": {str(r): round(o * 1e3, 3) for r, o in sorted(self.offsets_s.items())},
                "residual_ms": None if self.residual_ms is None else round(self.residual_ms, 3),
                "residual_by_rank_ms": {str(r): round(v, 3) for r, v in sorted(self.residual_by_rank_ms.items())},
                **({"not_aligned": self.why_not} if self.why_not else {})}


def best_barrier(times: dict[int, tuple[float, ...]]) -> int | None:
    """The index of the barrier whose stamps, taken as the clocks' offsets, leave the least lateness
    at all the barriers (see the module's docstring); None where some rank has no stamp."""
    count = min((len(t) for t in times.values()), default=0)
    if count == 0:
        return None
    reference = min(times)
    return min(range(count), key=lambda j: lateness(times, offsets_at(times, reference, j), count))


def offsets_at(times: dict[int, tuple[float, ...]], reference: int, j: int) -> dict[int, float]:
    """Each rank's clock minus the reference's, as barrier j's stamps have them."""
    return {rank: t[j] - times[reference][j] for rank, t in times.items()}


def lateness(times: dict[int, tuple[float, ...]], offsets: dict[int, float], count: int) -> float:
    """Over the first `count` barriers, how much later than the earliest each corrected stamp is, summed."""
    total = 0.0
    for j in range(count):
        corrected = [t[j] - offsets[rank] for rank, t in times.items()]
        total += sum(corrected) - len(corrected) * min(corrected)
    return total


def spread(values) -> float:
    values = list(values)
    return max(values) - min(values)


def align(ranks: tuple[RankRecords, ...] | list[RankRecords]) -> Alignment:
    """Offsets from the "start" clock records, and the residual at the "end" ones."""
    ranks = list(ranks)
    missing = [r.rank for r in ranks if not r.clocks.get(ALIGN_EVENT)]
    if not ranks or missing:
        why = (f"no \"{ALIGN_EVENT}\" clock record from rank{'s' if len(missing) > 1 else ''} "
               f"{', '.join(map(str, missing))}: each rank's own clock is used as it is")
        return Alignment(None, None, {r.rank: 0.0 for r in ranks}, why_not=why if ranks else "no ranks")
    starts = {r.rank: r.clocks[ALIGN_EVENT] for r in ranks}
    reference = min(starts)
    j = best_barrier(starts)
    offsets = offsets_at(starts, reference, j)
    residual, by_rank = residual_at_end(ranks, offsets, reference)
    return Alignment(ALIGN_EVENT, reference, offsets, residual, by_rank, j)


def residual_at_end(ranks: list[RankRecords], offsets: dict[int, float],
                    reference: int) -> tuple[float | None, dict[int, float]]:
    """(spread across ranks of how far each offset moved from the start to the end, in ms; each rank's
    move in ms); (None, {}) for one rank or where a rank has no "end" record (a run that did not finish)."""
    ends = {r.rank: r.clocks.get(CHECK_EVENT, ()) for r in ranks}
    if len(ranks) < 2 or not all(ends.values()):
        return None, {}
    at_end = offsets_at(ends, reference, best_barrier(ends))
    moved = {rank: (at_end[rank] - offsets[rank]) * 1e3 for rank in ends}
    return spread(moved.values()), moved
