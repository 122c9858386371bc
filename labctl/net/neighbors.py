"""Settled neighbour tables: before any run, every node already knows every peer's MAC address.

Why. A run's first collective on N nodes opens a full mesh, N(N-1) connections at once, and each
node must first find every peer's MAC address by ARP: a broadcast, which the lab's bridge copies to
every other port. On a cluster a switch does that in hardware; here one kernel does it in software,
on a host that is also starting N Pythons. With 64 nodes that is some 4,000 requests and 250,000
copies in a second or two. The host's per-CPU backlog (net.core.netdev_max_backlog, 1000, a
host-wide setting no container can change) overflows, the requests and replies that are dropped
leave addresses FAILED after their 3 tries, and gloo's connect ends in "No route to host" (64 nodes
failed so, twice, within two minutes; /proc/net/softnet_stat counted hundreds of thousands of
drops). Resolving every address once at `up` did not help: the next run failed the same way, and a
node's table, left idle, soon held 2 of its 63 peers (unused entries age out).

So labctl resolves nothing at run time. Each node's MAC address is fixed by its IP
(labctl.spec.addresses.node_mac, set in the Compose file), and at `up` every node gets a permanent entry
for every peer (`ip neigh replace ... nud permanent`), from a helper with NET_ADMIN in its
namespace, as shaping does; a healed partition gets its entries back (labctl.net.faults). No ARP
remains on the lab's links, at any size.
"""

from __future__ import annotations

from labctl.net.tc import Command
from labctl.spec.addresses import node_mac


def build_neighbors(addresses: dict[str, str], node: str, iface: str) -> list[Command]:
    """The commands that give `node` a permanent entry for each of its peers (`addresses`: node name
    to IP, the node itself included or not)."""
    return [Command(("ip", "neigh", "replace", ip, "lladdr", node_mac(ip), "dev", iface, "nud", "permanent"))
            for peer, ip in addresses.items() if peer != node]
