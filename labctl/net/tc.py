"""tc commands for a node's link, and the link's state read back from tc. Pure: builds argv lists
and parses text; apply.py runs them.

Egress: a tbf at the root shapes the rate (https://man7.org/linux/man-pages/man8/tc-tbf.8.html);
delay, jitter and loss hang under it as a netem child (https://man7.org/linux/man-pages/man8/tc-netem.8.html).
Ingress: the interface's ingress traffic is redirected to an ifb device and shaped on its egress,
the only way to shape what arrives (tc can police ingress but not queue it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from labctl.errors import ConfigError, LabError
from labctl.units import format_rate

NETEM_MISSING_MESSAGE = (
    "this kernel has no netem qdisc (module sch_netem), so --delay, --jitter and --loss cannot be applied; "
    "nothing was changed. Rate shaping (--bw, with --ingress) works without it."
)
PROBE_DEV = "ddplab-probe"
TBF_LATENCY = "100ms"  # how long a packet may wait in the bucket before tbf drops it


@dataclass(frozen=True)
class Shape:
    rate_bps: int
    delay_us: int = 0
    jitter_us: int = 0
    loss_pct: float = 0.0
    ingress: bool = False

    @property
    def needs_netem(self) -> bool:
        return bool(self.delay_us or self.jitter_us or self.loss_pct)

    def validate(self) -> "Shape":
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
    """tbf's bucket: what the link carries in 8 ms (two ticks of a 250 Hz kernel, which refills the
    bucket once per tick: a smaller bucket caps the rate below the one asked for), and at least
    128 KiB so a couple of 64 KiB TSO/GSO segments fit (a bucket smaller than a segment stalls)."""
    return max(131072, rate_bps // 8 // 125)


def build_clear(iface: str, ifb: str = "ifb0") -> list[Command]:
    return [
        _cmd("tc", "qdisc", "del", "dev", iface, "root", may_fail=True),
        _cmd("tc", "qdisc", "del", "dev", iface, "ingress", may_fail=True),
        _cmd("ip", "link", "del", ifb, may_fail=True),
    ]


def _egress(shape: Shape, dev: str) -> list[Command]:
    commands = [_cmd("tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate", format_rate(shape.rate_bps),
                     "burst", str(burst_bytes(shape.rate_bps)), "latency", TBF_LATENCY)]
    if shape.needs_netem:
        netem = ["tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem"]
        if shape.delay_us:
            netem += ["delay", f"{shape.delay_us}us"] + ([f"{shape.jitter_us}us"] if shape.jitter_us else [])
        if shape.loss_pct:
            netem += ["loss", f"{shape.loss_pct:g}%"]
        commands.append(_cmd(*netem))
    return commands


def build_apply(shape: Shape, iface: str = "eth0", ifb: str = "ifb0") -> list[Command]:
    """Clear first (so applying twice replaces, never stacks), then shape egress, then ingress."""
    commands = build_clear(iface, ifb) + _egress(shape, iface)
    if shape.ingress:
        commands += [
            _cmd("ip", "link", "add", ifb, "type", "ifb"),
            _cmd("ip", "link", "set", ifb, "up"),
            _cmd("tc", "qdisc", "add", "dev", iface, "handle", "ffff:", "ingress"),
            _cmd("tc", "filter", "add", "dev", iface, "parent", "ffff:", "protocol", "all", "u32", "match", "u32", "0", "0",
                 "action", "mirred", "egress", "redirect", "dev", ifb),
        ] + _egress(shape, ifb)
    return commands


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
_TIME_UNITS = {"us": 1, "ms": 1_000, "s": 1_000_000}
_QDISC_RE = re.compile(r"^qdisc (\S+) (\S+)(.*)$")
_RATE_RE = re.compile(r"\brate (\d+(?:\.\d+)?)([KMG]?bit)\b", re.IGNORECASE)
_DELAY_RE = re.compile(r"\bdelay (\d+(?:\.\d+)?)(us|ms|s)(?:\s+(\d+(?:\.\d+)?)(us|ms|s))?")
_LOSS_RE = re.compile(r"\bloss (\d+(?:\.\d+)?)%")


@dataclass(frozen=True)
class LinkState:
    """What `tc qdisc show dev IF` says is applied now."""

    kind: str  # "none", "tbf", "tbf+netem", "netem" or "other:<qdisc>"
    rate_bps: int | None = None
    delay_us: int | None = None
    jitter_us: int | None = None
    loss_pct: float | None = None
    ingress: bool = False


def _time_us(number: str, unit: str) -> int:
    return round(float(number) * _TIME_UNITS[unit])


def parse_link_state(qdisc_text: str, ingress_rate_text: str = "") -> LinkState:
    """Parse the plain-text output of `tc qdisc show dev IF` (stable across iproute2 releases;
    `tc -j` prints no JSON for some qdiscs and classes). `ingress_rate_text` is the same output for
    the ifb device, when there is one."""
    kinds, rate_bps, delay_us, jitter_us, loss_pct, ingress = [], None, None, None, None, False
    for line in qdisc_text.splitlines():
        match = _QDISC_RE.match(line.strip())
        if not match:
            continue
        kind, rest = match.group(1), match.group(3)
        if kind == "ingress":
            ingress = True
        elif kind in ("tbf", "htb"):
            kinds.append(kind)
            rate = _RATE_RE.search(rest)
            if rate:
                rate_bps = round(float(rate.group(1)) * _RATE_UNITS[rate.group(2).lower()])
        elif kind == "netem":
            kinds.append(kind)
            delay = _DELAY_RE.search(rest)
            if delay:
                delay_us = _time_us(delay.group(1), delay.group(2))
                jitter_us = _time_us(delay.group(3), delay.group(4)) if delay.group(3) else 0
            loss = _LOSS_RE.search(rest)
            loss_pct = float(loss.group(1)) if loss else 0.0
        elif " root " in f" {match.group(2)} {rest} " and kind not in ("noqueue", "pfifo_fast", "mq", "fq_codel", "pfifo"):
            kinds.append(f"other:{kind}")
    shaped_ingress = ingress and bool(_RATE_RE.search(ingress_rate_text))
    return LinkState(kind="+".join(kinds) or "none", rate_bps=rate_bps, delay_us=delay_us, jitter_us=jitter_us,
                     loss_pct=loss_pct, ingress=shaped_ingress)


def describe(state: LinkState) -> str:
    """A table cell: 'unshaped', '100mbit', '100mbit in+out +10ms±2ms 1% loss'."""
    if state.kind == "none":
        return "unshaped"
    parts = [format_rate(state.rate_bps) if state.rate_bps else state.kind]
    if state.ingress:
        parts[0] += " in+out"
    if state.delay_us:
        parts.append(f"+{state.delay_us / 1000:g}ms" + (f"±{state.jitter_us / 1000:g}ms" if state.jitter_us else ""))
    if state.loss_pct:
        parts.append(f"{state.loss_pct:g}% loss")
    return " ".join(parts)


def parse_shape(bw: str, delay: str | None = None, jitter: str | None = None, loss: str | None = None,
                ingress: bool = False) -> Shape:
    """The shape the flags ask for, every value checked before anything is changed."""
    from labctl.units import parse_loss_pct, parse_rate, parse_time_us

    return Shape(
        rate_bps=parse_rate(bw, "--bw"),
        delay_us=parse_time_us(delay, "--delay") if delay is not None else 0,
        jitter_us=parse_time_us(jitter, "--jitter") if jitter is not None else 0,
        loss_pct=parse_loss_pct(loss, "--loss") if loss is not None else 0.0,
        ingress=ingress,
    ).validate()


def parse_shape_request(bw: str | None, delay: str | None = None, jitter: str | None = None, loss: str | None = None,
                        ingress: bool = False, *, clear: bool = False, show: bool = False) -> Shape | None:
    """`labctl shape`'s flags: exactly one of --bw, --clear and --show; the shape for --bw, else None."""
    modes = [name for name, on in (("--bw", bw is not None), ("--clear", clear), ("--show", show)) if on]
    if len(modes) != 1:
        raise LabError(f"give exactly one of --bw, --clear or --show (got {', '.join(modes) or 'none'})",
                       hint="labctl shape --bw 100mbit  |  labctl shape --clear  |  labctl shape --show")
    if bw is None and (delay or jitter or loss or ingress):
        raise LabError("--delay, --jitter, --loss and --ingress go with --bw", hint="labctl shape --bw 1gbit --delay 5ms")
    return parse_shape(bw, delay, jitter, loss, ingress) if bw is not None else None
