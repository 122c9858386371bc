"""Links between groups of nodes (`labctl shape --node A,B --to C,D`): per-destination classes on one
qdisc at the root of each sending node's interface. Pure: builds argv lists and parses tc's text;
apply.py runs them.

A node with such links carries an htb at its root (https://man7.org/linux/man-pages/man8/tc-htb.8.html):

    htb 1: [default 1]
      class 1:1   the rest of the node's link, as `shape` without --to left it (its rate, or
                  UNSHAPED_LINE_BPS when it had only netem), its queue 10: under it (netem, or a
                  bfifo of tbf's depth). No `default` when the rest is unshaped: htb sends what no
                  filter claims straight out.
      class 1:2…  one per group of destinations with its own link, its queue 20:, 30:… under each
      u32 filters `match ip dst ADDR/32`, one per destination, each to its class

Each class is a rate of its own (rate = ceil, no parent to borrow from): what node0 sends to node2
no longer shares a bucket with what it sends to node1, as a node's two NIC ports would not. So one
class per sending node models each node's uplink to the other group, not one trunk they all share
(that needs a router between the groups). Filters match IPv4 destinations: the lab's bridge network.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from labctl.net.tc import (
    UNSHAPED_LINE_BPS,
    Command,
    LinkState,
    RouteState,
    Shape,
    build_apply,
    build_clear,
    HTB_R2Q,
    build_ingress,
    htb_class,
    netem_args,
    parse_link_state,
    queue_bytes,
)
from trainer.tclinks import parse_classes, ring_hops  # the trainer reads the same classes for its step model

REST_CLASS = "1:1"
_PARENT_RE = re.compile(r"\bparent (\S+)")
_FLOWID_RE = re.compile(r"\bflowid (\S+)")
_MATCH_RE = re.compile(r"\bmatch ([0-9a-f]{8})/ffffffff at 16\b")


@dataclass(frozen=True)
class Route:
    """A link to some destinations: what this node sends to `dsts` (IPv4 addresses) goes through `shape`."""

    dsts: tuple[str, ...]
    shape: Shape


def _cmd(*argv: str) -> Command:
    return Command(tuple(argv))


def class_id(index: int) -> str:
    """The class of the index-th route (1:2, 1:3, …; tc reads the minor in hex)."""
    return f"1:{index + 2:x}"


def _shaped_class(dev: str, classid: str, shape: Shape) -> list[Command]:
    """The class at the shape's rate (UNSHAPED_LINE_BPS where it has none) and its queue under it:
    netem where the shape has a delay or loss, else a bfifo as deep as tbf's queue at that rate
    (tc.queue_bytes; htb's default, a pfifo of the interface's 1000 packets, would hold 120 ms and
    more of a 100mbit class)."""
    rate = shape.rate_bps or UNSHAPED_LINE_BPS
    handle = f"{int(classid.split(':')[1], 16) * 16:x}:"  # 1:1 -> 10:, 1:2 -> 20:, 1:a -> a0:
    leaf = netem_args(shape) if shape.needs_netem else ["bfifo", "limit", str(queue_bytes(rate))]
    return [htb_class(dev, "1:", classid, rate),
            _cmd("tc", "qdisc", "add", "dev", dev, "parent", classid, "handle", handle, *leaf)]


def build_routed_egress(rest: Shape | None, routes: list[Route], dev: str = "eth0") -> list[Command]:
    """The htb that gives each route its own class (the module's docstring); `rest` is what every
    other destination gets (None: unshaped). Run after the root qdisc was deleted."""
    commands = [_cmd("tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "r2q", str(HTB_R2Q),
                     *(["default", "1"] if rest else []))]
    if rest:
        commands += _shaped_class(dev, REST_CLASS, rest)
    for index, route in enumerate(routes):
        classid = class_id(index)
        commands += _shaped_class(dev, classid, route.shape)
        commands += [_cmd("tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                          "match", "ip", "dst", f"{dst}/32", "flowid", classid) for dst in route.dsts]
    return commands


def build_node(rest: Shape | None, routes: list[Route], iface: str = "eth0", ifb: str = "ifb0") -> list[Command]:
    """A node's whole link, cleared first: `rest` (None: unshaped) for every destination but the
    routes', which get their own classes; without routes, tc.build_apply's tbf (over netem, or
    tc.small_first's htb) or netem alone."""
    if not routes:
        return build_apply(rest, iface, ifb) if rest else build_clear(iface, ifb)
    ingress = build_ingress(rest, iface, ifb) if rest and rest.ingress else []
    return build_clear(iface, ifb) + build_routed_egress(rest, routes, iface) + ingress


def merge_routes(routes: list[Route], dsts: tuple[str, ...], shape: Shape | None) -> list[Route]:
    """`routes` with `dsts` taken out of every one (a route left with none is dropped) and, unless
    `shape` is None (a clear), one route for `dsts` added: the newer request wins."""
    kept = [replace(r, dsts=tuple(d for d in r.dsts if d not in dsts)) for r in routes]
    kept = [r for r in kept if r.dsts]
    return kept + ([Route(tuple(dsts), shape)] if shape is not None else [])


def shape_of(state: LinkState) -> Shape | None:
    """A link read back as the Shape that makes it again (None: unshaped), so a node's other links
    survive a change to one of them."""
    if state.rate_bps is None and not (state.delay_us or state.loss_pct):
        return None
    return Shape(state.rate_bps, state.delay_us or 0, state.jitter_us or 0, state.loss_pct or 0.0, state.ingress)


def routes_of(state: LinkState) -> list[Route]:
    return [Route(r.dsts, shape_of(r.state) or Shape(UNSHAPED_LINE_BPS)) for r in state.routes]


@dataclass(frozen=True)
class Hop:
    """One hop of a ring: what `sender` sends to `receiver` meets `rate_bps` (None: unshaped) and `delay_us`."""

    sender: str
    receiver: str
    rate_bps: int | None
    delay_us: int


def shaping_of(state: LinkState) -> dict:
    """A node's link read back as the trainer's step model reads its own (trainer.tclinks.read_shaping):
    {"egress", "ingress", "routes": {ip: ...}}, each side's rate_bps and delay_s where it has them."""
    def side(link: LinkState) -> dict:
        return {"rate_bps": link.rate_bps, "delay_s": (link.delay_us or 0) / 1e6}

    shaping = {"egress": side(state)}
    if state.ingress and state.inbound is not None:
        shaping["ingress"] = side(state.inbound)
    if state.routes:
        shaping["routes"] = {ip: side(route.state) for route in state.routes for ip in route.dsts}
    return shaping


# Which way gloo's rings turn (gloo/allreduce.cc, gloo/allgather.cc): all-reduce sends to rank r-1 and
# receives from r+1; all-gather sends to r+1. Measured on a 4-node lab: node1 -> node0 at 100mbit
# slowed a 16 MiB all-reduce to 2.1 s, node0 -> node1 left it at 39 ms (docs/explanation/cost-model.md).
RING_STEP = {"all_reduce": -1, "reduce_scatter": -1, "all_gather": 1}


def lab_ring(links: dict[str, LinkState], addresses: dict[str, str], steps: tuple[int, ...] = (-1,)) -> list[Hop]:
    """The rings' hops, the nodes in the order of `links` (node-rank order): each node sends to the
    one each of `steps` away (RING_STEP: -1 for gloo's all-reduce), priced as the trainer prices its own ring
    (trainer.tclinks.ring_hops): its route to the receiver's address where it has one, else the
    rest of its link; the slower of that and the receiver's shaped ingress. `addresses`: node name -> IP."""
    names = list(links)
    hops = ring_hops(names, {name: shaping_of(links[name]) for name in names}, addresses, steps)
    return [Hop(names[h["sender"]], names[h["receiver"]], int(h["rate_bps"]) if h["rate_bps"] else None,
                round(h["delay_s"] * 1e6)) for h in hops]


# ------------------------------------------------------------------------------- reading back

def is_routed(qdisc_text: str) -> bool:
    return any(line.startswith("qdisc htb 1: root") for line in qdisc_text.splitlines())


def _ip(hex_value: str) -> str:
    return ".".join(str(int(hex_value[i:i + 2], 16)) for i in (0, 2, 4, 6))


def _filters(filter_text: str) -> dict[str, list[str]]:
    """class id -> the destinations its u32 filters send there, from `tc filter show dev IF`."""
    by_class, flowid = {}, None
    for line in filter_text.splitlines():
        if (found := _FLOWID_RE.search(line)):
            flowid = found.group(1)
        elif flowid and (match := _MATCH_RE.search(line)):
            by_class.setdefault(flowid, []).append(_ip(match.group(1)))
            flowid = None
    return by_class


def parse_routed_link(qdisc_text: str, class_text: str, filter_text: str, ingress_text: str = "") -> LinkState:
    """A node's link under build_routed_egress's htb, from `tc qdisc show`, `tc class show` and `tc filter
    show` of its interface (tc prints no JSON for htb's classes): the rest of the link (class 1:1,
    when it is the default) and each route, with the netem under each class."""
    rates = {classid: round(values["rate_bps"]) for classid, values in parse_classes(class_text).items()}
    netem_by_class = {}
    for line in qdisc_text.splitlines():
        if line.startswith("qdisc netem") and (parent := _PARENT_RE.search(line)):
            netem_by_class[parent.group(1)] = line
    ingress_lines = "\n".join(line for line in qdisc_text.splitlines() if line.startswith("qdisc ingress"))

    def state_of(classid: str, extra: str = "") -> LinkState:
        netem = netem_by_class.get(classid, "")
        base = parse_link_state("\n".join(filter(None, (netem, extra))), ingress_text if extra else "")
        rate = rates.get(classid)
        rate = None if rate == UNSHAPED_LINE_BPS else rate  # only netem on that link
        kind = "+".join(filter(None, ("htb" if rate else "", "netem" if netem else ""))) or "none"
        return replace(base, kind=kind, rate_bps=rate)

    has_default = bool(re.search(r"\bdefault (0x)?1\b", qdisc_text))
    rest = state_of(REST_CLASS, ingress_lines) if has_default else parse_link_state(ingress_lines, ingress_text)
    routes = tuple(RouteState(tuple(dsts), state_of(classid)) for classid, dsts in sorted(_filters(filter_text).items(), key=lambda item: int(item[0].split(':')[1], 16)))
    return replace(rest, routes=routes)
