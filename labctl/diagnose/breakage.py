"""What the traps change on the machine, before a broken run (traps.py's `prepare`) and back before
the fixed one (`repair`): a firewall, a path that carries less than the tunnel needs, a package
installed by hand, a CPU limit. Each acts on the scenario's running lab (a Context) from the lab's
helper containers or the engine, never from the nodes themselves.
"""

from __future__ import annotations

import io
import re
import tarfile
from dataclasses import dataclass, field

from labctl.engine.docker import apply_node_cpus
from labctl.engine.labels import container_name
from labctl.errors import LabError
from labctl.net.apply import run_on_nodes
from labctl.net.overlay import Overlay
from labctl.net.tc import Command

# The path under node1's tunnel in the mtu-blackhole trap carries IP packets of this many bytes at
# most, as a second tunnel or a mobile link on the way does: WireGuard at its default MTU of 1420
# sends packets of 1480 (60 bytes of IPv4, UDP and its own header around each), Tailscale's 1280
# fits with room to spare.
PATH_BYTES = 1400
SAFE_MTU = 1280  # the fix: Tailscale's MTU, IPv6's minimum (labctl.net.overlay)


@dataclass
class Context:
    """A scenario's running lab, as its traps see it."""

    client: object
    lab: str
    nodes: list  # NodeState
    iface: str
    overlay: Overlay | None = None  # the lab's mesh VPN, for the traps that need one (Scenario.overlays)
    run_id: str = ""
    notes: dict = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]


def run_everywhere(ctx: Context, what: str, commands) -> None:
    """`commands(node)` on each node from its helper; the first failure stops the scenario, saying `what`."""
    for node, code, output in run_on_nodes(ctx.client, ctx.lab, ctx.names, commands):
        if code != 0:
            raise LabError(f"could not {what} on {node}: {output.strip()}")


