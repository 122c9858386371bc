"""The foundation end to end: up, run (trainer, a foreign DDP script, static launch), logs,
failure reporting, Ctrl-C, grow, down."""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time

import pytest

from labctl.lab import tcp

from conftest import (
    NO_RUNS,
    PS,
    REPO,
    SCRIPTS,
    interruptible,
    lab_resources,
    labctl,
    permanent_peers,
    still_running,
    summary_of,
    wait_for,
)



def test_up_reports_every_node(lab3, docker_client):
    name, status = lab3
    assert status["lab"] == name
    assert [n["name"] for n in status["nodes"]] == ["node0", "node1", "node2"]
    assert all(n["state"] == "running" and n["torch"].startswith("2.13.0") for n in status["nodes"])
    assert len({n["ip"] for n in status["nodes"]}) == 3
    again = json.loads(labctl("status", "--lab", name, "--json", check=True).stdout)
    assert [n.pop("link") for n in again["nodes"]] == ["unshaped"] * 3  # read back from the kernel
    assert again == status
    # Identical image on every node, and the lab's env files on disk.
    images = {c.image.id for c in docker_client.containers.list(filters={"label": f"io.ddplab.lab={name}"})}
    assert len(images) == 1
    env1 = (REPO / ".lab" / name / "node1.env").read_text()
    assert "PET_RDZV_CONF=is_host=false" in env1 and "NODE_RANK=1" in env1
    # Every node's sockets run cubic, Linux's default, whatever the host's own default (BBR on this
    # project's machines, where `make test`'s engine set-up allows containers to choose cubic).
    host = tcp.read_host_tcp(True)
    want = "cubic" if host is None or "cubic" in host.allowed else host.default
    ccs = {c.name: c.exec_run(["cat", "/proc/sys/net/ipv4/tcp_congestion_control"]).output.decode().strip()
           for c in docker_client.containers.list(filters={"label": f"io.ddplab.lab={name}"})}
    assert set(ccs.values()) == {want}, ccs
    # No ARP left for a run's full mesh: every node knows every peer for good (labctl.net.neighbors).
    assert permanent_peers(docker_client, name, status["nodes"]) == {"node0": True, "node1": True, "node2": True}


def test_trainer_runs_on_all_nodes(lab3):
    name, _ = lab3
    result = labctl("run", "--lab", name, "--", "-m", "trainer", "--epochs", "2", check=True)
    out = result.stdout
    for rank, node in enumerate(["node0", "node1", "node2"]):
        assert sum(f"[rank {rank}/3" in line and "epoch" in line for line in out.splitlines()) == 2, out
    summary = summary_of(out)
    assert summary["world_size"] == 3 and summary["replicas_consistent"] is True
    assert summary["steps"] > 0 and summary["final_loss"] > 0
    # A successful run ends without stack traces (no rendezvous-shutdown noise either).
    assert "Traceback" not in out + result.stderr and "failed to shutdown" not in out
    run_dir = REPO / ".lab" / name / "runs" / "latest"
    assert sorted(p.name for p in run_dir.glob("*.log")) == ["node0.log", "node1.log", "node2.log"]
    assert len(list(run_dir.glob("metrics-rank*.jsonl"))) == 3
    logs = labctl("logs", "--lab", name, "node2", check=True).stdout
    assert "[rank 2/3" in logs and "==>" not in logs  # one node's log, bare


def test_foreign_ddp_script_runs_unchanged(lab3):
    name, _ = lab3
    script = str((SCRIPTS / "plain_ddp.py").relative_to(REPO))
    out = labctl("run", "--lab", name, "--", script, check=True).stdout
    lines = [line for line in out.splitlines() if "PLAIN_DDP" in line]
    assert len(lines) == 3, out
    assert all("world=3" in line and "rank_sum=3" in line and "replicas_equal=True" in line for line in lines)


def test_static_launcher_two_processes_per_node(lab3):
    name, _ = lab3
    script = str(SCRIPTS / "plain_ddp.py")
    out = labctl("run", "--lab", name, "--launcher", "static", "--nproc-per-node", "2", "--", script, check=True).stdout
    lines = [line for line in out.splitlines() if "PLAIN_DDP" in line]
    assert len(lines) == 6, out
    assert all("world=6" in line and "rank_sum=15" in line for line in lines)
    assert "node2/r5" in out


def test_failure_names_the_node_and_why(lab3):
    name, _ = lab3
    result = labctl("run", "--lab", name, "--launcher", "static", "--", str(SCRIPTS / "fail_on_rank.py"), "1")
    assert result.returncode == 1
    assert "run failed: rank 1 on node1 failed first" in result.stderr
    assert "ValueError: deliberate failure on rank 1" in result.stderr


def test_master_port_in_use_is_refused(lab3, docker_client):
    name, _ = lab3
    node0 = docker_client.containers.get(f"{name}-node0")
    # SO_REUSEADDR: an earlier test's connections to 29500 may linger in TIME_WAIT.
    holder = ("import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
              "s.bind(('0.0.0.0', 29500)); s.listen(); time.sleep(60)")
    node0.exec_run(["python", "-c", holder], detach=True)
    assert wait_for(lambda: b":29500" in node0.exec_run(["ss", "-Hltn"]).output, 10, 0.1), \
        "the port holder did not start"
    try:
        result = labctl("run", "--lab", name, "--", "-m", "trainer")
        assert result.returncode == 1  # the lab's state, not the command
        assert "MASTER_PORT 29500 is already in use on node0" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        node0.exec_run(["pkill", "-f", "s.bind"])


