"""What Linux traffic control says about this node's links, for the step model (trainer/calibrate.py):
each rank reads its own node's tc, and the ring's hops are priced from every node's answer.

A node's link is what `labctl shape` leaves, or anything shaped the same way by hand:
- a tbf at the root (its rate and burst) with netem under it (its delay), or netem alone;
- an ifb device: what the node receives, shaped on the ifb's egress;
- an htb at the root with a class per group of destinations (`labctl shape --to`): u32 filters
  send each destination address to its class, class 1:1 (htb's default) is the rest of the link.

tc prints no JSON for htb's classes, so those come from `tc class show`'s text; the qdiscs and
filters come as JSON.
"""

from __future__ import annotations

import json
import re
import subprocess

_CLASS_RE = re.compile(r"^class htb (\S+) .*?\brate (\d+(?:\.\d+)?)([KMG]?)bit\b.*?\bburst (\d+(?:\.\d+)?)([KMG]?)b\b")
_SCALE = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}  # rates: 50Mbit
_BYTES = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}  # sizes: tc prints a 131072-byte burst as 128Kb
REST_CLASS = "1:1"


def _tc(run, *args: str):
    """tc's stdout, or None where tc is missing or fails."""
    try:
        out = run(["tc", *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def read_shaping(run=subprocess.run) -> dict:
    """This node's links: {"egress": {...}, "ingress": {...}, "routes": {ip: {...}}}, each with rate_bps
    and burst_bytes (the slowest shaper's) and delay_s (netem's); {} where tc is missing or says nothing."""
    try:
        qdiscs = json.loads(_tc(run, "-j", "qdisc", "show") or "[]")
    except ValueError:
        return {}
    classes, filters = {}, {}
    for dev in {q.get("dev") for q in qdiscs if q.get("kind") == "htb" and q.get("root")}:
        classes[dev] = parse_classes(_tc(run, "class", "show", "dev", dev) or "")
        try:
            filters[dev] = json.loads(_tc(run, "-j", "filter", "show", "dev", dev) or "[]")
        except ValueError:
            filters[dev] = []
    return parse_qdiscs(qdiscs, classes, filters)


def parse_classes(text: str) -> dict[str, dict]:
    """htb's classes from `tc class show`: class id -> {"rate_bps", "burst_bytes"}."""
    found = {}
    for match in map(_CLASS_RE.match, text.splitlines()):
        if match:
            found[match.group(1)] = {"rate_bps": float(match.group(2)) * _SCALE[match.group(3)],
                                     "burst_bytes": float(match.group(4)) * _BYTES[match.group(5)]}
    return found


def destinations(filters: list[dict]) -> dict[str, str]:
    """Destination address -> class id, from `tc -j filter show`'s u32 matches on the IPv4 destination."""
    found = {}
    for f in filters:
        options = f.get("options") or {}
        match = options.get("match") or {}
        if options.get("flowid") and match.get("off") == 16 and match.get("mask") == "ffffffff":
            value = match.get("value", "")
            found[".".join(str(int(value[i:i + 2], 16)) for i in (0, 2, 4, 6))] = options["flowid"]
    return found


def _slower(side: dict, rate_bps: float, burst_bytes: float) -> None:
    if rate_bps < side.get("rate_bps", float("inf")):
        side.update(rate_bps=rate_bps, burst_bytes=burst_bytes)


def parse_qdiscs(qdiscs: list[dict], classes: dict[str, dict] | None = None,
                 filters: dict[str, list[dict]] | None = None) -> dict:
    """read_shaping's answer from tc's JSON qdiscs (each with "dev", "kind", "options", "parent"), and
    for each device with an htb at its root, its classes (parse_classes) and filters (JSON)."""
    shaping, routes, classes, filters = {}, {}, classes or {}, filters or {}
    routed = {dev: destinations(filters.get(dev, [])) for dev in classes}
    for q in qdiscs:
        dev, options, parent = q.get("dev", ""), q.get("options") or {}, q.get("parent", "")
        if dev == "lo":
            continue
        side = shaping.setdefault("ingress" if dev.startswith("ifb") else "egress", {})
        if dev in routed and parent and parent != REST_CLASS:  # a route's netem: priced with the route below
            continue
        if q.get("kind") == "tbf" and options.get("rate"):
            _slower(side, float(options["rate"]) * 8, float(options.get("burst", 0)))  # tc's JSON: bytes a second
        elif q.get("kind") == "htb" and str(options.get("default", "")) in ("0x1", "1") and REST_CLASS in classes.get(dev, {}):
            _slower(side, classes[dev][REST_CLASS]["rate_bps"], classes[dev][REST_CLASS]["burst_bytes"])
        elif q.get("kind") == "netem":
            side["delay_s"] = side.get("delay_s", 0.0) + _delay(q)
    for dev, by_ip in routed.items():
        for ip, classid in by_ip.items():
            route = dict(classes[dev].get(classid, {}))
            route["delay_s"] = sum(_delay(q) for q in qdiscs if q.get("dev") == dev and q.get("parent") == classid)
            routes[ip] = route
    shaping = {side: values for side, values in shaping.items() if values}
    return {**shaping, "routes": routes} if routes else shaping


def _delay(q: dict) -> float:
    delay = (q.get("options") or {}).get("delay") if q.get("kind") == "netem" else None
    return float(delay.get("delay", 0)) if isinstance(delay, dict) else 0.0


def ring_steps(strategy: str, backend: str) -> tuple[int, ...]:
    """Which way the run's rings turn: gloo's all-reduce sends to rank r-1 (gloo/allreduce.cc), its
    all-gather to r+1 (fsdp's gathers); NCCL picks its own ring order, so both ways are priced."""
    return (-1,) if backend == "gloo" and strategy in ("ddp", "zero") else (-1, 1)


def ring_hops(hosts: list[str], shaping: dict[str, dict], ips: dict[str, str] | None = None,
              steps: tuple[int, ...] = (-1,)) -> list[dict]:
    """The ring's hops between nodes (rank r sends to r + step, for each of `steps`): each hop's sender
    (r) and receiver (its rank), rate, burst and delay from the sender's route to the receiver's
    address (`ips`: host -> address) or else its egress, and the receiver's ingress (rate None: none
    of them is shaped). The one pricing of a ring's hops: labctl reads its lab's links into the same
    `shaping` (labctl.net.routes.shaping_of) and asks this."""
    hops = []
    for step in steps:
        for r, host in enumerate(hosts):
            peer = hosts[(r + step) % len(hosts)]
            if peer == host:
                continue
            mine = shaping.get(host, {})
            out = mine.get("routes", {}).get((ips or {}).get(peer, ""), mine.get("egress", {}))
            into = shaping.get(peer, {}).get("ingress", {})
            sides = [s for s in (out, into) if s.get("rate_bps")]
            slowest = min(sides, key=lambda s: s["rate_bps"]) if sides else {}
            hops.append({"sender": r, "receiver": (r + step) % len(hosts), "rate_bps": slowest.get("rate_bps"), "burst_bytes": slowest.get("burst_bytes", 0.0),
                         "delay_s": out.get("delay_s", 0.0) + into.get("delay_s", 0.0)})
    return hops
