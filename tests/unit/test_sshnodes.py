"""`up --ssh` as data: what the Compose document gives each node, the host key lines the nodes log,
and the inventory that describes them as hosts."""

from pathlib import Path

import pytest

from labctl.engine.labels import LABEL_SSH
from labctl.hosts.inventory import Host, parse_inventory
from labctl.hosts.labnodes import build_known_hosts, build_lab_inventory, parse_hostkey_line
from labctl.lab.compose import SSH_KEY_VAR, ComposePlan, build_compose, load_template
from labctl.spec.labspec import LabSpec

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBG2siVDAK8A8hMDNxin6RVnLg2W9JIgSzoAF1RTghCl ddplab-demo"


def services(ssh_public_key):
    plan = ComposePlan(subnet="172.28.5.0/24", workspace=Path("/ws"), user="1000:1000", ssh_public_key=ssh_public_key)
    return build_compose(LabSpec(lab="demo", nodes=2), plan, load_template())["services"]


def test_ssh_nodes_carry_the_labs_public_key_and_a_label_and_nothing_else_changes():
    with_ssh, without = services(KEY), services(None)
    for name in ("node0", "node1"):
        assert with_ssh[name]["environment"][SSH_KEY_VAR] == KEY and with_ssh[name]["labels"][LABEL_SSH] == "true"
        assert SSH_KEY_VAR not in without[name]["environment"] and LABEL_SSH not in without[name]["labels"]
        rest = {k: v for k, v in with_ssh[name].items() if k not in ("environment", "labels")}
        assert rest == {k: v for k, v in without[name].items() if k not in ("environment", "labels")}
        # No capability, no published port: the host reaches the node on the lab's bridge.
        assert "cap_add" not in with_ssh[name] and "ports" not in with_ssh[name]


def test_host_key_lines_as_the_entry_point_prints_them():
    assert parse_hostkey_line("DDPLAB_SSH_HOSTKEY user=root ssh-ed25519 AAAAC3Nz") == ("root", "ssh-ed25519 AAAAC3Nz")
    for bad in ("DDPLAB_READY torch=2.13.0", "DDPLAB_SSH_HOSTKEY ssh-ed25519 AAAA", "DDPLAB_SSH_HOSTKEY user=x k"):
        with pytest.raises(ValueError):
            parse_hostkey_line(bad)


def test_known_hosts_name_port_22_hosts_by_bare_address():
    assert build_known_hosts({"172.28.0.10": "ssh-ed25519 AAAA", "172.28.0.11": "ssh-ed25519 BBBB"}) == (
        "172.28.0.10 ssh-ed25519 AAAA\n172.28.0.11 ssh-ed25519 BBBB\n")


def test_the_lab_inventory_describes_the_nodes_as_plain_hosts(tmp_path):
    config = LabSpec(lab="demo", nodes=2, nproc_per_node=2, master_port=29600)
    text = build_lab_inventory(config, [("node0", "172.28.5.10"), ("node1", "172.28.5.11")], "root", threads=1)
    inv = parse_inventory(text, tmp_path / "hosts.toml")
    assert inv.name == "demo" and inv.master_port == 29600
    assert inv.hosts[1] == Host(name="node1", address="172.28.5.11", iface="eth0", user="root", port=22,
                                identity_file=tmp_path / "ssh" / "id_ed25519", known_hosts=tmp_path / "ssh" / "known_hosts",
                                nproc_per_node=2, python="/opt/venv/bin/python", workspace="ddplab-workspace",
                                env={"OMP_NUM_THREADS": "1", "PYTHONPATH": "/opt/ddplab"})
