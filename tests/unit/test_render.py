"""Env files and the Compose document, compared whole against golden files.

Regenerate the golden files after an intended change: UPDATE_GOLDEN=1 pytest tests/unit/test_render.py
"""

import os
from pathlib import Path

import pytest
import yaml

from labctl.errors import ConfigError
from labctl.lab.compose import ComposePlan, build_compose, load_template, render_compose
from labctl.lab.envfiles import (
    Topology,
    build_env_files,
    build_node_env,
    host_commands,
    parse_hosts,
    topology_for_lab,
)
from labctl.spec.addresses import node_ip
from labctl.spec.labspec import LabSpec

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden file (UPDATE_GOLDEN=1 to accept)"


def lab_files(config: LabSpec, subnet: str = "172.28.5.0/24") -> dict[str, str]:
    ips = [node_ip(subnet, i) for i in range(config.nodes)]
    return build_env_files(topology_for_lab(config, ips), config.node_names)


def test_lab_env_files_golden():
    files = lab_files(LabSpec(lab="demo", nodes=3, nproc_per_node=2))
    assert list(files) == ["node0.env", "node1.env", "node2.env"]
    for name, text in files.items():
        check_golden(f"lab-{name}", text)


def test_env_identity_rules():
    topo = Topology.uniform(("10.0.0.1", "10.0.0.2", "10.0.0.3"), iface="tailscale0", nproc_per_node=2,
                            master_port=29500, rdzv_id="job")
    envs = [build_node_env(topo, rank) for rank in range(3)]
    assert [e["PET_RDZV_CONF"] for e in envs] == ["is_host=true", "is_host=false", "is_host=false"]
    assert [e["NODE_RANK"] for e in envs] == ["0", "1", "2"]
    for env in envs:
        assert env["MASTER_ADDR"] == "10.0.0.1" and env["PET_RDZV_ENDPOINT"] == "10.0.0.1:29500"
        assert env["WORLD_SIZE"] == "6" and env["PET_NNODES"] == "3" and env["PET_NPROC_PER_NODE"] == "2"
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "tailscale0"
        assert env["PET_RDZV_BACKEND"] == "c10d"
        # only the rank and the store host differ between nodes
    differing = {k for k in envs[0] if len({e[k] for e in envs}) > 1}
    assert differing == {"NODE_RANK", "PET_RDZV_CONF"}


def test_hosts_that_differ_keep_their_own_interface_and_process_count():
    topo = Topology(addresses=("100.64.0.1", "100.64.0.2"), ifaces=("eth0", "wlan0"), nprocs=(2, 1),
                    master_port=29500, rdzv_id="mixed")
    first, second = (build_node_env(topo, rank) for rank in range(2))
    assert (first["GLOO_SOCKET_IFNAME"], first["NPROC_PER_NODE"], first["PET_NPROC_PER_NODE"]) == ("eth0", "2", "2")
    assert (second["NCCL_SOCKET_IFNAME"], second["NPROC_PER_NODE"], second["PET_NPROC_PER_NODE"]) == ("wlan0", "1", "1")
    assert first["WORLD_SIZE"] == second["WORLD_SIZE"] == "3"
    with pytest.raises(ValueError, match="one interface and one process count per address"):
        Topology(addresses=("a", "b"), ifaces=("eth0",), nprocs=(1, 1), master_port=1, rdzv_id="x")


def test_compose_golden():
    config = LabSpec(lab="demo", nodes=3, cpus=0.5, memory="2g")
    plan = ComposePlan(subnet="172.28.5.0/24", workspace=Path("/work/space"), user="1000:1000", tcp_cc="cubic")
    check_golden("compose-demo.yaml", render_compose(build_compose(config, plan, load_template())))


def test_compose_structure():
    config = LabSpec(lab="x", nodes=5)
    plan = ComposePlan(subnet="10.9.0.0/24", workspace=Path("/ws"), user="0:0")
    doc = yaml.safe_load(render_compose(build_compose(config, plan, load_template())))
    assert list(doc["services"]) == [f"node{i}" for i in range(5)]
    node4 = doc["services"]["node4"]
    assert node4["hostname"] == "node4" and node4["container_name"] == "x-node4"
    assert node4["networks"]["lab"]["ipv4_address"] == "10.9.0.14"
    assert {"type": "bind", "source": "/ws", "target": "/ws"} in node4["volumes"]
    assert node4["working_dir"] == "/ws" and node4["env_file"] == ["node4.env"]
    assert "cpus" not in node4 and node4["mem_limit"] == "4g"
    assert node4["security_opt"] == ["no-new-privileges"]
    for forbidden in ("privileged", "cap_add", "network_mode", "ports"):
        assert forbidden not in node4
    assert not any("docker.sock" in str(v) for v in node4["volumes"])
    labelled = [node4["labels"], doc["networks"]["lab"]["labels"], doc["volumes"]["shared"]["labels"]]
    assert all(labels["io.ddplab.lab"] == "x" for labels in labelled)
    assert doc["networks"]["lab"]["ipam"]["config"][0]["subnet"] == "10.9.0.0/24"
    assert doc["networks"]["lab"]["name"] == "x-net" and doc["volumes"]["shared"]["name"] == "x-shared"


