"""`labctl trace`: a run's ranks on one aligned time axis, written into the run folder.

    write_trace(run_dir, steps=None) -> TraceReport     the one call (`labctl trace`, and whatever
                                                        else wants a run's timeline)
    find_run(lab_directory, run=None, cwd=None) -> Path  which run folder RUN names
    write_comparison(path, [(title, run_dir), ...])      runs' timelines side by side in one PNG

It writes timeline.png (needs the `plot` extra; without it, a note says how to get it),
trace-merged.json (Perfetto, chrome://tracing) and breakdown.json (the table, as --json prints it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from labctl.core.plotting import INSTALL_HINT, have_matplotlib
from labctl.core.workspace import is_folder
from labctl.errors import LabError, StateError
from labctl.run.logs import run_dir as latest_run_dir
from labctl.run.logs import runs_hint
from labctl.trace import chrome, draw
from labctl.trace.align import Alignment, align
from labctl.trace.breakdown import (PIPELINE_WINDOW_STEPS, WINDOW_STEPS, RankRow, choose_steps, is_pipeline, parse_steps,
                                    rank_row, segments, waited_for, window)
from labctl.trace.picture import Picture, build_picture
from labctl.trace.records import NEEDS, RunRecords, read_run

PNG, MERGED, BREAKDOWN = "timeline.png", "trace-merged.json", "breakdown.json"
PERFETTO = "https://ui.perfetto.dev"


@dataclass(frozen=True)
class TraceReport:
    run_dir: Path
    rows: list[RankRow]  # one per rank with steps, over `steps`
    steps: list[int]  # the table's steps
    window: list[int]  # the picture's steps
    waited_for: int | None  # the rank the others waited for (summarize()'s slowest_rank)
    waited_for_label: str | None  # rank 2 (node2)
    waited_total_s: float  # summarize()'s waited_for_slowest_s, over `steps`
    alignment: Alignment
    merged: Path
    breakdown: Path | None
    png: Path | None  # None without matplotlib (see notes)
    notes: list[str] = field(default_factory=list)
    steady: bool = True  # the table's steps are summarize()'s (no --steps)
    pipeline: bool = False  # a pipeline's stages (--strategy pp): their waiting is the bubble

    def verdict(self) -> str:
        """One line: who the others waited for, how long, over which steps."""
        if self.waited_for is None:
            return "no step records: no rank to name"
        if len(self.rows) < 2:
            return f"{self.waited_for_label} ran alone: nobody waited"
        if self.pipeline:
            return (f"the stage with the most compute, which sets the pipeline's pace: {self.waited_for_label}; the "
                    f"others computed {self.waited_total_s:.2f} s less in all over {len(self.steps)} steps "
                    f"({step_range(self.steps)})")
        return (f"the others waited for {self.waited_for_label}: {self.waited_total_s:.2f} s in all over "
                f"{len(self.steps)} steps ({step_range(self.steps)})")

    def as_dict(self) -> dict:
        """What `labctl trace --json` prints and breakdown.json holds."""
        return {"run_dir": str(self.run_dir), "steps": self.steps and [self.steps[0], self.steps[-1]],
                "measured_steps": len(self.steps), "steady_steps": self.steady,
                "window": self.window and [self.window[0], self.window[-1]],
                "waited_for_rank": self.waited_for, "waited_for": self.waited_for_label,
                "waited_total_s": round(self.waited_total_s, 4), "verdict": self.verdict(), "pipeline": self.pipeline,
                "ranks": [r.as_dict() for r in self.rows], "alignment": self.alignment.as_dict(),
                "files": {"png": self.png and str(self.png), "merged_trace": str(self.merged),
                          "breakdown": self.breakdown and str(self.breakdown)},
                "notes": list(self.notes)}


def step_range(steps: list[int]) -> str:
    return f"steps {steps[0]}-{steps[-1]}" if steps else "no steps"


def find_run(lab_directory: Path, run: str | None = None, cwd: Path | None = None) -> Path:
    """The run folder RUN names: a run id under <lab_directory>/runs/ (default: the latest run), else
    a path to a run folder (relative to `cwd`). Neither: a LabError naming the latest runs."""
    if run is None:
        return latest_run_dir(lab_directory, None)
    if not run.strip():
        raise LabError("RUN is empty: give a run id or a run folder's path", hint="labctl trace (the latest run)")
    runs = lab_directory / "runs"
    if "/" not in run and run not in (".", "..") and is_folder(runs / run):
        return (runs / run).resolve()
    try:
        path = Path(run).expanduser()
    except RuntimeError:  # ~name of a user who does not exist: a name like any other, then
        path = Path(run)
    path = path if path.is_absolute() else (cwd or Path.cwd()) / path
    if is_folder(path):
        return path.resolve()
    raise LabError(f"no run {run!r}: neither a run id in {runs} nor a folder", hint=runs_hint(runs))


def resolve_steps(steps: str | tuple[int | None, int | None] | None) -> tuple[tuple[int | None, int | None] | None, str]:
    """(bounds, as given) from "A:B", a tuple, or None."""
    if steps is None or isinstance(steps, tuple):
        return steps, "" if steps is None else f"{steps[0] or ''}:{steps[1] or ''}"
    return parse_steps(steps), str(steps)


def analyse(run: RunRecords, steps=None) -> tuple[Alignment, list[int], list[int], dict, dict]:
    """(alignment, the table's steps, the picture's, every step's segments, the window's segments)."""
    bounds, given = resolve_steps(steps)
    alignment = align(run.ranks)
    ranks = list(run.ranks)
    if not run.has_steps:
        if bounds is not None:
            raise LabError(f"--steps {given}: this run has no step records, only profiler traces",
                           hint="leave --steps out")
        return alignment, [], [], {}, {}
    table = choose_steps(ranks, bounds, given)
    shown = table if bounds is not None else window(table, PIPELINE_WINDOW_STEPS if is_pipeline(ranks) else WINDOW_STEPS)
    every = sorted({s.step for r in ranks for s in r.steps})
    return alignment, table, shown, segments(ranks, every, alignment), segments(ranks, shown, alignment)


def write_trace(run_dir: Path, *, steps: str | tuple[int | None, int | None] | None = None) -> TraceReport:
    """Read the run folder, align the ranks' clocks, and write timeline.png, trace-merged.json and
    breakdown.json into it. `steps`: "A:B" (or (A, B), None for an open end) for the table and the
    picture; default: the table over summarize()'s steady steps, the picture 8 steps from the middle
    (a pipeline's 2, each stage's micro-batches numbered).

    LabError (exit 2): no such folder, bad `steps`; StateError (exit 1): nothing to draw from."""
    run = read_run(Path(run_dir))
    alignment, table, shown, every, windowed = analyse(run, steps)
    notes = list(run.notes) + ([f"clocks not aligned: {alignment.why_not}"] if alignment.why_not else [])
    if not run.has_steps:
        notes.append("no picture and no table: the run has no step records (metrics-rank<R>.jsonl), only profiler "
                     "traces, which the merged trace holds")
    slowest, waited_s = waited_for(list(run.ranks), table)
    label = run.rank(slowest).label if slowest is not None else None
    table_segments = segments(list(run.ranks), table, alignment) if table else {}
    rows = [rank_row(r, table_segments[r.rank]) for r in run.ranks if table_segments.get(r.rank)]
    merged = chrome.write(run.run_dir / MERGED, chrome.build(run, alignment, every, notes))
    png = None
    if shown and have_matplotlib():
        png = draw.draw(run.run_dir / PNG, [picture(run, windowed, slowest, shown)])
    elif shown:
        notes.append(f"no picture: it is drawn with matplotlib; {INSTALL_HINT}")
    report = TraceReport(run.run_dir, rows, table, shown, slowest, label, waited_s, alignment, merged,
                         run.run_dir / BREAKDOWN if rows else None, png, notes, steady=steps is None,
                         pipeline=is_pipeline(list(run.ranks)))
    if report.breakdown:
        report.breakdown.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    return report


def picture(run: RunRecords, windowed: dict, slowest: int | None, shown: list[int], title: str = "") -> Picture:
    head = title or run.run_dir.name
    marked = f", waited for: {run.rank(slowest).label}" if slowest is not None and len(run.ranks) > 1 else ""
    return build_picture(run, windowed, slowest, f"{head}: {step_range(shown)}{marked}")


def write_comparison(path: Path, runs: list[tuple[str, Path]], title: str | None = None) -> Path:
    """Each run's default window side by side in one PNG at `path`, on one time scale (needs the
    `plot` extra: labctl.core.plotting.require_matplotlib first). `runs`: (title, run folder)."""
    pictures = []
    for head, run_dir in runs:
        run = read_run(run_dir)
        _, table, shown, _, windowed = analyse(run)
        if not shown:
            raise StateError(f"{run.run_dir} has profiler traces but no step records: no timeline to draw",
                             hint=NEEDS)
        pictures.append(picture(run, windowed, waited_for(list(run.ranks), table)[0], shown, head))
    return draw.draw(Path(path), pictures, title)
