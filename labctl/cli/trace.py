"""`labctl trace`: every rank of a run side by side on one aligned time axis."""

from __future__ import annotations

import click

from labctl.cli.app import CONTEXT, main, session
from labctl.cli.options import json_option, lab_option
from labctl.lab.lifecycle import lab_dir
from labctl.trace import find_run, write_trace
from labctl.trace.breakdown import STEPS_ALLOWED, parse_steps


@main.command(context_settings=CONTEXT)
@click.argument("run", required=False, metavar="[RUN]")
@lab_option
@click.option("--steps", metavar="A:B", help=f"Steps for the table and the picture: {STEPS_ALLOWED} [default: the "
                                              "table over every step but the first, as SUMMARY; the picture 8 "
                                              "steps from the middle].")
@json_option('Print {"verdict", "waited_for", "waited_total_s", "ranks": [...], "alignment", "files", ...}.')
def trace(run, lab, steps, as_json) -> None:
    """Put every rank of a run on one time axis: a timeline PNG, a merged Chrome trace, and a table.

    RUN is a run id under .lab/<lab>/runs/ or a run folder's path [default: the lab's latest run].
    The ranks' clocks are lined up by the barrier they all leave at the start, and what is left of
    their disagreement is measured at the end. Written into the run folder: timeline.png (one lane
    per rank: compute, compute overlapped with the all-reduce, waiting), trace-merged.json (open it
    in https://ui.perfetto.dev; with the profiler's trace-rank<R>.json merged in), breakdown.json.
    """
    from labctl.cli import render_trace

    bounds = parse_steps(steps) if steps is not None else None  # bad --steps: exit 2 before anything is read
    here = session()
    run_dir = find_run(lab_dir(here.workspace, here.config(lab=lab).lab), run, here.cwd)
    render_trace.print_trace(write_trace(run_dir, steps=bounds), as_json)
