"""Teardown and isolation: two labs side by side on subnets of their own, and `down` after a
failed run leaving nothing (after success, twice, and after `kill -9` mid-up: test_lab.py)."""

from __future__ import annotations

import ipaddress
import subprocess
from concurrent.futures import ThreadPoolExecutor

from conftest import SCRIPTS, drop_lab, lab_resources, labctl, new_lab_name


def test_two_labs_side_by_side_do_not_interfere(docker_client, node_image):
    names = [new_lab_name(), new_lab_name()]
    try:
        with ThreadPoolExecutor(2) as pool:  # brought up at the same time
            results = list(pool.map(lambda n: labctl("up", "--lab", n, "--nodes", "2"), names))
        for result in results:
            assert result.returncode == 0, result.stdout + result.stderr
        subnets = {}
        for network in docker_client.networks.list():
            for config in (network.attrs.get("IPAM") or {}).get("Config") or []:
                if config.get("Subnet"):
                    subnets[network.name] = ipaddress.ip_network(config["Subnet"])
        mine = [subnets[f"{n}-net"] for n in names]
        others = [net for name, net in subnets.items() if name not in (f"{n}-net" for n in names)]
        assert not mine[0].overlaps(mine[1])
        assert not any(m.overlaps(o) for m in mine for o in others)
        with ThreadPoolExecutor(2) as pool:  # both train at once, each on its own store and network
            runs = list(pool.map(lambda n: labctl("run", "--lab", n, "--", "-m", "trainer", "--epochs", "1"), names))
        for run in runs:
            assert run.returncode == 0 and '"world_size": 2' in run.stdout, run.stdout[-2000:] + run.stderr
        other = lab_resources(docker_client, names[1])  # its 2 nodes and their network helpers
        assert len(other["containers"]) == 4, other
        assert labctl("down", "--lab", names[0]).returncode == 0
        assert lab_resources(docker_client, names[0])["containers"] == []
        assert lab_resources(docker_client, names[1]) == other  # untouched
        assert labctl("status", "--lab", names[1], check=True).returncode == 0
    finally:
        for name in names:
            drop_lab(name)
        for name in names:
            assert lab_resources(docker_client, name) == {"containers": [], "networks": [], "volumes": []}


def test_down_after_a_failed_run_leaves_nothing(lab_name, docker_client):
    labctl("up", "--lab", lab_name, "--nodes", "2", check=True)
    failed = labctl("run", "--lab", lab_name, "--", str(SCRIPTS / "fail_on_rank.py"), "1")
    assert failed.returncode == 1
    for _ in range(2):
        assert labctl("down", "--lab", lab_name, "--volumes").returncode == 0
        assert lab_resources(docker_client, lab_name) == {"containers": [], "networks": [], "volumes": []}
    processes = subprocess.run(["pgrep", "-f", f"compose.*{lab_name}"], capture_output=True, text=True).stdout
    assert processes.strip() == ""
