"""The network and the nodes' health: shape, slow, fault."""

from __future__ import annotations

import click

from labctl.api.inputs import check_to, parse_shape_request
from labctl.cli.app import CONTEXT, invocation, main
from labctl.cli.lazy import render
from labctl.cli.options import dry_run_option, json_option, lab_option
from labctl.core.ui import info
from labctl.errors import LabError
from labctl.spec.labspec import parse_cpu_limit


@main.command(context_settings=CONTEXT)
@lab_option
@click.option("--node", "node_names", multiple=True, metavar="NAME", help="Node to shape (repeatable, or comma-separated); "
              "default every node (with --to, every other node).")
@click.option("--to", "to_names", multiple=True, metavar="NAME",
              help="Shape only what the --node nodes send to these (repeatable, or comma-separated): links between "
                   "groups of nodes, such as racks joined by a slower spine; the rest of each link stays as it was.")
@click.option("--bw", metavar="RATE", help="Link rate in tc's bit units: 100mbit, 1gbit (not mbps: that is bytes).")
@click.option("--delay", metavar="TIME", help="Added one-way delay, e.g. 10ms (needs netem); with or without --bw.")
@click.option("--jitter", metavar="TIME", help="Variation of the delay, uniform within ±TIME, e.g. 2ms (needs --delay).")
@click.option("--loss", metavar="PCT", help="Random packet loss in percent, e.g. 1 (needs netem).")
@click.option("--ingress", is_flag=True, help="Also shape incoming traffic (through an ifb device).")
@click.option("--duration", metavar="T", help="Undo the shape after T (30s, 2m, 1h): a helper container left "
              "running clears the link then; `labctl down`, or a later shape or --clear of the node, cancels it.")
@click.option("--clear", is_flag=True, help="Remove all shaping from the nodes (and any pending --duration undo); "
              "with --to, only their links to those nodes.")
@click.option("--show", is_flag=True, help="Show each node's shaping as the kernel reports it.")
@json_option("With --show: print JSON.")
@dry_run_option("Print the exact tc commands per node (no netem needed); change nothing.")
def shape(lab, node_names, to_names, bw, delay, jitter, loss, ingress, duration, clear, show, as_json, dry_run) -> None:
    """Shape the links of the lab's nodes (egress by default): rate, delay, jitter and loss, any
    of them; clear them, or show them. Applying replaces what the node had, but for its links to
    groups of nodes (--to), which stay until cleared.

    \b
    Examples:
      labctl shape --bw 1gbit                    # every node at 1 Gbit/s
      labctl shape --node node2 --bw 100mbit     # one slow node drags the ring
      labctl shape --node node0,node1 --to node2,node3 --bw 100mbit   # two racks, a slower spine (one way)
      labctl shape --delay 10ms --jitter 2ms     # latency alone (needs the kernel's netem)
      labctl shape --bw 100mbit --loss 1 --ingress
      labctl shape --delay 50ms --duration 30s   # back to unshaped after 30 s
      labctl shape --show
    """
    nodes, to = split_names(node_names), split_names(to_names)
    if to:
        check_to(show, ingress, duration)
    wanted = parse_shape_request(bw, delay, jitter, loss, ingress, clear=clear, show=show, duration=duration)
    the_lab = invocation().lab(lab)
    names = {ip: name for name, ip in the_lab.addresses().items()}
    if show:
        render.print_links(the_lab.name, the_lab.links(the_lab.targets(nodes)), as_json, names=names)
    elif dry_run:
        render.print_tc_plan(the_lab.shape_plans(wanted, duration, nodes, to))
    elif wanted:
        links = the_lab.shape(wanted, nodes=nodes, duration=duration, to=to)
        render.print_links(the_lab.name, links, until=duration, names=names)
    else:
        render.print_links(the_lab.name, the_lab.clear_shape(nodes, to=to), names=names)


def split_names(given: tuple[str, ...]) -> list[str]:
    """--node node0,node1 --node node2: node0, node1, node2."""
    return [name.strip() for item in given for name in item.split(",") if name.strip()]


@main.command(context_settings=CONTEXT)
@lab_option
@click.argument("node")
@click.option("--cpus", metavar="C", help="New CPU limit for the node, e.g. 0.25.")
@click.option("--clear", is_flag=True, help="Lift the node's CPU limit.")
def slow(lab, node, cpus, clear) -> None:
    """Make NODE a straggler (or stop it being one) while the lab runs: its CPU limit changes in
    place, no restart, so a run in progress feels it at once.

    \b
    Examples:
      labctl slow node2 --cpus 0.25
      labctl slow node2 --clear
    """
    if (cpus is None) == (not clear):
        raise LabError("give exactly one of --cpus C or --clear", hint="labctl slow node2 --cpus 0.25")
    limit = parse_cpu_limit(cpus, "--cpus", hint="use --clear to lift the limit") if cpus is not None else None
    applied = invocation().lab(lab).slow(node, limit)
    info(f"{node}: CPU limit now {f'{applied:g} CPUs' if applied else 'none'} (read back from the engine)")


@main.command(context_settings=CONTEXT)
@lab_option
@click.argument("fault", type=click.Choice(["kill", "crash", "pause", "unpause", "partition", "heal"]))
@click.argument("node")
def fault(lab, fault, node) -> None:
    """Inject a fault into NODE: kill (node loss), crash (its training processes die, the node
    stays), pause / unpause (freeze it), partition / heal (cut its link, restore it).

    \b
    Examples:
      labctl fault crash node1        # torchrun --max-restarts brings the workers back
      labctl fault kill node2         # with --nnodes 2:3 the run goes on without it
      labctl fault partition node1 && sleep 5 && labctl fault heal node1
    """
    info(invocation().lab(lab).fault(fault, node))