def test_ctrl_c_stops_every_node(lab3, docker_client):
    name, _ = lab3
    proc = subprocess.Popen([sys.executable, "-m", "labctl", "run", "--lab", name, "--", str(SCRIPTS / "sleeper.py")],
                            cwd=REPO, preexec_fn=interruptible, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = 0
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        seen += "SLEEPER_READY" in line
        if seen == 3 or time.monotonic() > deadline:
            break
    assert seen == 3
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, rest
    for node in ("node0", "node1", "node2"):
        ps = docker_client.containers.get(f"{name}-{node}").exec_run(PS).output.decode()
        left = still_running(ps, "sleeper.py|torchrun")
        assert left == [], f"{node} still runs: {left}"


def test_grow_then_down_leaves_nothing(lab_name, docker_client):
    # --warm off: nothing runs on it, and 5 fork servers would import torch for no run (NO_RUNS)
    labctl("up", "--lab", lab_name, "--nodes", "3", *NO_RUNS, check=True)
    grown = json.loads(labctl("up", "--lab", lab_name, "--nodes", "5", "--json", *NO_RUNS, check=True).stdout)
    assert [n["name"] for n in grown["nodes"]] == [f"node{i}" for i in range(5)]
    assert all(n["state"] == "running" for n in grown["nodes"])
    assert "NNODES=5" in (REPO / ".lab" / lab_name / "node0.env").read_text()
    assert all(permanent_peers(docker_client, lab_name, grown["nodes"]).values())  # old nodes know the new
    # Without --nodes, up on a running lab keeps its size.
    kept = json.loads(labctl("up", "--lab", lab_name, "--json", *NO_RUNS, check=True).stdout)
    assert len(kept["nodes"]) == 5
    labctl("down", "--lab", lab_name, check=True)
    left = lab_resources(docker_client, lab_name)
    assert left["containers"] == [] and left["networks"] == []
    assert labctl("down", "--lab", lab_name).returncode == 0  # idempotent
    labctl("down", "--lab", lab_name, "--volumes", check=True)
    assert lab_resources(docker_client, lab_name) == {"containers": [], "networks": [], "volumes": []}


def test_down_cleans_up_after_an_up_killed_midway(lab_name, docker_client):
    """kill -9 of labctl while Compose is creating nodes; down still removes everything."""
    proc = subprocess.Popen([sys.executable, "-m", "labctl", "up", "--lab", lab_name, "--nodes", "6"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not lab_resources(docker_client, lab_name)["containers"]:
        assert proc.poll() is None, f"up ended before it was killed:\n{proc.communicate()[0]}"
        assert time.monotonic() < deadline, "up never created a container"
        time.sleep(0.05)
    proc.kill()  # Compose, now orphaned, is still creating the rest: down must stop it first
    proc.wait()
    assert labctl("down", "--lab", lab_name, "--volumes").returncode == 0
    assert lab_resources(docker_client, lab_name) == {"containers": [], "networks": [], "volumes": []}


def busy_seconds(client, container: str, pick=min) -> float:
    """`pick` (the fastest, as timeit reports) of 3 runs of a CPU-bound loop: a moment of load on this
    2-core machine slows one run of the unthrottled node, never all three. The throttled node is
    measured by the median: one of its runs once came in at half its quota's time (0.29 s where
    0.7 to 1.1 s is usual), which the fastest would have taken."""
    code = ("import time\nfor _ in range(3):\n    t = time.perf_counter(); sum(range(10**7))\n"
            "    print(time.perf_counter() - t)")
    runs = client.containers.get(container).exec_run(["python", "-c", code]).output.decode().split()
    return pick(sorted(float(x) for x in runs))


@pytest.mark.alone  # node1's unthrottled loop must have a core to itself
def test_slow_makes_a_straggler_in_place_and_clear_lifts_it(lab3, docker_client):
    name, _ = lab3
    labctl("slow", "--lab", name, "node2", "--cpus", "0.25", check=True)
    assert docker_client.api.inspect_container(f"{name}-node2")["HostConfig"]["NanoCpus"] == 250_000_000
    slow_s = busy_seconds(docker_client, f"{name}-node2", pick=statistics.median)
    fast_s = busy_seconds(docker_client, f"{name}-node1")
    assert slow_s > 2 * fast_s, f"node2 at 0.25 CPU took {slow_s:.2f} s, node1 {fast_s:.2f} s"
    result = labctl("slow", "--lab", name, "node2", "--clear", check=True)
    assert "CPU limit now none" in result.stderr
    assert busy_seconds(docker_client, f"{name}-node2") < slow_s / 2
    bad = labctl("slow", "--lab", name, "node9", "--cpus", "0.5")
    assert bad.returncode == 2 and "no node 'node9'" in bad.stderr


def test_up_with_a_slow_node(lab_name, docker_client):
    labctl("up", "--lab", lab_name, "--nodes", "2", "--node-cpus", "node1=0.5", *NO_RUNS, check=True)
    cpus = {n: docker_client.api.inspect_container(f"{lab_name}-{n}")["HostConfig"]["NanoCpus"] for n in ("node0", "node1")}
    assert cpus == {"node0": 0, "node1": 500_000_000}