def drop_class(iface: str) -> list[Command]:
    """An htb root on `iface` with a class whose queue holds nothing (pfifo limit 0): what a filter
    sends there is dropped. This kernel has neither tc's action modules (`action drop`) nor the prio
    qdisc, so dropping is built from htb classification alone; everything else goes to 1:10."""
    return [
        Command(("tc", "qdisc", "add", "dev", iface, "root", "handle", "1:", "htb", "default", "10")),
        Command(("tc", "class", "add", "dev", iface, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit")),
        Command(("tc", "class", "add", "dev", iface, "parent", "1:", "classid", "1:30", "htb", "rate", "1mbit")),
        Command(("tc", "qdisc", "add", "dev", iface, "parent", "1:30", "handle", "30:", "pfifo", "limit", "0")),
    ]


def drop_off(ctx: Context) -> None:
    undo = [Command(("tc", "qdisc", "del", "dev", ctx.iface, "root"), True)]
    run_on_nodes(ctx.client, ctx.lab, ctx.names, lambda _node: undo)


def firewall_commands(iface: str, allowed_port: int | None) -> list[Command]:
    """New TCP connections to any port but `allowed_port` (None: to any port at all) are dropped:
    with 29500 allowed, rendezvous works and every back-connect times out. A TCP SYN (SYN set, ACK
    clear: byte 33 of an option-less IPv4 packet) goes to the drop class, unless it is for the
    allowed port. UDP passes: a mesh VPN's tunnel, whose packets ride `iface`, stays open."""
    u32 = ("protocol", "ip", "u32", "match", "ip", "protocol", "6", "0xff")
    allow = [] if allowed_port is None else [
        Command(("tc", "filter", "add", "dev", iface, "parent", "1:", "prio", "1", *u32,
                 "match", "ip", "dport", str(allowed_port), "0xffff", "flowid", "1:10"))]
    return [*drop_class(iface), *allow,
            Command(("tc", "filter", "add", "dev", iface, "parent", "1:", "prio", "2", *u32,
                     "match", "u8", "0x02", "0x12", "at", "33", "flowid", "1:30"))]


def firewall_on(ctx: Context) -> None:
    run_everywhere(ctx, "set up the firewall", lambda _node: firewall_commands(ctx.iface, 29500))


def tunnel_only(ctx: Context) -> None:
    """On a lab with a mesh VPN, the nodes reach each other through it alone, as machines in two homes
    do: no TCP connection on the bridge. Without an overlay, nothing changes."""
    if ctx.overlay:
        run_everywhere(ctx, "close the bridge", lambda _node: firewall_commands(ctx.iface, None))


def prefix_blocks(low: int, high: int, bits: int = 16) -> list[tuple[int, int]]:
    """[low, high] as (value, mask) pairs, each a block of 2^k numbers that a u32 match can name."""
    blocks, top = [], (1 << bits) - 1
    while low <= high:
        size = low & -low if low else 1 << bits
        while size > high - low + 1:
            size //= 2
        blocks.append((low, top & ~(size - 1)))
        low += size
    return blocks


def path_limit_commands(iface: str, limit: int) -> list[Command]:
    """Every IP packet larger than `limit` bytes leaving on `iface` is dropped, and nothing says so:
    a path with a smaller MTU whose ICMP "fragmentation needed" never comes back. The IPv4 total
    length (bytes 2-3 of the header) above `limit`, in blocks u32 can match."""
    return [*drop_class(iface), *(
        Command(("tc", "filter", "add", "dev", iface, "parent", "1:", "prio", "1", "protocol", "ip", "u32",
                 "match", "u16", f"0x{value:04x}", f"0x{mask:04x}", "at", "2", "flowid", "1:30"))
        for value, mask in prefix_blocks(limit + 1, 0xFFFF))]


def limit_path_last(ctx: Context) -> None:
    """The last node's path carries PATH_BYTES: its tunnel's full-size packets vanish on the way out."""
    last = ctx.names[-1]
    limit = path_limit_commands(ctx.iface, PATH_BYTES)
    run_everywhere(ctx, "limit the path", lambda node: limit if node == last else [])


def tunnel_mtu_down(ctx: Context) -> None:
    """The fix of the mtu-blackhole trap: every node's tunnel at SAFE_MTU (the path stays as it is)."""
    iface = ctx.overlay.iface
    lower = [Command(("ip", "link", "set", iface, "mtu", str(SAFE_MTU)))]
    run_everywhere(ctx, f"set {iface}'s MTU", lambda _node: lower)


def drift_last(ctx: Context) -> None:
    """Someone ran `pip install` on one node: the last node gets another version of a package, from the
    wheel the runner fetched (ctx.notes["drift"]), into its own container, as root."""
    wheel = ctx.notes["drift"]
    node = container_name(ctx.lab, ctx.names[-1])
    container = ctx.client.containers.get(node)
    container.put_archive("/tmp", tar_of(wheel))
    code, output = container.exec_run(["python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                                       f"/tmp/{wheel.name}"], user="0:0")
    if code != 0:
        raise LabError(f"could not install {wheel.name} on {ctx.names[-1]}: {output.decode(errors='replace')[-300:]}")


def tar_of(path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(path, arcname=path.name)
    return buffer.getvalue()


def slow_last(ctx: Context) -> None:
    # A CPU limit is a quota per 100 ms CFS period: a step must want more CPU than that (the
    # straggler's 32 sequences a rank: about 60 ms) or, on a loaded machine where steps take 100 ms
    # and more anyway, it fits in one period's quota and the node is not slowed (docs/how-to/failed-run.md).
    apply_node_cpus(ctx.client, ctx.lab, ctx.names[-1], 0.25)


def unslow_last(ctx: Context) -> None:
    apply_node_cpus(ctx.client, ctx.lab, ctx.names[-1], None)


WAITED_RE = re.compile(r"waited ([0-9.]+) s")


def still_waiting(broken: str, fixed: str) -> bool:
    """The straggler is still there when the others still wait for it: at least a quarter of what they
    waited in the broken run. Two unlimited nodes sharing a busy machine's cores can still differ by the
    1.2x that makes the trainer name a straggler, but they no longer wait for each other: in the broken
    run the others waited 2.31 s over 11 steps, in a fixed run on the same busy machine a tenth of that."""
    before, after = WAITED_RE.search(broken), WAITED_RE.search(fixed)
    return not (before and after) or float(after.group(1)) > float(before.group(1)) / 4
