"""The pytest plugin on a real engine, as a user's CI runs it: the example project's suite
(examples/ddp-ci) in a pytest session of its own. It passes on one lab for its three tests; its
failing examples name the node and carry its log into the report and the JUnit file (and a hang
comes back with doctor's findings); under `-n 2` each worker has a lab of its own, side by side.
Every lab a session made is gone when it ends, unless kept on purpose; and the lab of a session
killed with -9 is swept by the next one (with labctl's gc: the owner labels)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


from conftest import REPO, drop_lab, lab_resources, labctl

EXAMPLE = REPO / "examples" / "ddp-ci"
FAILING = EXAMPLE / "tests" / "test_ddpci_failing_example.py"
NOTHING = {"containers": [], "networks": [], "volumes": []}


def example_pytest(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`pytest examples/ddp-ci ...` from the repository, the plugin loaded by module (installed or not,
    its entry point is blocked, so it is registered once)."""
    clean = {key: value for key, value in os.environ.items()
             if not key.startswith(("PYTEST_", "DDPLAB_OWNER_", "GITHUB_"))}
    clean.update(PYTHONPATH=str(REPO), COLUMNS="200", **(env or {}))
    return subprocess.run([sys.executable, "-m", "pytest", str(EXAMPLE), "-p", "labctl.pytest_plugin", "-p", "no:ddplab",
                           "-p", "no:cacheprovider", "-v", *args], cwd=REPO, env=clean, capture_output=True, text=True,
                          timeout=timeout)


def labs_of(output: str) -> list[str]:
    """The labs the session names in its summary (`ddplab: labs ...`, with -v)."""
    found = re.search(r"^ddplab: labs (.*)$", output, re.M)
    assert found, f"no list of labs in the output:\n{output[-3000:]}"
    return found.group(1).split(", ")


def test_the_example_suite_passes_on_one_lab_and_leaves_nothing(docker_client, node_image):
    result = example_pytest()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert re.search(r"^ddplab: 1 lab for 3 tests \(bring-up [\d.]+ s, teardown [\d.]+ s\)$", output, re.M), output[-3000:]
    assert "3 passed, 2 skipped" in output  # the failing examples stay out unless asked for
    for lab in labs_of(output):
        assert lab_resources(docker_client, lab) == NOTHING


def test_the_failing_examples_name_the_node_in_the_report_and_the_junit_file(docker_client, node_image, tmp_path):
    junit = tmp_path / "junit.xml"
    result = example_pytest("-k", "failing", "--run-failing-example", "--ddplab-keep-failed", f"--junitxml={junit}",
                            "-o", "junit_logging=system-out", env={"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(REPO)})
    output = result.stdout + result.stderr
    labs = labs_of(output)
    try:
        assert result.returncode == 1, output[-5000:]
        assert "2 failed" in output
        # The terminal: the root cause, the failing rank's own traceback, every node's log.
        assert re.search(r"RunFailed: rank 1 on node1 failed first \([\d:]+\): ValueError: deliberate failure on "
                         r"node1 \(rank 1\) at step 3", output)
        assert "[rank1]: ValueError: deliberate failure on node1 (rank 1) at step 3" in output
        assert all(f"Captured stdout call: ddplab {node} log" in output for node in ("node0", "node1", "node2"))
        # A hang: stopped by the run's timeout, with what doctor found on the lab.
        assert "--timeout-s 15 reached" in output and "doctor, asked after the timeout" in output
        # GitHub Actions: an annotation on the line of the test that made the failing run.
        line = next(i for i, text in enumerate(FAILING.read_text().splitlines(), 1) if '"--fail-node", "node1"' in text)
        assert (f"::error file=examples/ddp-ci/tests/test_ddpci_failing_example.py,line={line},title=ddplab%3A "
                "tests/test_ddpci_failing_example.py%3A%3Atest_a_failing_rank_is_named_in_the_report::rank 1 on node1 "
                "failed first (") in output
        # The labs of failed tests were kept, and the session said how to reach them.
        assert len(labs) == 2 and all(f"lab {lab} was kept for debugging" in output for lab in labs)
        assert all(lab_resources(docker_client, lab)["containers"] for lab in labs)

        case = next(tc for tc in ET.parse(junit).iter("testcase") if tc.get("name").startswith("test_a_failing_rank"))
        failure = case.find("failure")
        assert failure.get("message").startswith("labctl.errors.RunFailed: rank 1 on node1 failed first (")
        assert "[rank1]: ValueError: deliberate failure on node1" in failure.text
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert props["ddplab_root_node"] == "node1" and props["ddplab_root_rank"] == "1"
        assert props["ddplab_root_error"] == "ValueError: deliberate failure on node1 (rank 1) at step 3"
        assert Path(props["ddplab_log_node1"]).is_file()
        system_out = case.find("system-out").text
        assert "ddplab node1 log" in system_out and "[rank 2/3 node2] step 3/10" in system_out
    finally:
        for lab in labs:
            drop_lab(lab)
            for workspace in (REPO, EXAMPLE):  # wherever the session found its workspace
                shutil.rmtree(workspace / ".lab" / lab, ignore_errors=True)


def test_two_xdist_workers_each_have_a_lab_of_their_own(docker_client, node_image):
    result = example_pytest("-n", "2", "-k", "same_parameters or link_rate")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "2 passed" in output and re.search(r"^ddplab: 2 labs for 2 tests ", output, re.M), output[-3000:]
    labs = labs_of(output)
    assert sorted(lab.rsplit("-", 2)[1] for lab in labs) == ["gw0", "gw1"]
    assert len({lab.split("-")[1] for lab in labs}) == 1  # one session id, from the controller
    for lab in labs:
        assert lab_resources(docker_client, lab) == NOTHING


HOLDING = '''
import time


def test_hold(ddp_lab):
    print("UP", ddp_lab.name, flush=True)
    time.sleep(600)


def test_next(ddp_lab):
    pass
'''


def test_the_labs_of_a_killed_session_are_swept_by_the_next(docker_client, node_image, tmp_path):
    (tmp_path / "test_holding.py").write_text(HOLDING)
    argv = [sys.executable, "-m", "pytest", "-p", "labctl.pytest_plugin", "-p", "no:ddplab", "-p", "no:cacheprovider",
            "-s", "--ddplab-nodes", "1", "test_holding.py"]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "DDPLAB_OWNER_"))}
    env.update(PYTHONPATH=str(REPO))
    holder = subprocess.Popen([*argv, "-k", "hold"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    lab = None
    try:
        for line in holder.stdout:
            if line.startswith("UP ") or " UP " in line:
                lab = line.split("UP ", 1)[1].strip()
                break
        assert lab, "the holding session never brought its lab up"
        holder.kill()  # -9: no teardown, no session end; its lab stays behind
        holder.wait(timeout=30)
        assert lab_resources(docker_client, lab)["containers"] == [f"{lab}-node0"]
        after = subprocess.run([*argv, "-k", "next"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert after.returncode == 0, after.stdout + after.stderr
        swept = re.search(r"^ddplab: removed \d+ labs? of sessions that had died: (.*)$", after.stdout, re.M)
        assert swept and lab in swept.group(1).split(", "), after.stdout
        assert lab_resources(docker_client, lab) == NOTHING
        left = json.loads(labctl("gc", "--dry-run", "--json", check=True).stdout)
        assert [v["lab"] for v in left if v["remove"]] == [], left  # `labctl gc` finds nothing after
    finally:
        if holder.poll() is None:
            holder.kill()
        if lab:
            drop_lab(lab)
