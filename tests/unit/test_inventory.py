"""The inventory: parsed into typed hosts, or refused with the file, the key, the value and the rule."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labctl.errors import LabError
from labctl.hosts.inventory import Host, parse_inventory, render_inventory

PATH = Path("/home/me/cluster.toml")

TWO_HOSTS = """
name = "cluster"
master_port = 29600

[defaults]
user = "me"
iface = "tailscale0"
venv = "~/venvs/torch"
env = { OMP_NUM_THREADS = "4" }

[[hosts]]
name = "workstation"
address = "100.101.1.5"
nproc_per_node = 2
identity_file = "keys/id_ed25519"
env = { NCCL_DEBUG = "INFO" }

[[hosts]]
address = "laptop.tail1234.ts.net"
iface = "wlan0"
port = 2222
python = "/usr/bin/python3"
workspace = "~/ddp"
known_hosts = "/etc/ssh/ssh_known_hosts"
"""


def test_a_two_host_inventory_parses_into_typed_hosts_with_defaults_applied():
    inv = parse_inventory(TWO_HOSTS, PATH)
    assert inv.name == "cluster" and inv.master_port == 29600 and inv.names == ["workstation", "node1"]
    assert inv.hosts[0] == Host(name="workstation", address="100.101.1.5", iface="tailscale0", user="me", port=22,
                                identity_file=Path("/home/me/keys/id_ed25519"), nproc_per_node=2,
                                python="~/venvs/torch/bin/python", workspace="ddplab-workspace",
                                env={"OMP_NUM_THREADS": "4", "NCCL_DEBUG": "INFO"})
    laptop = inv.hosts[1]
    # A host's own python replaces the default venv; the workspace is relative to the user's home.
    assert (laptop.iface, laptop.port, laptop.python, laptop.workspace) == ("wlan0", 2222, "/usr/bin/python3", "ddp")
    assert laptop.known_hosts == Path("/etc/ssh/ssh_known_hosts") and laptop.identity_file is None
    assert laptop.destination == "me@laptop.tail1234.ts.net:2222"


def test_env_files_follow_the_inventory_order_interfaces_and_process_counts():
    inv = parse_inventory(TWO_HOSTS, PATH)
    files = inv.env_files()
    assert list(files) == ["workstation", "node1"]
    assert "MASTER_ADDR=100.101.1.5\n" in files["node1"] and "PET_RDZV_ENDPOINT=100.101.1.5:29600\n" in files["node1"]
    assert "GLOO_SOCKET_IFNAME=wlan0\n" in files["node1"] and "NPROC_PER_NODE=1\n" in files["node1"]
    assert "PET_RDZV_CONF=is_host=true\n" in files["workstation"] and "WORLD_SIZE=3\n" in files["workstation"]
    assert "PET_RDZV_ID=cluster\n" in files["workstation"]
    assert "WORLD_SIZE=4\n" in inv.env_files(nproc_per_node=2)["node1"]


def test_minimal_inventory_takes_the_file_stem_as_name_and_every_default():
    inv = parse_inventory('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\n', Path("/x/Lab1.toml"))
    assert inv.name == "lab1" and inv.master_port == 29500
    assert inv.hosts == (Host(name="node0", address="10.0.0.1", iface="eth0"),)


@pytest.mark.parametrize("text, fragment", [
    ("hosts = [", "is not valid TOML"),
    ('name = "x"', "invalid hosts=None"),
    ("hosts = []", "must list at least one host"),
    ('[[hosts]]\niface = "eth0"', "hosts[0].address=None (from /home/me/cluster.toml): is required"),
    ('[[hosts]]\naddress = "10.0.0.1"', "hosts[0].iface=None (from /home/me/cluster.toml): is required"),
    ('[[hosts]]\naddress = "not an address!"\niface = "eth0"', "must be an IP address or a hostname"),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nport = "22"', "hosts[0].port='22'"),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nport = 70000', "must be from 1 to 65535"),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nport = true', "must be a whole number"),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nnproc_per_node = 0', "hosts[0].nproc_per_node=0"),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "an interface name that is long"', "hosts[0].iface="),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nuser = "me@host"', "must be a user name"),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nworkspace = "~"', "not the home directory"),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nworkspace = "/"', "not the home directory"),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nworkspace = "a/../../b"', "a path with .."),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\npython = "p"\nvenv = "v"', "give python or venv, not both"),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nenv = { MASTER_ADDR = "x" }', "part of each host's identity"),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nenv = { X = 1 }', 'X must be a string (write X = "1")'),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nenv = { "1X" = "a" }', "not an environment variable name"),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nadress = "x"', "unknown setting hosts[0].adress"),
    ('[defaults]\naddress = "10.0.0.1"\n[[hosts]]\niface = "eth0"', "unknown setting defaults.address"),
    ('nodes = 3\n[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"', "unknown setting nodes"),
    ('name = "Big Cluster"\n[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"', "invalid name='Big Cluster'"),
    ('master_port = 80\n[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"', "invalid master_port=80"),
    ('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\n[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"',
     "hosts[1].address='10.0.0.1'"),
    ('[[hosts]]\nname = "a"\naddress = "10.0.0.1"\niface = "eth0"\n[[hosts]]\nname = "a"\naddress = "10.0.0.2"\n'
     'iface = "eth0"', "is also hosts[0]'s name"),
])
def test_bad_inventories_are_refused_with_the_key_and_the_rule(text, fragment):
    with pytest.raises(LabError) as caught:
        parse_inventory(text, PATH)
    assert fragment in str(caught.value)


def test_a_misspelt_key_gets_a_suggestion():
    with pytest.raises(LabError) as caught:
        parse_inventory('[[hosts]]\naddress = "10.0.0.1"\niface = "eth0"\nidentityfile = "k"', PATH)
    assert caught.value.hint == "did you mean 'identity_file'?"


def test_the_same_machine_on_another_ssh_port_is_another_host():
    text = ('[defaults]\niface = "eth0"\n[[hosts]]\naddress = "127.0.0.1"\nport = 2201\n'
            '[[hosts]]\naddress = "127.0.0.1"\nport = 2202\n')
    assert [h.port for h in parse_inventory(text, PATH).hosts] == [2201, 2202]


def test_render_then_parse_gives_the_same_inventory(tmp_path):
    text = render_inventory(name="demo", master_port=29500, comment="written by a test\n\nsecond paragraph",
                            defaults={"user": "root", "iface": "eth0", "identity_file": "ssh/id_ed25519",
                                      "known_hosts": "ssh/known_hosts", "python": "/opt/venv/bin/python",
                                      "env": {"OMP_NUM_THREADS": "1", "PYTHONPATH": "/opt/ddplab"}},
                            hosts=[{"name": f"node{i}", "address": f"172.28.0.{10 + i}"} for i in range(2)])
    assert text.startswith("# written by a test\n#\n# second paragraph\nname = \"demo\"\n")
    assert "\n[[hosts]]\nname = \"node1\"\naddress = \"172.28.0.11\"\n" in text
    inv = parse_inventory(text, tmp_path / "hosts.toml")
    assert inv.names == ["node0", "node1"] and inv.hosts[1].identity_file == tmp_path / "ssh" / "id_ed25519"
    assert inv.hosts[0].env == {"OMP_NUM_THREADS": "1", "PYTHONPATH": "/opt/ddplab"}


VALUES = st.one_of(st.text(max_size=20), st.integers(-5, 70000), st.booleans(), st.floats(allow_nan=False),
                   st.lists(st.text(max_size=3), max_size=2), st.dictionaries(st.text(max_size=5), st.text(max_size=5),
                                                                               max_size=2))
KEYS = st.sampled_from(["name", "address", "user", "port", "identity_file", "known_hosts", "iface", "nproc_per_node",
                        "python", "venv", "workspace", "env", "bogus"])


@settings(max_examples=300, deadline=None)
@given(host=st.dictionaries(KEYS, VALUES, max_size=6), top=st.dictionaries(st.sampled_from(["name", "master_port"]),
                                                                           VALUES, max_size=2))
def test_any_inventory_values_parse_or_give_our_own_error(host, top):
    import tomli_w

    text = tomli_w.dumps({**top, "hosts": [{"address": "10.0.0.1", "iface": "eth0", **host}]})
    try:
        inv = parse_inventory(text, PATH)
    except LabError as exc:
        assert str(exc).strip()
        return
    assert len(inv.hosts) == 1 and inv.hosts[0].port in range(1, 65536)
