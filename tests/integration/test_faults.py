"""Faults and recovery on a real lab: crash with restarts resumes to the same parameters, a killed
node is survived with an elastic range or named within seconds without one, pause and partition
are seen by doctor and undone."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, drop_lab, labctl, module_lab, new_lab_name, permanent_peers, summary_of

GPT = ["-m", "trainer", "--workload", "gpt", "--threads", "1", "--ckpt-every", "10"]



@pytest.fixture(scope="module")
def lab(docker_client, node_image):
    yield from module_lab(3)


def up_again(lab: str) -> None:
    labctl("up", "--lab", lab, check=True)  # restores a killed node


def steps_logged(run_dir: Path, rank: int) -> int:
    """How many steps `rank` has written to the run's metrics so far."""
    metrics = run_dir / f"metrics-rank{rank}.jsonl"
    return metrics.read_text().count('"kind": "step"') if metrics.exists() else 0


def run_with_fault(lab: str, run_args: list[str], fault: str, node: str, after_steps: int,
                   ranks: int = 1) -> tuple[subprocess.CompletedProcess, float]:
    """Start `labctl run`, inject the fault once rank 0 has logged `after_steps` steps and rank
    `ranks - 1` a step (an elastic run's first round may form without a node that starts late: the
    node killed must be one it trains on), wait for the end. Returns the run's result and the
    seconds from the fault to labctl's exit."""
    latest = REPO / ".lab" / lab / "runs" / "latest"
    before = latest.resolve() if latest.exists() else None
    proc = subprocess.Popen([sys.executable, "-m", "labctl", "run", "--lab", lab, *run_args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        run_dir = latest.resolve() if latest.exists() else None
        if (run_dir and run_dir != before and steps_logged(run_dir, 0) >= after_steps
                and steps_logged(run_dir, ranks - 1)):
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before the fault could be injected"
    labctl("fault", "--lab", lab, fault, node, check=True)
    fault_at = time.monotonic()
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - fault_at


def test_crash_with_a_restart_resumes_to_the_same_parameters(docker_client, node_image):
    # 2 nodes: a sum of two floats does not depend on order, so the resumed run can be bit-identical
    # (with 3+ ranks the restart rebuilds DDP's buckets and the last bits may differ).
    name = new_lab_name()
    labctl("up", "--lab", name, "--nodes", "2", check=True)
    try:
        args = ["--", *GPT, "--steps", "120"]
        reference = summary_of(labctl("run", "--lab", name, *args, check=True).stdout)
        result, _ = run_with_fault(name, ["--max-restarts", "1", *args], "crash", "node1", after_steps=30)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        crashed = summary_of(result.stdout)
        assert crashed["resumed_from_step"] >= 30 and "resuming from step" in result.stdout
        assert crashed["steps"] == 120 and crashed["param_checksum"] == reference["param_checksum"]
        assert crashed["final_loss"] == reference["final_loss"]
    finally:
        drop_lab(name)


def test_killed_node_is_survived_with_an_elastic_range(lab):
    result, _ = run_with_fault(lab, ["--max-restarts", "2", "--nnodes", "2:3", "--", *GPT, "--steps", "100",
                                     "--global-batch", "48"], "kill", "node2", after_steps=30, ranks=3)
    try:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        s = summary_of(result.stdout)
        assert s["world_size"] == 2 and s["steps"] == 100 and s["resumed_from_step"] >= 30
        assert s["accum_steps"] == 3  # the same global batch of 48, now over 2 ranks
        assert "completed without node2" in result.stdout
        # every worker's line (worker.py), as they started: each node trained, the last world had two
        members = sorted((json.loads(line) for line in (REPO / ".lab" / lab / "runs" / "latest" / "members.jsonl")
                          .read_text().splitlines()), key=lambda m: m["time"])
        assert {m["host"] for m in members} == {"node0", "node1", "node2"}
        assert [m["group_world_size"] for m in members[-2:]] == [2, 2], members
        # and labctl says when the first workers started without a node (a late agent), only then
        late = members[0]["group_world_size"] < 3
        assert ("labctl: the run's first workers started on 2 of 3 nodes" in result.stdout) == late, members
        # the survivors' errors are consequences: their tracebacks and callback stacks stay in the logs
        stacks = ("]: At:", "Traceback (most recent call last):")
        assert not [line for line in result.stdout.splitlines() if line.endswith(stacks)]
    finally:
        up_again(lab)


def test_killed_node_without_restarts_fails_fast_and_is_named(lab):
    result, seconds = run_with_fault(lab, ["--", *GPT, "--steps", "400"], "kill", "node1", after_steps=20)
    try:
        assert result.returncode == 137, result.stderr  # the lost node's SIGKILL, as docker kill sent it
        assert seconds < 60
        # one process per rank (the warm path): the lost node's rank is named too
        assert "run failed: rank 1 on node1 was lost first" in result.stderr and "node lost" in result.stderr
    finally:
        up_again(lab)


def test_partition_and_pause_are_seen_by_doctor_and_undone(lab, docker_client):
    labctl("fault", "--lab", lab, "partition", "node1", check=True)
    try:
        started = time.monotonic()
        report = labctl("doctor", "--lab", lab, "--json")
        assert time.monotonic() - started < 10
        assert report.returncode == 1
        bad = [f for f in json.loads(report.stdout)["findings"] if not f["ok"]]
        assert {f["check"] for f in bad} == {"rendezvous", "ports"}
        assert any(f["node"] == "node1" and "cannot reach the rendezvous" in f["message"] for f in bad)
    finally:
        labctl("fault", "--lab", lab, "heal", "node1", check=True)
    assert labctl("doctor", "--lab", lab).returncode == 0
    # The link going down flushed node1's neighbour table; heal gave its permanent entries back.
    nodes = json.loads(labctl("status", "--lab", lab, "--json", check=True).stdout)["nodes"]
    assert permanent_peers(docker_client, lab, nodes)["node1"]

    labctl("fault", "--lab", lab, "pause", "node2", check=True)
    try:
        assert docker_client.api.inspect_container(f"{lab}-node2")["State"]["Paused"] is True
    finally:
        labctl("fault", "--lab", lab, "unpause", "node2", check=True)
    assert docker_client.api.inspect_container(f"{lab}-node2")["State"]["Status"] == "running"
    assert labctl("run", "--lab", lab, "--", "-m", "trainer", "--epochs", "1").returncode == 0
