"""`labctl trace`: every rank of a run side by side on one aligned time axis."""

from __future__ import annotations

import click

from labctl.api.inputs import STEPS_ALLOWED
from labctl.cli.app import CONTEXT, invocation, main
from labctl.cli.lazy import render_trace
from labctl.cli.options import json_option, lab_option


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
    here = invocation()
    render_trace.print_trace(here.lab(lab).trace(run, steps=steps, base=here.cwd), as_json)
