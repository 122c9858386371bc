"""The commands that follow docker's and compose's conventions, on one 2-node lab: `exec` into a
node, `logs --tail` and `logs -f` on a run, `ls` listing the lab, and `down` naming the volume it
keeps (last: it takes the lab down)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, SCRIPTS, labctl, module_lab

RESULT_FILE = "result.json"  # labctl.run.result.RESULT_FILE: the executor writes it when a run ends


@pytest.fixture(scope="module")
def lab2(docker_client, node_image):
    """A 2-node lab of this module's own, not the shared one of conftest's `lab2`: the last test takes
    it down."""
    yield from module_lab(2)


def test_exec_runs_in_the_node_with_its_exit_status(lab2):
    result = labctl("exec", "--lab", lab2, "node1", "--", "hostname", check=True)
    assert result.stdout == "node1\n"
    assert labctl("exec", "--lab", lab2, "node1", "--", "sh", "-c", "exit 7").returncode == 7
    env = labctl("exec", "--lab", lab2, "node0", "--", "sh", "-c", "echo $NODE_RANK $PWD", check=True).stdout
    assert env.split() == ["0", str(REPO)]  # the node's env file, in the workspace
    piped = subprocess.run([sys.executable, "-m", "labctl", "exec", "--lab", lab2, "node0", "--", "cat"], cwd=REPO,
                           input="through stdin\n", capture_output=True, text=True, timeout=60)
    assert (piped.returncode, piped.stdout) == (0, "through stdin\n")


def test_exec_refuses_an_unknown_node_and_a_lab_that_is_not_up(lab2):
    unknown = labctl("exec", "--lab", lab2, "node5", "--", "hostname")
    assert unknown.returncode == 2 and f"no node 'node5' in lab {lab2}" in unknown.stderr
    assert "nodes: node0, node1" in unknown.stderr
    missing = labctl("exec", "--lab", f"{lab2}-none", "node0", "--", "hostname")
    assert missing.returncode == 1 and "is not up" in missing.stderr and "Traceback" not in missing.stderr


def test_logs_tail_and_follow_a_run(lab2):
    ticker = [sys.executable, "-m", "labctl", "run", "--lab", lab2, "--launcher", "static", "--",
              str(SCRIPTS / "ticker.py"), "12", "0.5"]
    run = subprocess.Popen(ticker, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    follow = None
    try:
        for line in run.stdout:  # once both nodes tick, the run folder and its logs exist
            if "tick 1 of node" in line:
                break
        follow = subprocess.Popen([sys.executable, "-m", "labctl", "logs", "--lab", lab2, "-f", "--tail", "1"],
                                  cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        run_out = run.communicate(timeout=120)[0]
        assert run.returncode == 0, run_out
        run_dir = (REPO / ".lab" / lab2 / "runs" / "latest").resolve()
        assert (run_dir / RESULT_FILE).exists(), "the executor wrote no result file, which ends `logs -f`"
        out, err = follow.communicate(timeout=30)  # it ends by itself: the run's result file is there
    finally:
        for proc in (run, follow):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert follow.returncode == 0, err
    for node in ("node0", "node1"):  # everything from the last line there when it started, in order
        ticks = [int(line.split()[1]) for line in out.splitlines() if line.endswith(f"of {node}")]
        assert ticks == list(range(ticks[0], 12)) and ticks[0] <= 8, out  # and it saw lines come
    assert "==> node0 <==" in out and "==> node1 <==" in out

    tail = labctl("logs", "--lab", lab2, "node0", "--tail", "2", check=True).stdout
    assert tail.splitlines() == ["tick 10 of node0", "tick 11 of node0"]  # one node: no header, as `tail` prints one file
    assert labctl("logs", "--lab", lab2, "--tail", "-1").returncode == 2
    ready = labctl("logs", "--lab", lab2, "--container", "--tail", "1", check=True).stdout.splitlines()
    assert ready[0] == "==> node0 <==" and ready[1].startswith("DDPLAB_READY") and len(ready) == 4


def test_ls_lists_the_lab(lab2):
    labs = {lab["lab"]: lab for lab in json.loads(labctl("ls", "--json", check=True).stdout)}
    mine = labs[lab2]
    assert (mine["running"], mine["nodes"], mine["workspace"]) == (2, 2, str(REPO))
    assert mine["shaping"] == {"node0": "unshaped", "node1": "unshaped"}
    assert 0 <= mine["age_s"] < 3600 and mine["volumes"] == [f"{lab2}-shared"]
    row = next(line for line in labctl("ls", check=True).stdout.splitlines() if f" {lab2} " in line)
    assert "2/2" in row and "unshaped" in row


def test_down_names_the_volume_it_keeps(lab2):
    result = labctl("down", "--lab", lab2, check=True)
    message = " ".join(result.stderr.split())
    assert f"lab {lab2}: removed 2 containers, 1 network; kept volume {lab2}-shared" in message
    assert f"`labctl down --lab {lab2} --volumes` removes it" in message
    after = {lab["lab"]: lab for lab in json.loads(labctl("ls", "--json", check=True).stdout)}[lab2]
    assert (after["nodes"], after["volumes"]) == (0, [f"{lab2}-shared"])
    result = labctl("down", "--lab", lab2, "--volumes", check=True)
    assert "kept" not in result.stderr and "1 volume" in result.stderr
