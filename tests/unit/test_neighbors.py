"""Settled neighbour tables (labctl.net.neighbors): each node's MAC fixed by its IP, in the Compose
file, and a permanent entry per peer."""

from __future__ import annotations

from pathlib import Path

from labctl.net.neighbors import build_neighbors
from labctl.spec.addresses import node_ip, node_mac
from labctl.spec.labspec import LabSpec


def test_node_mac_is_docker_2010s_scheme_for_the_address():
    assert node_mac("172.28.1.46") == "02:42:ac:1c:01:2e"  # what Docker 20.10 itself gave that node
    assert node_mac("10.0.0.255") == "02:42:0a:00:00:ff"


def test_build_neighbors_gives_every_peer_and_not_the_node_itself():
    addresses = {f"node{i}": node_ip("172.28.5.0/24", i) for i in range(3)}
    commands = build_neighbors(addresses, "node1", "eth0")
    assert [c.argv for c in commands] == [
        ("ip", "neigh", "replace", "172.28.5.10", "lladdr", "02:42:ac:1c:05:0a", "dev", "eth0", "nud", "permanent"),
        ("ip", "neigh", "replace", "172.28.5.12", "lladdr", "02:42:ac:1c:05:0c", "dev", "eth0", "nud", "permanent"),
    ]
    assert not any(c.may_fail for c in commands)
    assert build_neighbors({"node0": "172.28.5.10"}, "node0", "eth0") == []


def test_compose_pins_each_nodes_mac_to_its_address():
    from labctl.lab.compose import ComposePlan, build_compose, load_template

    config = LabSpec(nodes=64)
    plan = ComposePlan(subnet="172.28.1.0/24", workspace=Path("/w"), user="0:0")
    services = build_compose(config, plan, load_template())["services"]
    macs = {name: s["mac_address"] for name, s in services.items()}
    assert macs == {name: node_mac(s["networks"]["lab"]["ipv4_address"]) for name, s in services.items()}
    assert len(set(macs.values())) == 64
