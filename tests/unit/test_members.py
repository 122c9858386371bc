"""Which nodes each round of an elastic run had: worker.py's line per worker in the run's folder
(run here as a node runs it, `python -c TEXT SCRIPT`), and what `labctl run` says of a first round
that formed without some nodes (labctl.run.result.first_round_note)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labctl import remote
from labctl.remote import worker
from labctl.run import result as result_mod
from labctl.run.launch import RUN_DIR_VAR, Launch
from labctl.run.result import MEMBERS, Outcome, RunResult, first_round_note

WORKER = remote.load("worker.py")
SCRIPT = "import sys; print(sorted(m for m in ('json', 'locale') if m in sys.modules)); sys.exit(3)"


def run_worker(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "script.py").write_text(SCRIPT)
    clean = {k: v for k, v in os.environ.items() if k not in ("GROUP_WORLD_SIZE", RUN_DIR_VAR)}
    return subprocess.run([sys.executable, "-c", WORKER, str(tmp_path / "script.py")], env={**clean, **env},
                          capture_output=True, text=True, timeout=30)


def test_the_constants_are_labctls():
    assert worker.MEMBERS == result_mod.MEMBERS and f'"{RUN_DIR_VAR}"' in WORKER


def test_a_worker_under_torchruns_contract_adds_its_line_and_the_script_sees_nothing_of_it(tmp_path):
    env = {RUN_DIR_VAR: str(tmp_path), "GROUP_WORLD_SIZE": "2", "RANK": "3", "GROUP_RANK": "1",
           "TORCHELASTIC_RESTART_COUNT": "1"}
    first, second = run_worker(tmp_path, **env), run_worker(tmp_path, **{**env, "RANK": "2", "GROUP_RANK": "0"})
    assert (first.returncode, first.stdout) == (second.returncode, second.stdout) == (3, "[]\n"), first.stderr
    lines = [json.loads(line) for line in (tmp_path / MEMBERS).read_text().splitlines()]
    host, times = os.uname().nodename, [line.pop("time") for line in lines]
    assert lines == [{"host": host, "rank": 3, "group_rank": 1, "restart": 1, "group_world_size": 2},
                     {"host": host, "rank": 2, "group_rank": 0, "restart": 1, "group_world_size": 2}]
    assert time.time() - 30 < times[0] <= times[1] <= time.time()


@pytest.mark.parametrize("env", [{"GROUP_WORLD_SIZE": "2"}, {RUN_DIR_VAR: "RUN"},
                                 {RUN_DIR_VAR: "RUN/missing", "GROUP_WORLD_SIZE": "2"}])
def test_without_the_contract_or_a_folder_to_write_to_nothing_is_added_and_the_script_runs_alike(tmp_path, env):
    env = {k: v.replace("RUN", str(tmp_path)) for k, v in env.items()}
    done = run_worker(tmp_path, **env)
    assert (done.returncode, done.stdout) == (3, "[]\n"), done.stderr
    assert not (tmp_path / MEMBERS).exists() and not (tmp_path / "missing").exists()


def member(host: str, at: float, size: int) -> dict:
    return {"host": host, "rank": 0, "group_rank": 0, "restart": 0, "group_world_size": size, "time": 1000 + at}


def test_first_workers_on_every_node_say_nothing():
    assert first_round_note([member(f"node{i}", 0.1 * i, 3) for i in range(3)], 3) is None
    assert first_round_note([], 3) is None  # a static run, or lines that could not be written
    # a node lost later is the lost-node line's to say, not this one's
    assert first_round_note([member(f"node{i}", 0.1 * i, 3) for i in range(3)] + [member("node0", 20, 2)], 3) is None


def test_first_workers_without_a_node_say_which_and_when_the_others_came():
    # membership changes cost no restart: torchrun's restart count stays 0, so only the times tell the worlds apart
    late = [member("node1", 0.2, 2), member("node0", 0, 2)] + [member(f"node{i}", 12.3 + i, 3) for i in range(3)]
    assert first_round_note(late, 3) == (
        "the run's first workers started on 2 of 3 nodes (node0, node1); node2 joined 14.3 s later, and every node "
        "restarted its workers to let it in (an agent that comes after the rendezvous's last call waits for the "
        "next round)")
    never = first_round_note([member("node0", 0, 2), member("node1", 0.1, 2)], 3)
    assert never.startswith("the run's first workers started on 2 of 3 nodes (node0, node1); 1 never joined (")
    # the size is the world's own (GROUP_WORLD_SIZE), whoever's lines came back
    assert first_round_note([member("node1", 0, 2)], 3).startswith("the run's first workers started on 2 of 3 nodes "
                                                                  "(node1); 1 never joined")


def test_only_an_elastic_run_reads_its_members(tmp_path):
    (tmp_path / MEMBERS).write_text("\n".join(json.dumps(member(f"node{i}", i, 2)) for i in range(2)) + "\n")
    outcomes = [Outcome(Launch(f"node{i}", f"node{i}", ["x"], {}), exit_code=0) for i in range(3)]
    assert RunResult(tmp_path, outcomes, None).first_round_note() is None
    assert RunResult(tmp_path, outcomes, None, min_nodes=2).first_round_note().startswith(
        "the run's first workers started on 2 of 3 nodes (node0, node1); 1 never joined")


def test_lines_that_are_not_a_workers_are_passed_over(tmp_path):
    good = [member(f"node{i}", i, 2) for i in range(2)]
    (tmp_path / MEMBERS).write_text("not json\n" + json.dumps(good[0]) + '\n{"host": "x"}\n[1]\n{"tru\n'
                                    + json.dumps(good[1]) + "\n")
    outcomes = [Outcome(Launch(f"node{i}", f"node{i}", ["x"], {}), exit_code=0) for i in range(3)]
    assert RunResult(tmp_path, outcomes, None, min_nodes=2).members() == good
