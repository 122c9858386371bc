"""Bad input: a clear message, exit status 2, no traceback, and nothing created."""

from __future__ import annotations

import pytest

from conftest import labctl, lab_resources


@pytest.mark.parametrize("args, fragment", [
    (["--nodes", "0"], "--nodes='0'"),
    (["--nodes", "500"], "must be from 1 to 64"),
    (["--subnet", "10.1.2.300/24"], "CIDR"),
    (["--subnet", "10.77.0.1/24"], "did you mean 10.77.0.0/24"),
    (["--master-port", "99999"], "from 1024 to 65535"),
    (["--cpus", "999"], "at most the engine's"),
    (["--memory", "12x"], "size such as"),
    (["--node-cpus", "node9=0.5"], "the lab has node0..node2"),
    (["--node-cpus", "node1=99"], "at most the engine's"),
])
def test_up_rejects_bad_values(lab_name, docker_client, args, fragment):
    result = labctl("up", "--lab", lab_name, *args)
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr and "Traceback" not in result.stderr
    assert lab_resources(docker_client, lab_name) == {"containers": [], "networks": [], "volumes": []}


def test_subnet_overlapping_a_docker_network(lab_name, docker_client):
    import docker.types

    pool = docker.types.IPAMPool(subnet="172.31.250.0/24")
    other = docker_client.networks.create(f"{lab_name}-other", ipam=docker.types.IPAMConfig(pool_configs=[pool]))
    try:
        result = labctl("up", "--lab", lab_name, "--subnet", "172.31.250.128/25")
        assert result.returncode == 2
        assert f"overlaps the existing Docker network {lab_name}-other (172.31.250.0/24)" in result.stderr
        assert lab_resources(docker_client, lab_name) == {"containers": [], "networks": [], "volumes": []}
    finally:
        other.remove()


def test_run_without_a_lab(lab_name):
    result = labctl("run", "--lab", lab_name, "--", "-m", "trainer")
    assert result.returncode == 1  # the lab's state, not the input
    assert f"lab '{lab_name}' is not up" in result.stderr


@pytest.mark.parametrize("args, fragment", [
    (["run", "--"], "no training script"),
    (["run", "--", "-m"], "needs a module name"),
    (["run", "--nproc-per-node", "0", "--", "x.py"], "--nproc-per-node='0'"),
    (["run", "--launcher", "mpi", "--", "x.py"], "Invalid value for '--launcher'"),
    (["env", "--hosts", "a,a", "--iface", "eth0"], "more than once"),
    (["env", "--hosts", "10.0.0.1", "--iface", "bad iface!"], "interface name"),
    (["logs", "--run", "nope"], "no run nope"),
])
def test_cli_bad_input(args, fragment, lab_name):
    result = labctl(*args[:1], "--lab", lab_name, *args[1:]) if args[0] != "env" else labctl(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert fragment in result.stderr and "Traceback" not in result.stderr
