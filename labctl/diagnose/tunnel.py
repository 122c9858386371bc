"""doctor's check of a lab's tunnel (`up --overlay`): what size of packet it carries between each
pair of nodes, against the MTU each node's tunnel has.

A tunnel's MTU promises what its packets may hold; each is sent again, encrypted, in a UDP packet
60 bytes larger (IPv4), over whatever path lies under the tunnel. Where that path carries less and
drops the ICMP "fragmentation needed" that would say so, a full-size packet vanishes without a
word: TCP's handshake and small messages pass, every segment filled to the MTU is lost and sent
again until the job's timeout. Collectives of a few hundred bytes work and large ones stall, which
reads as a deadlock. The probe (labctl/remote/mtu_probe.py) sends every peer, over the tunnel,
packets from 576 bytes up to the sender's MTU with the don't-fragment bit set, and each receiver
says which arrived.
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

from labctl import remote
from labctl.core.proc import last_json_line
from labctl.diagnose.findings import Finding

PROBE_PORTS = (40000, 59999)  # UDP, drawn at random as the reachability probe's TCP port is
# Sizes to try (whole IP packets), kept below each sender's MTU, which is tried as well. Steps of 16
# where tunnels' MTUs live: WireGuard pads what it encrypts to a multiple of 16.
LADDER = (576, 1024, 1200, *range(1216, 1504, 16), 1500, 2048, 4096, 8192, 9000)
SEND_AT = (0.2, 0.45, 0.7)  # three rounds: the peers' probes start a little apart; a lost packet is lost thrice
WINDOW_S = 1.1
SCRIPT = remote.load("mtu_probe.py")


def probe_config(node: str, iface: str, port: int, targets: dict[str, str]) -> dict:
    """What node's probe gets: its name, the tunnel, and each peer's address on it."""
    return {"name": node, "iface": iface, "port": port, "targets": [[n, ip] for n, ip in targets.items() if n != node],
            "sizes": list(LADDER), "send_at": list(SEND_AT), "window_s": WINDOW_S}


def tunnel_address(node_info: dict, iface: str) -> str | None:
    """A node's first address on `iface`, from doctor's node info (node_info.py); None without one."""
    addrs = (node_info.get("ifaces") or {}).get(iface) or []
    return addrs[0].split("/")[0] if addrs else None


def tunnel_addresses(info: dict[str, dict], iface: str) -> dict[str, str]:
    """Each node's first address on `iface`; nodes without one left out."""
    found = {node: tunnel_address(i, iface) for node, i in info.items()}
    return {node: address for node, address in found.items() if address}


def probe_mtu(nodes, info: dict[str, dict], iface: str) -> dict[str, dict]:
    """Every node's probe at once over `iface`: {node: its report}. `nodes` is a run.executor.Nodes."""
    targets = tunnel_addresses(info, iface)
    port = random.randint(*PROBE_PORTS)

    def one(node: str) -> dict:
        _, output = nodes.run(node, ["python", "-c", SCRIPT, json.dumps(probe_config(node, iface, port, targets))])
        report = last_json_line(output)
        return report if report is not None else {"error": output.strip()[-200:]}

    with ThreadPoolExecutor(max_workers=16) as pool:
        return dict(zip(targets, pool.map(one, list(targets))))


def lost_pairs(reports: dict[str, dict]) -> list[tuple[str, str, int, int | None]]:
    """(sender, receiver, the smallest size lost, the largest that arrived) for each pair where a
    packet the sender's MTU allows never arrived; None where nothing arrived. A probe that did not
    run neither sent nor heard anything: its pairs are not judged."""
    out = []
    for sender, mine in reports.items():
        for receiver, theirs in reports.items():
            if receiver == sender or "error" in mine or "error" in theirs:
                continue
            got = set((theirs.get("received") or {}).get(sender, []))
            lost = [s for s in mine["sent"] if s not in got]
            if lost:
                out.append((sender, receiver, min(lost), max(got) if got else None))
    return out


def check_mtu(reports: dict[str, dict], iface: str) -> list[Finding]:
    """One finding per node whose packets through the tunnel vanish above a size, naming its MTU and
    the largest size that arrived; one for a node whose probe could not run; else that all passed."""
    out = [Finding("mtu", node, False, f"the MTU probe could not run on {node}: {r['error']}", "run doctor again")
           for node, r in reports.items() if "error" in r]
    by_sender: dict[str, list] = {}
    for sender, receiver, lost, arrived in lost_pairs(reports):
        by_sender.setdefault(sender, []).append((receiver, lost, arrived))
    for sender, pairs in by_sender.items():
        mtu = reports[sender]["mtu"]
        nothing = [r for r, _, arrived in pairs if arrived is None]
        if nothing:
            out.append(Finding("mtu", sender, False, f"nothing {sender} sent through {iface} reached "
                               f"{', '.join(nothing)}: the tunnel between them is down",
                               f"`labctl up --overlay ...` again; `docker logs` of {sender}'s overlay helper says why"))
        sized = [(r, lost, arrived) for r, lost, arrived in pairs if arrived is not None]
        if sized:
            largest = min(arrived for _, _, arrived in sized)
            lost = min(lost for _, lost, _ in sized)
            out.append(Finding("mtu", sender, False,
                               f"packets of {lost} bytes and more that {sender} sends through {iface} never reach "
                               f"{', '.join(r for r, _, _ in sized)} ({largest} bytes do), but {iface}'s MTU on "
                               f"{sender} is {mtu}: the path under the tunnel carries less and drops the ICMP that "
                               "would say so. TCP fills its segments to the MTU: small collectives pass, large ones "
                               "stall",
                               f"an MTU of {largest} or less on {iface}, on every node (`ip link set {iface} mtu "
                               f"{largest}`); Tailscale uses 1280 for this reason"))
    if not out:
        mtus = sorted({r["mtu"] for r in reports.values()})
        n = len(reports)
        out.append(Finding("mtu", "all", True, f"packets of the full MTU ({', '.join(map(str, mtus))}) pass through "
                           f"{iface} between all {n * (n - 1)} node pairs"))
    return out