def test_each_node_keeps_its_compile_cache_on_the_shared_volume_keyed_by_its_image():
    from labctl.lab.compose import compile_cache_dir

    cpu, cuda = compile_cache_dir("sha256:" + "a" * 64), compile_cache_dir("sha256:" + "b" * 64)
    assert cpu == "/shared/compile/" + "a" * 12 and cpu != cuda
    plan = ComposePlan(subnet="10.9.0.0/24", workspace=Path("/ws"), user="0:0",
                       compile_caches={"node0": cpu, "node1": cuda})
    doc = yaml.safe_load(render_compose(build_compose(LabSpec(lab="x", nodes=3), plan, load_template())))
    env = {name: service["environment"] for name, service in doc["services"].items()}
    assert env["node0"]["TORCHINDUCTOR_CACHE_DIR"] == cpu and env["node0"]["TRITON_CACHE_DIR"] == cpu + "/triton"
    assert env["node1"]["TORCHINDUCTOR_CACHE_DIR"] == cuda
    assert "TORCHINDUCTOR_CACHE_DIR" not in env["node2"]  # its image was not there to be named: inductor's default
    assert {"type": "volume", "source": "shared", "target": "/shared"} in doc["services"]["node0"]["volumes"]


@pytest.mark.parametrize("raw, expected", [
    ("100.64.0.1,100.64.0.2", ("100.64.0.1", "100.64.0.2")),
    (" gpu-box.lan , laptop ", ("gpu-box.lan", "laptop")),
])
def test_parse_hosts(raw, expected):
    assert parse_hosts(raw) == expected


@pytest.mark.parametrize("raw, fragment", [
    ("", "at least one"),
    ("bad host!", "neither an IP"),
    ("10.0.0.1,10.0.0.1", "more than once"),
])
def test_parse_hosts_rejects(raw, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse_hosts(raw)


def test_host_commands_golden():
    topo = Topology.uniform(("100.64.0.1", "100.64.0.2"), iface="tailscale0", nproc_per_node=1,
                            master_port=29500, rdzv_id="ddplab")
    files = build_env_files(topo, ["node0", "node1"])
    for name, text in files.items():
        check_golden(f"hosts-{name}", text)
    commands = host_commands(topo, Path("/home/me/ddplab/.lab/hosts"), ["node0", "node1"])
    assert commands == [
        ("100.64.0.1", "set -a; . /home/me/ddplab/.lab/hosts/node0.env; set +a; torchrun -m trainer"),
        ("100.64.0.2", "set -a; . /home/me/ddplab/.lab/hosts/node1.env; set +a; torchrun -m trainer"),
    ]


def test_compose_per_node_cpus_override_the_lab_limit():
    config = LabSpec(lab="x", nodes=3, cpus=1.0)
    plan = ComposePlan(subnet="10.9.0.0/24", workspace=Path("/ws"), user="0:0", node_cpus={"node2": 0.25})
    services = build_compose(config, plan, load_template())["services"]
    assert [services[f"node{i}"]["cpus"] for i in range(3)] == [1.0, 1.0, 0.25]


def test_compose_on_an_engine_without_limits_claims_none():
    """Rootless Docker on cgroup v1 would accept and ignore them: the file says what really applies."""
    config = LabSpec(nodes=2, cpus=0.5)
    plan = ComposePlan(subnet="10.9.0.0/24", workspace=Path("/ws"), user="0:0", limits=False)
    doc = build_compose(config, plan, load_template())
    for node in doc["services"].values():
        assert not {"cpus", "mem_limit", "pids_limit"} & set(node)
        assert node["user"] == "0:0" and node["security_opt"] == ["no-new-privileges"]


def test_a_fresh_compile_cache_is_said_once_per_folder_with_its_nodes(capsys):
    from labctl.cli.render import print_cleared_caches

    print_cleared_caches({"node0": "/shared/compile/aaa", "node1": "/shared/compile/bbb",
                          "node2": "/shared/compile/aaa", "node3": ""})
    said = [" ".join(line.split()) for line in capsys.readouterr().err.splitlines()]
    assert said == ["• node0, node2: compile cache /shared/compile/aaa emptied",
                    "• node1: compile cache /shared/compile/bbb emptied",
                    "• node3: no compile cache (TORCHINDUCTOR_CACHE_DIR not set)"]
