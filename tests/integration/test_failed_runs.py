"""A failed run explains itself in its last lines and exits with the failing rank's status (issue 19):
on a real 3-node lab, with tests/integration/scripts/fail_how.py failing one rank on purpose."""

import json
import re

import pytest

from conftest import REPO, SCRIPTS, labctl
from labctl.run.failures import CONSEQUENCES

pytestmark = pytest.mark.integration

FAIL_HOW = str(SCRIPTS / "fail_how.py")


def node_of(stdout: str, rank: int) -> str:
    """Where the rendezvous put `rank` this time: its `FAIL_HOW rank=R ... ready` line's prefix."""
    found = re.findall(rf"^\s*(node\d+) \| FAIL_HOW rank={rank} world=3 ready$", stdout, re.M)
    assert len(found) == 1, stdout
    return found[0]


def last_lines(result, n: int = 3) -> list[str]:
    return result.stderr.strip().splitlines()[-n:]


def test_sys_exit_3_exits_3_naming_the_rank_and_its_node(lab3):
    # Once per rank. That the status is 3 every time, which gloo's threads once made 134 in 3 runs of
    # 20, is test_warm.py's to repeat (12 runs warm, 3 under torchrun; start-up.md has 100 of each).
    name, _ = lab3
    for rank in range(3):
        result = labctl("run", "--lab", name, "--no-preflight", "--", FAIL_HOW, "exit", str(rank), "3")
        node = node_of(result.stdout, rank)
        headline, *_ = last_lines(result)
        assert result.returncode == 3, (rank, result.stdout[-2000:], result.stderr)
        assert re.match(rf"run failed: rank {rank} on {node} failed first \(\d\d:\d\d:\d\d\): exited with status 3$",
                        headline), (rank, result.stderr)
        assert last_lines(result)[-1].strip().startswith(f"logs: .lab/{name}/runs/"), result.stderr


def test_a_raised_exception_ends_the_run_with_its_message_and_no_torchrun_report(lab3):
    name, _ = lab3
    # under torchrun, whose agents' reports (ChildFailedError, Root Cause) the terminal is spared
    result = labctl("run", "--lab", name, "--launcher", "torchrun", "--no-preflight", "--", FAIL_HOW, "raise", "2")
    node = node_of(result.stdout, 2)
    assert result.returncode == 1
    assert last_lines(result)[0].startswith(f"run failed: rank 2 on {node} failed first (")
    assert last_lines(result)[0].endswith("ValueError: deliberate failure on rank 2")
    assert "failed (peer gone)" in last_lines(result)[1]
    terminal = result.stdout + result.stderr
    assert "[rank2]: ValueError: deliberate failure on rank 2" in terminal  # its own traceback stays
    assert "ChildFailedError" not in terminal and "Root Cause" not in terminal
    # The consequences' stacks are in the logs only. What a peer says depends on when it noticed: gloo's
    # "Connection closed by peer", or "reset by peer", a broken pipe (all "peer gone" to labctl); the
    # first was the only one here until a fresh clone's run on 2026-11-28 got another.
    peer_gone = CONSEQUENCES[0][0]
    assert not peer_gone.search(terminal), terminal[-2000:]
    logs = "".join(p.read_text() for p in (REPO / ".lab" / name / "runs" / "latest").glob("node*.log"))
    assert "ChildFailedError" in logs and peer_gone.search(logs), logs[-3000:]


def test_sigkill_exits_137_naming_the_node_and_the_signal(lab3):
    name, _ = lab3
    result = labctl("run", "--lab", name, "--no-preflight", "--", FAIL_HOW, "kill", "1")
    node = node_of(result.stdout, 1)
    assert result.returncode == 137, result.stderr
    assert f"rank 1 on {node} failed first" in last_lines(result)[0]
    assert "killed by SIGKILL (out of memory?" in last_lines(result)[0]


def test_timeout_exits_124_and_says_who_had_not_finished(lab3):
    name, _ = lab3
    result = labctl("run", "--lab", name, "--no-preflight", "--timeout-s", "8", "--", FAIL_HOW, "hang", "1")
    assert result.returncode == 124, result.stderr
    said = re.search(r"run failed: --timeout-s 8 reached: (.*) had not finished", result.stderr)
    assert said, result.stderr
    assert sorted(said.group(1).split(", ")) == [f"rank {r} on {node_of(result.stdout, r)}" for r in range(3)]


def test_json_is_one_document_on_success_and_on_failure(lab3):
    name, _ = lab3
    good = labctl("run", "--lab", name, "--no-preflight", "--json", "--", str(SCRIPTS / "plain_ddp.py"))
    doc = json.loads(good.stdout)
    assert good.returncode == 0 and doc["ok"] and doc["exit_status"] == 0 and doc["root_cause"] is None
    assert sorted(doc["nodes"]) == ["node0", "node1", "node2"] and "PLAIN_DDP" in good.stderr

    bad = labctl("run", "--lab", name, "--no-preflight", "--json", "--", FAIL_HOW, "exit", "0", "3")
    doc = json.loads(bad.stdout)
    assert bad.returncode == 3 and not doc["ok"] and doc["exit_status"] == 3
    assert doc["root_cause"]["rank"] == 0 and doc["root_cause"]["node"] == node_of(bad.stderr, 0)
    assert [f["consequence"] for f in doc["failed_after"]] == ["peer gone", "peer gone"]
    assert json.loads((REPO / ".lab" / name / "runs" / doc["run_id"] / "result.json").read_text()) == doc
