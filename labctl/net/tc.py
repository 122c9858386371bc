"""tc commands for a node's link, and the link's state read back from tc. Pure: builds argv lists
and parses text; apply.py runs them.

Egress: a tbf at the root shapes the rate (https://man7.org/linux/man-pages/man8/tc-tbf.8.html);
delay, jitter and loss hang under it as a netem child
(https://man7.org/linux/man-pages/man8/tc-netem.8.html), and without them an htb child sends short
packets first (small_first). Without a rate, netem itself is the root qdisc. Jitter is netem's
default distribution, uniform (each packet's delay drawn from delay ± jitter; packets overtaken by a
less delayed one arrive reordered): no `distribution normal`, whose table file not every image
ships and which a training link's tail does not follow any better.
Ingress: the interface's ingress traffic is redirected to an ifb device and shaped on its egress,
the only way to shape what arrives (tc can police ingress but not queue it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Mapping

from labctl.errors import ConfigError, LabError
from labctl.spec.units import (
    format_rate,
    parse_duration_s,
    parse_loss_pct,
    parse_rate,
    parse_time_us,
)

NETEM_MISSING_MESSAGE = (
    "this kernel has no netem qdisc (module sch_netem), so --delay, --jitter and --loss cannot be applied; "
    "nothing was changed. Rate shaping (--bw, with --ingress) works without it."
)
PROBE_DEV = "ddplab-probe"
# How long a packet may wait for tokens before tbf drops it: the queue holds 2 ms of the rate (plus the
# bucket), about what a switch port buffers. It was 100 ms, 12.5 MB at 1gbit: TCP filled it, and every
# small message on the link (gloo's notices that a receive is posted, a barrier) waited behind up to
# 100 ms of bulk data. gloo's all-gather waits on such notices between its steps: at 1gbit, from 4 to
# 16 MiB, it took 3.8 to 6.8 ms more than its bytes at the wire's rate; with 2 ms, 1.8 to 4.4 ms, and
# iperf3 still gets 956 Mbit/s through (docs/explanation/cost-model.md). A netem child (--delay,
# --loss) queues in netem instead (netem_limit), which this does not change. A link to a group of
# nodes (`shape --to`, labctl.net.routes) queues the same, in a bfifo under its class (queue_bytes).
QUEUE_MS = 2
TBF_LATENCY = f"{QUEUE_MS}ms"
# Under a tbf without netem, packets shorter than this (their IP length) leave before the bulk queued
# ahead of them: TCP's ACKs, gloo's notices that a receive is posted, a barrier's few bytes. A Linux
# host's default qdisc, fq_codel, does that for every sparse flow; this kernel has no fq_codel, sfq or
# prio (only tbf, htb and fifos), so an htb under tbf with two classes, the first for short packets,
# does it (small_first). gloo's ring all-gather waits on those notices between steps: at 1gbit, with
# calls back to back, a 2 MiB one took 12.8 ms behind one queue, 11.9 to 12.0 ms with this
# (docs/explanation/cost-model.md: a shaped link's queue).
SHORT_PACKET_BYTES = 128
HTB_R2Q = 10  # htb's default; htb_class sets each class's quantum so that it never warns one is "big"
NETEM_DEFAULT_LIMIT = 1000  # packets: netem's own default (tc-netem(8), `limit`)
UNSHAPED_LINE_BPS = 10 * 10**9  # what a veth pair carries, roughly, when no tbf paces it
MTU_BYTES = 1500


@dataclass(frozen=True)
class Shape:
    """What to apply to a link. `rate_bps` None: no rate limit (netem alone)."""

    rate_bps: int | None = None
    delay_us: int = 0
    jitter_us: int = 0
    loss_pct: float = 0.0
    ingress: bool = False

    @property
    def needs_netem(self) -> bool:
        return bool(self.delay_us or self.jitter_us or self.loss_pct)

    def validate(self) -> "Shape":
        if self.rate_bps is None and not self.needs_netem:
            raise LabError("nothing to shape: give a rate, a delay or a loss" + (" (--ingress says where, not what)"
                           if self.ingress else ""), hint="labctl shape --bw 100mbit  |  labctl shape --delay 10ms")
        if self.jitter_us and not self.delay_us:
            raise ConfigError("--jitter", f"{self.jitter_us}us", "needs --delay", hint="jitter varies the delay: give --delay too")
        if self.jitter_us > self.delay_us:
            raise ConfigError("--jitter", f"{self.jitter_us}us", f"must not exceed --delay ({self.delay_us}us)",
                              hint="a jitter larger than the delay would ask for negative delays")
        return self


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    may_fail: bool = False  # clean-up of something that may not exist


def _cmd(*argv: str, may_fail: bool = False) -> Command:
    return Command(tuple(argv), may_fail)


def burst_bytes(rate_bps: int) -> int:
    """tbf's bucket: what the link carries in 1 ms, and at least 128 KiB so a couple of 64 KiB
    TSO/GSO segments fit (a bucket smaller than a segment stalls). tbf counts its tokens in
    nanoseconds and wakes on a high-resolution timer, so the old rule of rate/HZ is not needed: at
    1gbit, iperf3 got 956 Mbit/s through a 128 KiB bucket and 958 through a 1 MB one (2026-11-24,
    alone and as a ring of three). A bucket is traffic that passes unshaped after every pause,
    so it is kept small: with 1 MB at 1gbit, a 1 MiB allreduce ran 8% faster than the link allows."""
    return max(131072, rate_bps // 8 // 1000)


def queue_bytes(rate_bps: int) -> int:
    """What a shaped link holds beyond what its tokens allow: QUEUE_MS of the rate, and the bucket, as
    tbf computes its limit from `latency` (tc-tbf(8): limit = rate x latency + burst)."""
    return rate_bps * QUEUE_MS // 8 // 1000 + burst_bytes(rate_bps)


def build_clear(iface: str, ifb: str = "ifb0") -> list[Command]:
    return [
        _cmd("tc", "qdisc", "del", "dev", iface, "root", may_fail=True),
        _cmd("tc", "qdisc", "del", "dev", iface, "ingress", may_fail=True),
        _cmd("ip", "link", "del", ifb, may_fail=True),
    ]


def netem_limit(shape: Shape) -> int:
    """netem's queue, in packets. netem holds every packet for its delay, so it holds rate x (delay +
    jitter) of traffic, and tail-drops what exceeds its limit (default 1000 packets: 1.2 ms of a
    10 Gbit/s flow), which TCP takes for congestion. The rate is the tbf's above netem, or, with
    none, a veth pair's 10 Gbit/s; counted in full 1500-byte packets (veth's GSO packets are larger,
    so fewer), twice over for the backlog that waits on tbf's tokens; never below netem's default.
    A limit only caps the queue: nothing is allocated for it."""
    rate_bps = shape.rate_bps or UNSHAPED_LINE_BPS
    held_s = (shape.delay_us + shape.jitter_us) / 1e6
    return max(NETEM_DEFAULT_LIMIT, math.ceil(2 * rate_bps * held_s / (8 * MTU_BYTES)))


def _percent(value: float) -> str:
    return f"{value:.6f}".rstrip("0").rstrip(".") + "%"  # never 1e-05%, which tc would refuse


def htb_class(dev: str, parent: str, classid: str, rate_bps: int, prio: str | None = None) -> Command:
    """An htb class of its own rate (ceil the same: nothing to borrow), with tbf's bucket at that rate
    (burst_bytes) and a quantum htb does not warn of; `prio` orders classes (0 first)."""
    burst = str(burst_bytes(rate_bps))
    quantum = str(min(200_000, max(1514, rate_bps // 8 // HTB_R2Q)))
    return _cmd("tc", "class", "add", "dev", dev, "parent", parent, "classid", classid, "htb", "rate",
                format_rate(rate_bps), "ceil", format_rate(rate_bps), "burst", burst, "cburst", burst, "quantum", quantum,
                *(["prio", prio] if prio is not None else []))


def small_first(dev: str, rate_bps: int) -> list[Command]:
    """tbf's child (handle 20:): an htb that never limits (UNSHAPED_LINE_BPS a class) with two
    classes, short packets (SHORT_PACKET_BYTES, matched on the IPv4 header's length) in 20:1, served
    first, everything else in 20:2 (the default); each holds tbf's own queue (queue_bytes) in a bfifo."""
    commands = [_cmd("tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "20:", "htb", "default", "2")]
    for minor, prio in (("1", "0"), ("2", "1")):
        commands += [htb_class(dev, "20:", f"20:{minor}", UNSHAPED_LINE_BPS, prio),
                     _cmd("tc", "qdisc", "add", "dev", dev, "parent", f"20:{minor}", "handle", f"2{minor}:", "bfifo",
                          "limit", str(queue_bytes(rate_bps)))]
    mask = f"0x{0xFFFF & ~(SHORT_PACKET_BYTES - 1):04x}"  # the length's bits at and above SHORT_PACKET_BYTES
    return commands + [_cmd("tc", "filter", "add", "dev", dev, "parent", "20:", "protocol", "ip", "prio", "1", "u32",
                            "match", "u16", "0", mask, "at", "2", "flowid", "20:1")]


def _egress(shape: Shape, dev: str) -> list[Command]:
    """tbf at the root with netem as its child (handle 10:), or without netem small_first's htb;
    without a rate, netem at the root."""
    commands = []
    if shape.rate_bps is not None:
        commands.append(_cmd("tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate",
                             format_rate(shape.rate_bps), "burst", str(burst_bytes(shape.rate_bps)), "latency", TBF_LATENCY))
        if not shape.needs_netem:
            commands += small_first(dev, shape.rate_bps)
    if shape.needs_netem:
        where = ["parent", "1:1"] if shape.rate_bps is not None else ["root"]
        commands.append(_cmd("tc", "qdisc", "add", "dev", dev, *where, "handle", "10:", *netem_args(shape)))
    return commands


def netem_args(shape: Shape) -> list[str]:
    """netem and its options, as `tc qdisc add ... handle H:` takes them."""
    netem = ["netem", "limit", str(netem_limit(shape))]
    if shape.delay_us:
        netem += ["delay", f"{shape.delay_us}us"] + ([f"{shape.jitter_us}us"] if shape.jitter_us else [])
    if shape.loss_pct:
        netem += ["loss", _percent(shape.loss_pct)]
    return netem


def build_apply(shape: Shape, iface: str = "eth0", ifb: str = "ifb0") -> list[Command]:
    """Clear first (so applying twice replaces, never stacks), then shape egress, then ingress."""
    return build_clear(iface, ifb) + _egress(shape, iface) + (build_ingress(shape, iface, ifb) if shape.ingress else [])


def build_ingress(shape: Shape, iface: str = "eth0", ifb: str = "ifb0") -> list[Command]:
    """What arrives on `iface`, redirected to `ifb` and shaped on its egress."""
    return [
        _cmd("ip", "link", "add", ifb, "type", "ifb"),
        _cmd("ip", "link", "set", ifb, "up"),
        _cmd("tc", "qdisc", "add", "dev", iface, "handle", "ffff:", "ingress"),
        _cmd("tc", "filter", "add", "dev", iface, "parent", "ffff:", "protocol", "all", "u32", "match", "u32", "0", "0",
             "action", "mirred", "egress", "redirect", "dev", ifb),
    ] + _egress(shape, ifb)


def build_undo(seconds: int, iface: str = "eth0", ifb: str = "ifb0") -> list[Command]:
    """--duration: what a helper container left running does: wait, then clear the link."""
    return [_cmd("sleep", str(seconds))] + build_clear(iface, ifb)


@dataclass(frozen=True)
class ShapePlan:
    """`shape --dry-run`: the commands run now in each node's namespace, and, with --duration, those
    a helper container left running runs `duration_s` later."""

    commands: list[Command]
    undo: list[Command] = field(default_factory=list)
    duration_s: int | None = None


def build_plan(shape: Shape | None, iface: str = "eth0", duration_s: int | None = None) -> ShapePlan:
    if shape is None:
        return ShapePlan(build_clear(iface))
    return ShapePlan(build_apply(shape, iface), build_undo(duration_s, iface) if duration_s else [], duration_s)


def build_netem_probe(dev: str = PROBE_DEV) -> list[Command]:
    """Succeeds only where netem exists, without touching the real interface (an ifb: `dummy`
    devices are not built on every kernel either)."""
    return [
        _cmd("ip", "link", "del", dev, may_fail=True),
        _cmd("ip", "link", "add", dev, "type", "ifb"),
        _cmd("tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "1ms"),
        _cmd("ip", "link", "del", dev, may_fail=True),
    ]


def netem_missing(output: str) -> bool:
    # tbf, ifb and mirred exist wherever labctl shapes at all, so an unknown qdisc here is netem.
    return "Specified qdisc kind is unknown" in output or 'Unknown qdisc "netem"' in output


# ------------------------------------------------------------------------------- reading back

_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_TIME_UNITS = {"ns": 0.001, "us": 1, "ms": 1_000, "s": 1_000_000}
_NUMBER = r"(\d+(?:\.\d+)?(?:e[+-]?\d+)?)"  # tc prints times with %.3g: 12.5ms, 1.23s, even 1e+03ms
_QDISC_RE = re.compile(r"^qdisc (\S+) (\S+)(.*)$")
_RATE_RE = re.compile(r"\brate (\d+(?:\.\d+)?)([KMG]?bit)\b", re.IGNORECASE)
_DELAY_RE = re.compile(rf"\bdelay {_NUMBER}(ns|us|ms|s)(?:\s+{_NUMBER}(ns|us|ms|s))?")
_LOSS_RE = re.compile(rf"\bloss {_NUMBER}%")
_SHAPED = ("tbf", "htb", "netem")


@dataclass(frozen=True)
class LinkState:
    """What `tc qdisc show dev IF` says is applied now: the egress, and in `inbound` what the ifb
    device that shapes the ingress carries (labctl applies the same shape both ways)."""

    kind: str  # "none", "tbf", "tbf+netem", "netem" or "other:<qdisc>"
    rate_bps: int | None = None
    delay_us: int | None = None
    jitter_us: int | None = None
    loss_pct: float | None = None
    ingress: bool = False  # the ingress is redirected to an ifb device that shapes it
    inbound: LinkState | None = None
    routes: tuple[RouteState, ...] = ()  # links of their own to some destinations (labctl.net.routes)

    @property
    def values(self) -> tuple:
        return self.rate_bps, self.delay_us or 0, self.jitter_us or 0, self.loss_pct or 0.0


@dataclass(frozen=True)
class RouteState:
    """A link to some destinations, read back: what the node sends to `dsts` (IPv4 addresses) meets `state`."""

    dsts: tuple[str, ...]
    state: LinkState


def _time_us(number: str, unit: str) -> int:
    return round(float(number) * _TIME_UNITS[unit])


def parse_link_state(qdisc_text: str, ingress_text: str = "") -> LinkState:
    """Parse the plain-text output of `tc qdisc show dev IF` (stable across iproute2 releases;
    `tc -j` prints no JSON for some qdiscs and classes): tbf at the root with a netem child, or
    netem alone at the root. `ingress_text` is the same output for the ifb device, when there is one."""
    kinds, rate_bps, delay_us, jitter_us, loss_pct, ingress = [], None, None, None, None, False
    for line in qdisc_text.splitlines():
        match = _QDISC_RE.match(line.strip())
        if not match:
            continue
        kind, rest = match.group(1), match.group(3)
        if kind == "ingress":
            ingress = True
        elif kind == "htb" and " parent 1:1 " in f" {rest} ":
            continue  # tbf's child that sends short packets first (small_first): not a shaper
        elif kind in ("tbf", "htb"):
            kinds.append(kind)
            rate = _RATE_RE.search(rest)
            if rate:
                rate_bps = round(float(rate.group(1)) * _RATE_UNITS[rate.group(2).lower()])
        elif kind == "netem":
            kinds.append(kind)
            delay = _DELAY_RE.search(rest)
            delay_us = _time_us(delay.group(1), delay.group(2)) if delay else 0
            jitter_us = _time_us(delay.group(3), delay.group(4)) if delay and delay.group(3) else 0
            loss = _LOSS_RE.search(rest)
            loss_pct = float(loss.group(1)) if loss else 0.0
        elif " root " in f" {match.group(2)} {rest} " and kind not in ("noqueue", "pfifo_fast", "mq", "fq_codel", "pfifo"):
            kinds.append(f"other:{kind}")
    inbound = parse_link_state(ingress_text) if ingress and ingress_text else None
    shaped_ingress = inbound is not None and any(k in _SHAPED for k in inbound.kind.split("+"))
    return LinkState(kind="+".join(kinds) or "none", rate_bps=rate_bps, delay_us=delay_us, jitter_us=jitter_us,
                     loss_pct=loss_pct, ingress=shaped_ingress, inbound=inbound if shaped_ingress else None)


def _describe_one(state: LinkState) -> list[str]:
    parts = [format_rate(state.rate_bps)] if state.rate_bps else []
    if state.kind != "none" and not parts and not any(k in _SHAPED for k in state.kind.split("+")):
        parts.append(state.kind)  # someone else's qdisc: name it
    if state.delay_us:
        parts.append(f"+{state.delay_us / 1000:g}ms" + (f"±{state.jitter_us / 1000:g}ms" if state.jitter_us else ""))
    if state.loss_pct:
        parts.append(f"{state.loss_pct:g}% loss")
    return parts


def describe_link(state: LinkState, names: Mapping[str, str] | None = None) -> str:
    """A table cell: 'unshaped', '100mbit', '100mbit in+out +10ms±2ms 1% loss', '+10ms 1% loss'; an
    ingress that differs from the egress is named apart: '100mbit (in: 50mbit +5ms)'; links to some
    destinations follow, each named by `names` (address -> node) where it knows them:
    '1gbit; to node2,node3: 100mbit +5ms'."""
    routes = [f"to {','.join((names or {}).get(d, d) for d in r.dsts)}: {_describe_whole(r.state)}" for r in state.routes]
    return "; ".join([_describe_whole(state), *routes])


def _describe_whole(state: LinkState) -> str:
    if state.kind == "none" and not state.ingress:
        return "unshaped"
    parts = _describe_one(state) or ["unshaped"]
    if state.ingress and state.inbound is not None and state.inbound.values != state.values:
        return " ".join(parts) + f" (in: {' '.join(_describe_one(state.inbound)) or 'unshaped'})"
    if state.ingress:
        parts[0:1] = [f"{parts[0]} in+out"] if state.rate_bps else ["in+out", parts[0]]
    return " ".join(parts)


def parse_shape(bw: str | None = None, delay: str | None = None, jitter: str | None = None, loss: str | None = None,
                ingress: bool = False) -> Shape:
    """The shape the flags ask for, every value checked before anything is changed; no --bw: no rate limit."""
    return Shape(
        rate_bps=parse_rate(bw, "--bw") if bw is not None else None,
        delay_us=parse_time_us(delay, "--delay") if delay is not None else 0,
        jitter_us=parse_time_us(jitter, "--jitter") if jitter is not None else 0,
        loss_pct=parse_loss_pct(loss, "--loss") if loss is not None else 0.0,
        ingress=ingress,
    ).validate()


def parse_shape_request(bw: str | None, delay: str | None = None, jitter: str | None = None, loss: str | None = None,
                        ingress: bool = False, *, clear: bool = False, show: bool = False,
                        duration: str | None = None) -> Shape | None:
    """`labctl shape`'s flags: exactly one of a shape (any of --bw, --delay, --jitter, --loss),
    --clear and --show; the shape, else None. --ingress and --duration go with a shape (check_to
    says what goes with --to)."""
    given = [flag for flag, value in (("--bw", bw), ("--delay", delay), ("--jitter", jitter), ("--loss", loss))
             if value is not None]
    modes = ([f"a shape ({', '.join(given)})"] if given else []) + [flag for flag, on in (("--clear", clear),
                                                                                       ("--show", show)) if on]
    if len(modes) != 1:
        alone = "--ingress says where to shape, not what: " if ingress and not modes else ""
        raise LabError(f"{alone}give exactly one of a shape (--bw, --delay, --jitter, --loss), --clear or --show "
                       f"(got {' and '.join(modes) or 'none'})",
                       hint="labctl shape --bw 100mbit  |  labctl shape --delay 10ms  |  labctl shape --clear  |  "
                            "labctl shape --show")
    if not given and (ingress or duration is not None):
        raise LabError(f"{'--ingress' if ingress else '--duration'} goes with a shape, not with {modes[0]}",
                       hint="labctl shape --bw 100mbit --ingress --duration 30s")
    if duration is not None:
        parse_duration_s(duration)
    return parse_shape(bw, delay, jitter, loss, ingress) if given else None


def check_to(show: bool, ingress: bool, duration: str | None) -> None:
    """--to goes with a shape or --clear, and with neither --ingress nor --duration."""
    if show:
        raise LabError("--show lists every link, those between groups too: drop --to", hint="labctl shape --show")
    if ingress:
        raise LabError("--to shapes what the --node nodes send to the --to nodes, so --ingress has no place beside it",
                       hint="shape the way back too: labctl shape --node node2,node3 --to node0,node1 --bw 100mbit")
    if duration is not None:
        raise LabError(f"--duration {duration} goes with a shape of whole links, not with --to: links between groups "
                       "stay until cleared", hint="labctl shape --node node0,node1 --to node2,node3 --clear")
