"""What a mesh VPN's tunnel costs a collective (`labctl cost --overlay`): its bytes, and its CPU.

Bytes: a full TCP segment through a tunnel of MTU M carries M - 52 bytes of the job's (20 of IPv4,
20 of TCP, 12 of timestamps), and goes over the wire as M + 60 (WireGuard's IPv4, UDP and its own
32 bytes around it), plus the 38 every Ethernet frame costs (header, FCS, preamble, gap). Without
a tunnel a 1500-byte packet carries 1448 of 1538. So the tunnel leaves a link 94.7% of its payload
rate at Tailscale's MTU of 1280, 95.7% at WireGuard's 1420 (payload_share).

CPU: in user space, on shared cores, the tunnel's encryption is the ceiling long before a gigabit
link is (docs/how-to/mesh-vpn.md: 168 to 211 Mbit/s a hop through the lab's tunnels, unshaped or
at 1gbit). `labctl bench allreduce` on a lab with an overlay measures it (iperf3 through the tunnel
from every node to the next at once) and keeps it with the lab (TUNNEL_RATE_FILE); `labctl cost`
on that lab prices the lab's own link with it, and `--tunnel-rate` gives one by hand (Tailscale's
tuned path: 7 to 13 Gbit/s on server CPUs).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

from labctl.core.outfile import write_text
from labctl.errors import ConfigError, LabError
from labctl.net.overlay import NONE, OVERLAYS, Overlay
from labctl.session import LabSession
from labctl.spec.units import parse_rate
from trainer.stepmodel import Link

TCP_HEADERS = 52  # IPv4 20, TCP 20, timestamps 12: what a segment spends of its MTU on headers
TUNNEL_BYTES = 60  # IPv4 20, UDP 8, WireGuard's 16-byte header and 16-byte tag around each packet
ETHERNET_BYTES = 38  # header 14, FCS 4, preamble 8, inter-frame gap 12
PLAIN_MTU = 1500
TUNNEL_RATE_FILE = "tunnel-rate.json"  # in .lab/<lab>/: the bench's measurement of the tunnel's ceiling


def payload_share(mtu: int, tunnel: bool) -> float:
    """Of what a full-size packet costs on the wire, the share that is the job's bytes."""
    return (mtu - TCP_HEADERS) / (mtu + (TUNNEL_BYTES if tunnel else 0) + ETHERNET_BYTES)


@dataclass(frozen=True)
class Tunnel:
    """A mesh VPN's tunnel as the cost model prices it: its overlay (the MTU), and the ceiling its
    encryption puts on a hop's payload rate, where known (bits/s; `ceiling_from` says where from)."""

    overlay: Overlay
    ceiling_bps: float | None = None
    ceiling_from: str = ""

    @property
    def share(self) -> float:
        """The tunnel's payload rate over a plain link's, on the same wire."""
        return payload_share(self.overlay.mtu, True) / payload_share(PLAIN_MTU, False)

    def through(self, link: Link, efficiency: float, ceiling: bool) -> Link:
        """`link` with the tunnel on it: its rate less the tunnel's bytes, and where `ceiling`, no more
        than the tunnel's ceiling once the stack's `efficiency` is taken (the ceiling is a payload rate
        already, as iperf3 saw it)."""
        rate = link.rate_bps * self.share
        if ceiling and self.ceiling_bps:
            rate = min(rate, self.ceiling_bps / efficiency)
        return replace(link, rate_bps=rate, name=f"{link.name} over {self.overlay.iface}")


def save_rate(directory: Path, overlay: Overlay, ring_bps: float) -> None:
    """The bench's measurement of the tunnel's ceiling, kept with the lab for `labctl cost`."""
    record = {"kind": overlay.kind, "iface": overlay.iface, "mtu": overlay.mtu, "ring_bps": ring_bps,
              "measured": time.strftime("%Y-%m-%d %H:%M", time.localtime())}
    write_text(directory / TUNNEL_RATE_FILE, json.dumps(record) + "\n")


def measured_rate(directory: Path, overlay: Overlay) -> tuple[float, str] | None:
    """(bits/s, when) of the lab's last tunnel measurement at this overlay's kind and MTU; None where
    there is none, or it was of another tunnel."""
    try:
        record = json.loads((directory / TUNNEL_RATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if record.get("kind") != overlay.kind or record.get("mtu") != overlay.mtu:
        return None
    return float(record["ring_bps"]), str(record.get("measured", ""))


BY_HAND = "--tunnel-rate"  # a Tunnel's ceiling_from when the user gave it


def tunnel_of(overlay: str | None, tunnel_rate: str | None, lab: LabSession | None) -> Tunnel | None:
    """The tunnel to price: `overlay`'s (--overlay), else a running lab's own (None for `none`, or a lab
    without one), its ceiling `tunnel_rate` (--tunnel-rate) or the lab's last measurement of that
    tunnel (bench allreduce)."""
    mesh = OVERLAYS[overlay] if overlay not in (None, NONE) else None
    if overlay is None and lab is not None:
        try:
            mesh = lab.overlay_spec()
        except LabError:
            mesh = None
    if mesh is None:
        if tunnel_rate is not None:
            raise ConfigError("--tunnel-rate", tunnel_rate, "prices a tunnel, and there is none here",
                              hint="add --overlay tailscale (or wireguard), or ask on a lab brought up with one")
        return None
    if tunnel_rate is not None:
        return Tunnel(mesh, float(parse_rate(tunnel_rate, "--tunnel-rate")), BY_HAND)
    measured = measured_rate(lab.directory, mesh) if lab is not None else None
    return Tunnel(mesh, measured[0], f"labctl bench allreduce on lab {lab.name}, {measured[1]}") if measured else Tunnel(mesh)


def tunnel_notes(tunnel: Tunnel | None) -> tuple[str, ...]:
    """What the rows took of the tunnel, in words."""
    if tunnel is None:
        return ()
    mesh = tunnel.overlay
    notes = [f"over {mesh.iface} (MTU {mesh.mtu}): {tunnel.share:.1%} of a link's payload rate, the rest is the tunnel's "
             f"{TUNNEL_BYTES} bytes a packet"]
    if tunnel.ceiling_bps:
        where = "every link" if tunnel.ceiling_from == BY_HAND else "the lab's own link (its cores, not a real machine's)"
        notes.append(f"the tunnel's own ceiling, {tunnel.ceiling_bps / 1e6:.0f} Mbit/s a hop ({tunnel.ceiling_from}), "
                     f"on {where}")
    else:
        notes.append("no ceiling for the tunnel's encryption: `labctl bench allreduce` on a lab with this overlay "
                     "measures one, --tunnel-rate gives one")
    return tuple(notes)
