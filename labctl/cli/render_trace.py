"""What `labctl trace` prints: the table per rank, the verdict, the alignment and where the files
are; or the same as one JSON document."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from labctl.cli.render import emit_json
from labctl.core.ui import console, info
from labctl.trace import TraceReport
from labctl.trace.report import PERFETTO


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def trace_table(report: TraceReport) -> Table:
    steps = report.steps
    which = "steady steps, as SUMMARY" if report.steady else "--steps"
    table = Table(title=f"{report.run_dir.name}: where each rank's wall time went, steps {steps[0]}-{steps[-1]} "
                        f"({len(steps)}, {which})", title_justify="left")
    for column in ("rank", "compute", "exposed comm", "waiting", "other", "comm overlapped", "clock offset"):
        table.add_column(column, justify="left" if column == "rank" else "right")
    for row in report.rows:
        marked = row.rank == report.waited_for and len(report.rows) > 1
        offset = report.alignment.offsets_s.get(row.rank) if report.alignment.event else None
        table.add_row(f"[bold]{escape(row.label)}[/bold] (waited for)" if marked else escape(row.label),
                      percent(row.fraction(row.compute_s)), percent(row.fraction(row.exposed_s)),
                      percent(row.fraction(row.waiting_s)), percent(row.fraction(row.other_s)),
                      percent(row.overlap_fraction), "-" if offset is None else f"{offset * 1e3:+.3f} ms")
    return table


def prediction_line(report: TraceReport) -> str | None:
    """Each rank's step as the trainer's step model predicted it before step 1, beside the measured
    mean over the table's steps; None for runs from before the step model (no "prediction" record)."""
    ranks = [r for r in report.rows if r.predicted_step_ms and r.step_ms]
    if not ranks:
        return None
    return "step model: " + "; ".join(f"rank {r.rank} predicted {r.predicted_step_ms:.1f} ms a step, measured "
                                      f"{r.step_ms:.1f} ({r.step_ms / r.predicted_step_ms - 1:+.1%})" for r in ranks)


def alignment_line(report: TraceReport) -> str:
    a = report.alignment
    if a.event is None:
        return f"clocks: not aligned ({a.why_not})"
    residual = "not measured (no \"end\" record from every rank)" if a.residual_ms is None else f"{a.residual_ms:.3f} ms"
    return (f"clocks: aligned on the \"{a.event}\" barrier (rank {a.reference}'s clock); residual at the \"end\" "
            f"barrier: {residual}")


LEGEND = ("fractions of each rank's wall time; waiting: for the slowest rank to hand its gradients over; exposed "
          "comm: communication no compute hid (DDP's all-reduce after that; fsdp's blocking collectives; tp's "
          "all-reduces inside a node)")
LEGEND_PIPELINE = ("fractions of each stage's wall time; compute: its forwards and backwards and the optimizer; "
                   "waiting: the pipeline's bubble, the stage waiting for a neighbour's activations or gradients")


def print_trace(report: TraceReport, as_json: bool) -> None:
    """`labctl trace`: the table and the lines under it, or report.as_dict() as JSON."""
    if as_json:
        emit_json(report.as_dict())
        return
    if report.rows:
        console.print(trace_table(report))
        console.print(report.verdict(), markup=False)
        console.print(LEGEND_PIPELINE if report.pipeline else LEGEND, markup=False, style="dim")
    console.print(alignment_line(report), markup=False)
    if report.png:
        console.print(f"timeline: {report.png} (steps {report.window[0]}-{report.window[-1]})", markup=False)
    console.print(f"merged trace: {report.merged} (open it in {PERFETTO} or chrome://tracing)", markup=False)
    if report.breakdown:
        console.print(f"table: {report.breakdown}", markup=False)
    line = prediction_line(report)
    if line:
        console.print(line, markup=False)
    for note in report.notes:
        info(escape(note))  # notes quote `pip install 'ddplab[plot]'`, which rich would read as markup
