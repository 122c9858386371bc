"""A lab's addresses on its bridge: each node's IP and MAC, how many nodes a subnet holds, and the
free /24 that `up` picks where the subnet is `auto` (labctl.lab.up)."""

from __future__ import annotations

import ipaddress

from labctl.errors import ConfigError
from labctl.spec.labspec import LabSpec, shown_key, shown_source
from labctl.spec.parsers import AUTO

NODE_IP_OFFSET = 10  # node i gets the subnet's address number 10 + i; .1 is Docker's gateway


def node_ip(subnet: str, index: int) -> str:
    net = ipaddress.ip_network(subnet)
    return str(net.network_address + NODE_IP_OFFSET + index)


def node_mac(ip: str) -> str:
    """A node's MAC address, fixed by its IP (02:42 and the address's four bytes, the scheme Docker
    20.10 itself uses): set in the Compose file, so a node keeps it when recreated and every peer's
    permanent neighbour entry stays right (labctl.net.neighbors)."""
    return "02:42:" + ":".join(f"{byte:02x}" for byte in ipaddress.ip_address(ip).packed)


def subnet_capacity(subnet: str) -> int:
    """How many nodes fit: addresses after the offset, less the broadcast address."""
    net = ipaddress.ip_network(subnet)
    return max(0, net.num_addresses - NODE_IP_OFFSET - 1)


def check_fits(config: LabSpec, subnet: str) -> None:
    capacity = subnet_capacity(subnet)
    if config.nodes > capacity:
        raise ConfigError(
            shown_key(config, "subnet"), subnet, f"holds at most {capacity} nodes, {config.nodes} asked",
            shown_source(config, "subnet"), hint="use a larger subnet (e.g. a /24) or fewer nodes",
        )


# The pool `auto` picks /24s from: 172.28.0.0/14 stays clear of Docker's default bridge
# (172.17.0.0/16) and of the 172.18-172.27 ranges Docker hands to networks without a subnet.
AUTO_POOL = "172.28.0.0/14"


def overlaps(subnet: str, used: list[str]) -> list[str]:
    net = ipaddress.ip_network(subnet)
    others = [(u, ipaddress.ip_network(u, strict=False)) for u in used]
    return [u for u, other in others if other.version == net.version and net.overlaps(other)]


def pick_free_subnet(used: list[str], pool: str = AUTO_POOL, prefix: int = 24) -> str:
    for candidate in ipaddress.ip_network(pool).subnets(new_prefix=prefix):
        if not overlaps(str(candidate), used):
            return str(candidate)
    raise ConfigError("DDPLAB_SUBNET", AUTO, f"no free /{prefix} left in {pool}", hint="set DDPLAB_SUBNET to a free range")
