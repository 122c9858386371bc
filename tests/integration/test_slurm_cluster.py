"""The lab as a Slurm cluster (issue 17), for real: slurmctld, slurmd and munged in the nodes, jobs
through salloc and sbatch, torch.distributed across them.

One 3-node lab for the module, with tqdm (the project's packages, issue 39). It checks that `slurm
run` trains to the same loss as `labctl run` on the same lab, that the exported script is the one
`submit` ran and has the lab's lock beside it, that a job's ranks import the lock's tqdm, that a batch
job can be followed and cancelled with nothing left running, that a failing rank and a killed node
are named, and that `down` leaves nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PS, REPO, drop_lab, lab_resources, labctl, new_lab_name, still_running, wait_for

TRAIN = ["-m", "trainer", "--workload", "gpt", "--steps", "20"]


@pytest.fixture(scope="module")
def lab(docker_client, node_image):
    name = new_lab_name()
    up = labctl("up", "--lab", name, "--nodes", "3", "--scheduler", "slurm", "--with", "tqdm", timeout=600)
    assert up.returncode == 0, up.stderr
    assert "slurm: 3 nodes idle, controller node0" in up.stderr
    yield name
    drop_lab(name)
    assert lab_resources(docker_client, name) == {"containers": [], "networks": [], "volumes": []}


def slurm(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return labctl("slurm", *args, timeout=timeout)


def test_slurm_run_trains_to_the_same_loss_as_labctl_run(lab):
    done = slurm("run", "--lab", lab, "-N", "3", "--json", "--", *TRAIN)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    summary = result["summary"]
    assert result["ok"] and summary["world_size"] == 3 and summary["replicas_consistent"]
    assert json.loads((Path(result["run_dir"]) / "job.json").read_text())["job_id"]
    plain = labctl("run", "--lab", lab, "--json", "--", *TRAIN, timeout=300)
    assert plain.returncode == 0, plain.stderr
    reference = json.loads(plain.stdout)["summary"]
    assert (summary["final_loss"], summary["param_checksum"]) == (reference["final_loss"], reference["param_checksum"])
    # Saved as `labctl run` saves a run: a log per node, readable with `labctl logs`.
    run_id = result["run_dir"].rsplit("/", 1)[-1]
    logs = labctl("logs", "--lab", lab, "--run", run_id, "node2", check=True).stdout
    assert "[rank" in logs and "node2" in logs


def test_the_exported_script_is_the_one_submit_ran_and_a_batch_job_is_followed(lab, tmp_path):
    submitted = slurm("submit", "--lab", lab, "--json", "--", "-m", "trainer", "--workload", "toy")
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    exported = tmp_path / "job.sbatch"
    slurm("export", "--lab", lab, "-o", str(exported), "--", "-m", "trainer", "--workload", "toy").check_returncode()
    ran = (REPO / job["run_dir"] / "job.sbatch").read_text()
    assert exported.read_text() == ran and "--require-hashes -r" in ran
    for lock in ("pylock.job.toml", "job.requirements.txt"):  # beside both, the lab's lock
        assert (tmp_path / lock).read_text() == (REPO / job["run_dir"] / lock).read_text()
    assert "tqdm==" in (tmp_path / "job.requirements.txt").read_text()
    deadline = time.monotonic() + 120
    state = {}
    while time.monotonic() < deadline:
        state = json.loads(slurm("status", "--lab", lab, job["job_id"], "--json").stdout)
        if state["JobState"] not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            break
        time.sleep(0.5)
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", state
    assert state["NodeList"] == "node[0-2]"
    output = slurm("logs", "--lab", lab, job["job_id"]).stdout
    assert '"replicas_consistent": true' in output and output.count("SUMMARY") == 1


def test_a_jobs_ranks_import_the_labs_packages(lab):
    done = slurm("run", "--lab", lab, "-N", "3", "--json", "--", "examples/packages/tqdm_ddp.py", "--steps", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)["summary"]
    assert summary["same_tqdm"] and len(summary["tqdm"]) == 3, summary


def test_a_cancelled_job_leaves_nothing_running(lab):
    submitted = slurm("submit", "--lab", lab, "--json", "--", "tests/integration/scripts/fail_how.py", "hang", "0")
    job = json.loads(submitted.stdout)["job_id"]
    assert wait_for(lambda: json.loads(slurm("status", "--lab", lab, job, "--json").stdout)["JobState"] == "RUNNING",
                    60, 0.5), "the job never ran"
    cancelled = slurm("cancel", "--lab", lab, job)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stderr, cancelled.stderr
    for node in ("node0", "node1", "node2"):
        ps = labctl("exec", "--lab", lab, node, "--", *PS, check=True).stdout
        left = still_running(ps, "fail_how|torchrun")
        assert left == [], f"{node} still runs: {left}"


def test_a_failing_rank_is_named_with_its_node_and_its_status(lab):
    """As `labctl run` ends a run: the rank's own exit status, the same last lines, the same document."""
    failed = slurm("run", "--lab", lab, "-N", "3", "--json", "--", "tests/integration/scripts/fail_how.py", "exit", "2")
    assert failed.returncode == 3, failed.stderr  # fail_how's rank 2 exits 3
    result = json.loads(failed.stdout)
    logs = {node: labctl("logs", "--lab", lab, node).stdout for node in ("node0", "node1", "node2")}
    where = next(node for node, text in logs.items() if "FAIL_HOW rank=2 " in text)
    root = result["root_cause"]
    assert (root["node"], root["rank"], root["exit_status"]) == (where, 2, 3), result
    assert f"run failed: rank 2 on {where} failed first" in failed.stderr and "Traceback" not in failed.stderr
    plain = labctl("run", "--lab", lab, "--json", "--", "tests/integration/scripts/fail_how.py", "exit", "2")
    assert plain.returncode == 3 and sorted(json.loads(plain.stdout)) == sorted(result)


