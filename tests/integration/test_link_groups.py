"""Links between groups of nodes (`labctl shape --node A --to B`), checked against the kernel's own
readback (`tc -s class show`, `tc filter show`, their byte counters), iperf3 on each path, and gloo's
all-reduce against the calibrated model, whose ring turns as gloo's does (rank r sends to r-1)."""

from __future__ import annotations

import json
import re

import pytest

from conftest import labctl
from labctl.bench.allreduce import measure_wire

pytestmark = pytest.mark.alone  # it measures rates through the shaped classes


def status(lab: str) -> dict[str, dict]:
    return {n["name"]: n for n in json.loads(labctl("status", "--lab", lab, "--json", check=True).stdout)["nodes"]}


def class_bytes(client, lab: str, node: str) -> dict[str, tuple[str, int]]:
    """class id -> (its rate as tc prints it, the bytes it has sent), from `tc -s class show dev eth0`."""
    out = client.containers.get(f"{lab}-{node}").exec_run(["tc", "-s", "class", "show", "dev", "eth0"]).output.decode()
    found = re.findall(r"class htb (\S+) .*? rate (\S+) .*?\n\s*Sent (\d+) bytes", out)
    return {classid: (rate, int(sent)) for classid, rate, sent in found}


@pytest.fixture(scope="module")
def lab(lab3):
    name, _ = lab3
    yield name
    labctl("shape", "--lab", name, "--clear")


def test_a_link_to_one_node_shapes_that_path_only_and_the_kernel_counts_it(lab, docker_client):
    ips = {name: node["ip"] for name, node in status(lab).items()}
    labctl("shape", "--lab", lab, "--node", "node0", "--bw", "1gbit", check=True)
    labctl("shape", "--lab", lab, "--node", "node0", "--to", "node2", "--bw", "50mbit", check=True)
    nodes = status(lab)
    assert nodes["node0"]["link"] == "1gbit; to node2: 50mbit", nodes["node0"]
    assert nodes["node0"]["links_to"] == [{"nodes": ["node2"], "ips": [ips["node2"]], "rate_bps": 50_000_000,
                                           "delay_us": None, "jitter_us": None, "loss_pct": None}]
    assert nodes["node1"]["link"] == "unshaped"
    filters = docker_client.containers.get(f"{lab}-node0").exec_run(["tc", "filter", "show", "dev", "eth0"]).output.decode()
    hex_ip = "".join(f"{int(part):02x}" for part in ips["node2"].split("."))
    assert re.search(rf"\*flowid 1:2 .*\n\s+match {hex_ip}/ffffffff at 16", filters), filters

    before = class_bytes(docker_client, lab, "node0")
    assert {k: v[0] for k, v in before.items()} == {"1:1": "1Gbit", "1:2": "50Mbit"}
    to_node2 = measure_wire(docker_client, lab, "node0", "node2", ips["node2"])
    to_node1 = measure_wire(docker_client, lab, "node0", "node1", ips["node1"])
    after = class_bytes(docker_client, lab, "node0")
    assert 0.85 * 50e6 <= to_node2 <= 1.02 * 50e6, to_node2
    assert to_node1 > 10 * 50e6, to_node1  # the rest of node0's link: 1gbit, not the route's 50mbit
    sent = {k: after[k][1] - before[k][1] for k in after}
    assert sent["1:2"] >= 0.9 * to_node2 * 3 / 8, sent  # iperf3's 3 s to node2 went through the route's class
    assert sent["1:1"] >= 0.9 * to_node1 * 3 / 8, sent  # and those to node1 through the rest's


def test_the_all_reduce_ring_meets_the_link_and_the_model_and_a_clear_removes_only_it(lab):
    """3 nodes: gloo's all-reduce sends node0 -> node2 (rank 0 to rank -1), so the route paces it."""
    labctl("shape", "--lab", lab, "--node", "node0", "--to", "node2", "--bw", "50mbit", check=True)
    result = labctl("bench", "allreduce", "--lab", lab, "--sizes", "4M", "--iters", "3", "--json", check=True, timeout=600)
    row = json.loads(result.stdout)[-1]
    assert abs(row["busbw_gbs"] - 50e6 / 8e9) <= 0.15 * 50e6 / 8e9, row  # the ring at the route's 50mbit
    assert 0.9 <= row["meas_over_calibrated"] <= 1.1, row  # the cost model page's goal is 0.95-1.05, measured by the bench
    labctl("shape", "--lab", lab, "--node", "node0", "--bw", "500mbit", check=True)  # the whole link: the route stays
    assert status(lab)["node0"]["link"] == "500mbit; to node2: 50mbit"
    labctl("shape", "--lab", lab, "--node", "node0", "--to", "node2", "--clear", check=True)
    assert status(lab)["node0"]["link"] == "500mbit"
    bad = labctl("shape", "--lab", lab, "--node", "node0", "--to", "node0", "--bw", "1mbit")
    assert bad.returncode == 2 and "is in both" in bad.stderr and "Traceback" not in bad.stderr
