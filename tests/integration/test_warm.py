"""The warm path (issue 29), for real: each node's fork server forks a run's workers, which see
exactly the world torchrun gives its workers, leave with their own exit status every time, are
stopped like any run's, and start cold where a node has no server."""

from __future__ import annotations

import json
import time

import pytest

from conftest import REPO, labctl, summary_of
from labctl.api import Lab

# Different by nature between two runs, or between the store torchrun's rank-0 agent hosts and the
# run's own store that the warm path's workers join (see labctl.run.launch.worker_env).
PER_RUN = {"DDPLAB_RUN_ID", "DDPLAB_RUN_DIR", "PET_RDZV_ID", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
           "MASTER_ADDR", "MASTER_PORT"}


def dumps(lab: str, launcher: str) -> dict[str, dict]:
    out = labctl("run", "--lab", lab, "--launcher", launcher, "--nproc-per-node", "2", "--",
                 "tests/integration/scripts/env_dump.py", "an arg", check=True).stdout
    found = [json.loads(line.split("ENV_DUMP ", 1)[1]) for line in out.splitlines() if "ENV_DUMP {" in line]
    return {d["env"]["RANK"]: d for d in found}


def test_a_script_sees_torchruns_environment_key_by_key(lab2):
    torchrun, warm = dumps(lab2, "torchrun"), dumps(lab2, "warm")
    assert sorted(torchrun) == sorted(warm) == ["0", "1", "2", "3"]
    for rank in torchrun:
        before, now = torchrun[rank], warm[rank]
        assert sorted(before["env"]) == sorted(now["env"]), rank  # the same keys, none more, none fewer
        differ = {k for k in before["env"] if before["env"][k] != now["env"][k]}
        assert differ <= PER_RUN, {k: (before["env"][k], now["env"][k]) for k in differ - PER_RUN}
        # and Python started it the same way: argv, __name__, __file__, sys.path[0], the directory
        assert {k: before[k] for k in ("argv", "name", "file", "path0", "cwd")} == \
               {k: now[k] for k in ("argv", "name", "file", "path0", "cwd")}
        assert now["argv"][1:] == ["an arg"] and now["name"] == "__main__"


def test_the_trainer_ends_the_same_on_the_warm_path_as_under_torchrun(lab2):
    args = ["--", "-m", "trainer", "--workload", "gpt", "--steps", "10"]
    warm = summary_of(labctl("run", "--lab", lab2, "--launcher", "warm", *args, check=True).stdout)
    cold = summary_of(labctl("run", "--lab", lab2, "--launcher", "torchrun", *args, check=True).stdout)
    assert (warm["final_loss"], warm["param_checksum"]) == (cold["final_loss"], cold["param_checksum"])
    assert warm["replicas_consistent"] and warm["threads"] == cold["threads"] == 1


@pytest.mark.parametrize("launcher, runs", [("warm", 12), ("torchrun", 3)])
def test_a_rank_that_calls_sys_exit_3_makes_the_run_exit_3_every_time(lab2, launcher, runs):
    """The gloo-thread race at interpreter exit once turned 3 into 134 in 3 runs of 20; worker.py
    leaves without that teardown on every path (docs/explanation/start-up.md gives 100 runs of each)."""
    lab = Lab(lab2, workspace=REPO)
    statuses = [lab.run("tests/integration/scripts/fail_how.py", "exit", "1", launcher=launcher, check=False,
                        echo=False, preflight=False).exit_status for _ in range(runs)]
    assert statuses == [3] * runs


def test_a_signal_is_still_reported_as_one(lab2):
    result = Lab(lab2, workspace=REPO).run("tests/integration/scripts/fail_how.py", "segv", "1", launcher="warm",
                                           check=False, echo=False)
    assert result.exit_status == 128 + 11 and result.verdict.root.rank == 1, result.explain()


def test_a_node_without_a_fork_server_starts_its_workers_cold(lab2, docker_client):
    docker_client.containers.get(f"{lab2}-node1").exec_run(["pkill", "-f", "serve /tmp/ddplab/fork-"])
    try:
        out = labctl("run", "--lab", lab2, "--", "tests/integration/scripts/env_dump.py", check=True).stdout
        assert out.count("ENV_DUMP {") == 2
    finally:
        up = labctl("up", "--lab", lab2, check=True)  # starts the missing server again
        assert "no fork server" not in up.stderr


def test_a_timed_out_warm_run_is_stopped_everywhere_and_leaves_nothing(lab2, docker_client):
    result = labctl("run", "--lab", lab2, "--timeout-s", "8", "--", "tests/integration/scripts/fail_how.py", "hang",
                    "0")
    assert result.returncode == 124, result.stderr
    for node in ("node0", "node1"):
        container = docker_client.containers.get(f"{lab2}-{node}")
        left = container.exec_run(["sh", "-c", "ls -A /tmp/ddplab/workers; ps -eo args | grep '[f]ail_how' || true"])
        left = left.output.decode()
        assert left.strip() == "", f"{node} still has: {left}"


def test_a_script_edited_between_two_runs_runs_as_edited(lab2, tmp_path):
    """Nothing of the workspace is preloaded: the fork server forks, the script and its imports are read anew."""
    folder = REPO / ".lab" / lab2 / "edits"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "helper_mod.py").write_text("VALUE = 1\n")
    (folder / "edited.py").write_text("import helper_mod\nprint('EDITED', helper_mod.VALUE, flush=True)\n")
    first = labctl("run", "--lab", lab2, "--", str(folder / "edited.py"), check=True).stdout
    time.sleep(0.01)
    (folder / "helper_mod.py").write_text("VALUE = 2\n")
    second = labctl("run", "--lab", lab2, "--", str(folder / "edited.py"), check=True).stdout
    assert "EDITED 1" in first and "EDITED 2" in second and "EDITED 1" not in second
