"""Finding what makes runs hang: doctor, and the trap scenarios."""

from __future__ import annotations

import sys
from dataclasses import asdict

import click

from labctl.api.inputs import OVERLAYS
from labctl.api.scenarios import SCENARIOS, select_scenarios
from labctl.cli.app import CONTEXT, invocation, main
from labctl.cli.lazy import render, render_ops
from labctl.cli.options import json_option, lab_option
from labctl.core.ui import stdout_console


@main.command(context_settings=CONTEXT)
@lab_option
@click.option("--ops", "ops", is_flag=True,
              help="Instead: try every c10d operation on the lab's nodes (sync, async with wait(), async with "
                   "get_future(), each reduce op, all_reduce of each dtype) and print what the backend can do.")
@json_option('Print {"ok", "seconds", "nodes": {...}, "findings": [...]} (with --ops: the probe\'s table).')
def doctor(lab, ops, as_json) -> None:
    """Check the lab for what makes distributed runs hang, in seconds: versions, ranks, the
    rendezvous host, the socket interface, and reachability of the rendezvous and back-connect
    ports between every pair of nodes. Exit status 1 when something is wrong; each problem names
    the node and the fix. With --ops, instead, what the lab's backend can do, tried on its nodes in
    a few seconds: each operation in each form, each reduce op, each dtype, with what it refused."""
    if ops:
        render_ops.print_ops(invocation().lab(lab).doctor_ops(), as_json)
        return
    if not render.report_check(invocation().lab(lab).doctor(), as_json):
        sys.exit(1)


@main.group(context_settings=CONTEXT)
def scenario() -> None:
    """The classic multi-node traps, reproduced on a throwaway lab, diagnosed and fixed."""


@scenario.command("list", context_settings=CONTEXT)
def scenario_list() -> None:
    """The scenarios, what each teaches, and its time bound."""
    stdout_console().print(render.scenarios_table(SCENARIOS.values()))


@scenario.command("run", context_settings=CONTEXT)
@click.argument("names", nargs=-1, required=True, metavar="NAME... | all")
@click.option("--overlay", type=click.Choice(OVERLAYS), default=None,
              help="The network to meet the traps on: a mesh VPN (tailscale, wireguard) or the plain bridge "
                   "(none). Default: each scenario's own (`scenario list`); one that cannot be met on the "
                   "network asked for is refused.")
@json_option("Print the outcomes as a JSON list.")
def scenario_run(names, overlay, as_json) -> None:
    """Reproduce each trap on a fresh 2-node lab (scn-NAME; scn-NAME-OVERLAY on an --overlay other than
    its own), show torch's symptom and how long it took to show, doctor's diagnosis, then the fix and
    a run that succeeds. The lab is removed at the end. Exit status 0 when every fix worked within
    its bound."""
    chosen = select_scenarios(names)
    show = None if as_json else (lambda outcome: render.print_scenario(outcome, SCENARIOS[outcome.name].title))
    outcomes = invocation().here().scenarios(chosen, show, overlay=overlay)
    if as_json:
        render.emit_json([{**asdict(o), "ok": o.ok} for o in outcomes])
    if not all(o.ok for o in outcomes):
        sys.exit(1)