def test_execs_run_as_the_user_and_the_daemons_as_root(lab):
    who = labctl("exec", "--lab", lab, "node1", "--", "id", "-u", check=True).stdout.strip()
    assert who == str(int(os.environ.get("SUDO_UID", os.getuid())))
    daemons = labctl("exec", "--lab", lab, "node0", "--", "ps", "-o", "user=,comm=", "-C", "slurmctld,slurmd,munged",
                     check=True).stdout.split()
    assert sorted(zip(daemons[::2], daemons[1::2])) == [("munge", "munged"), ("root", "slurmctld"),
                                                         ("root", "slurmd")], daemons


def test_a_plain_lab_is_not_a_slurm_cluster(lab3):
    name, _ = lab3
    refused = slurm("run", "--lab", name, "--", "-m", "trainer")
    assert refused.returncode == 1 and "is not a Slurm cluster" in refused.stderr
    assert "--scheduler slurm" in refused.stderr and "Traceback" not in refused.stderr


def test_doctor_names_a_node_whose_slurmd_died_and_up_restarts_it(lab, docker_client):
    docker_client.containers.get(f"{lab}-node1").exec_run(["pkill", "-x", "slurmd"])  # as the node's root
    deadline = time.monotonic() + 90
    while True:  # Slurm marks it DOWN once it misses SlurmdTimeout (10 s) of pings
        doctor = labctl("doctor", "--lab", lab, "--json")
        found = [f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "slurm"]
        if not found[0]["ok"] or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert doctor.returncode == 1 and [(f["node"], f["ok"]) for f in found] == [("node1", False)], found
    assert "node1 down" in found[0]["message"] and "labctl up" in found[0]["fix"]
    up = labctl("up", "--lab", lab, timeout=300)
    assert up.returncode == 0 and "slurm: 3 nodes idle" in up.stderr, up.stderr
    healthy = json.loads(labctl("doctor", "--lab", lab, "--json", check=True).stdout)["findings"]
    assert [f["ok"] for f in healthy if f["check"] == "slurm"] == [True]


def kill_during(lab: str, args: list[str], ready: tuple[str, ...] = ()) -> dict:
    """`slurm run ARGS` with node2 killed once the job's run folder has files matching every pattern
    of `ready` (none: once node2 runs the job's script): the JSON result. `labctl up` then brings
    node2 back, IDLE again (ReturnToService=2)."""
    runs = REPO / ".lab" / lab / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    job = subprocess.Popen([sys.executable, "-m", "labctl", "slurm", "run", "--lab", lab, "--json", *args], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    def started() -> bool:
        if not ready:
            return labctl("exec", "--lab", lab, "node2", "--", "pgrep", "-f", "fail_how.py").returncode == 0
        new = set(runs.iterdir()) - before if runs.is_dir() else set()
        return any(all(any(run.glob(pattern)) for pattern in ready) for run in new if run.is_dir())

    while not started():
        assert time.monotonic() < deadline and job.poll() is None, f"the job never wrote {ready}"
        time.sleep(0.5)
    labctl("fault", "kill", "node2", "--lab", lab, check=True)
    out, err = job.communicate(timeout=180)
    result = json.loads(out)
    result["returncode"] = job.returncode
    up = labctl("up", "--lab", lab, timeout=300)
    assert up.returncode == 0 and "slurm: 3 nodes idle" in up.stderr, up.stderr
    return result


def test_an_elastic_job_goes_on_without_a_killed_node(lab):
    result = kill_during(lab, ["-N", "3", "--nnodes", "2:3", "--max-restarts", "2", "--", "-m", "trainer",
                               "--workload", "gpt", "--threads", "1", "--ckpt-every", "10", "--steps", "120",
                               "--global-batch", "48"], ready=("metrics-rank2.jsonl", "checkpoints/step-*.pt"))
    assert result["returncode"] == 0 and result["ok"], result
    summary = result["summary"]
    assert summary["world_size"] == 2 and summary["steps"] == 120 and summary["resumed_from_step"] >= 10, summary
    assert summary["accum_steps"] == 3 and summary["replicas_consistent"]  # the same global batch over 2 ranks
    assert result["nodes"]["node2"]["exit_status"] not in (0, None), result["nodes"]


def test_a_killed_node_is_named_and_comes_back(lab):
    """Slurm sets it DOWN (SlurmdTimeout 10 s), the job fails naming it, and `labctl up` brings it back."""
    result = kill_during(lab, ["-N", "3", "--", "tests/integration/scripts/fail_how.py", "loop", "-1"])
    assert result["returncode"] != 0 and not result["ok"], result
    assert result["root_cause"]["node"] == "node2" and "went down" in result["root_cause"]["lost"], result
