"""The Slurm lab's pure parts: slurm.conf and the job script against golden files (UPDATE_GOLDEN=1
to accept a change), the Compose settings of a Slurm node, the setting, and how a job's output is
read: srun's task labels to node names, the job id, and which node failed, from recorded lines."""

from __future__ import annotations

import json
import queue
import subprocess
from pathlib import Path

import pytest
import yaml
from test_render import check_golden

from labctl.engine.labels import LABEL_EXEC_USER, LABEL_SCHEDULER
from labctl.errors import ConfigError
from labctl.lab.compose import ComposePlan, build_compose, load_template, render_compose
from labctl.slurm import jobs
from labctl.slurm.conf import SlurmNode, build_slurm_conf, cluster_name
from labctl.slurm.script import JobSpec, build_job_script, check_time
from labctl.spec.labspec import LabSpec, resolve_config

NODES = [SlurmNode(f"node{i}", f"172.28.5.{10 + i}") for i in range(3)]
TRAIN = ("-m", "trainer", "--workload", "gpt", "--steps", "50")


def test_slurm_conf_golden():
    check_golden("slurm.conf", build_slurm_conf("demo", NODES, cpus=2))


def test_slurm_conf_names_every_node_and_the_controller():
    conf = build_slurm_conf("my-lab", NODES[:2], cpus=8)
    assert "SlurmctldHost=node0(172.28.5.10)" in conf and "ClusterName=ddplab_my_lab" in conf
    assert [line.split()[0] for line in conf.splitlines() if line.startswith("NodeName=")] == ["NodeName=node0",
                                                                                              "NodeName=node1"]
    assert "NodeName=node1 NodeAddr=172.28.5.11 NodeHostname=node1 CPUs=8 State=UNKNOWN" in conf
    assert cluster_name("Lab-2") == "ddplab_lab_2"


def test_job_script_golden_and_valid_bash(tmp_path):
    text = build_job_script(JobSpec(TRAIN, nodes=3, nproc_per_node=2, time="01:00:00", account="ml"))
    check_golden("job.sbatch", text)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_job_script_takes_everything_cluster_specific_from_slurm():
    text = build_job_script(JobSpec(TRAIN, nodes=4))
    assert "#SBATCH --nodes=4" in text and "##SBATCH --partition=CHANGE-ME" in text
    for variable in ("SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_JOB_ID", "SLURM_NODEID"):
        assert f"${variable}" in text or f'"${variable}"' in text
    assert "172.28" not in text and "node0" not in text  # no address or name of the lab
    assert text.rstrip().endswith("torchrun-on-node -m trainer --workload gpt --steps 50")
    quoted = build_job_script(JobSpec(("train.py", "--name", "two words"), nodes=2))
    assert quoted.rstrip().endswith("torchrun-on-node train.py --name 'two words'")


def test_job_script_runs_under_a_fake_srun(tmp_path):
    """The script's torchrun line, as each node would run it: srun and scontrol stubbed, torchrun echoing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stubs = {
        "scontrol": 'printf "node0\\nnode1\\n"',
        # srun --kill-on-bad-exit=1 --label bash -c CMD NAME ARGS...: run it as task 1 of 2 on node1
        "srun": 'shift 2; SLURM_NODEID=1 exec "$@"',
        "torchrun": 'echo "torchrun $*"',
    }
    for name, body in stubs.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(build_job_script(JobSpec(TRAIN, nodes=2)))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_JOB_ID": "42", "PET_NNODES": "7", "PET_RDZV_ENDPOINT": "elsewhere:1"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        "torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=node0:29500 --rdzv-id=42 "
        "--rdzv-conf=is_host=false -m trainer --workload gpt --steps 50")


@pytest.mark.parametrize("text", ["30", "00:30:00", "1-00:00:00", "2-12", "90:00"])
def test_slurm_times(text):
    assert check_time(text) == text


@pytest.mark.parametrize("text", ["", "1h", "-5", "00:30:00:00", "soon"])
def test_slurm_times_refused(text):
    with pytest.raises(ConfigError, match="must be a Slurm time limit"):
        check_time(text)


def test_a_job_needs_a_script():
    with pytest.raises(ConfigError, match="SCRIPT='': is missing"):
        build_job_script(JobSpec(()))


def test_a_slurm_node_runs_as_root_and_labctl_execs_as_the_user():
    config = LabSpec(lab="s", nodes=2, scheduler="slurm")
    plan = ComposePlan(subnet="10.9.0.0/24", workspace=Path("/ws"), user="1000:1000",
                       slurm_dir=Path("/ws/.lab/s/slurm"))
    node = yaml.safe_load(render_compose(build_compose(config, plan, load_template())))["services"]["node1"]
    assert node["user"] == "0:0"
    assert node["labels"][LABEL_SCHEDULER] == "slurm" and node["labels"][LABEL_EXEC_USER] == "1000:1000"
    assert node["environment"]["DDPLAB_SLURM_DIR"] == "/ws/.lab/s/slurm"
    assert node["environment"]["DDPLAB_RUN_AS"] == "1000:1000" and node["environment"]["HOME"] == "/tmp"
    assert "no-new-privileges" in node["security_opt"]  # root in the node, still no privilege to gain
    plain = build_compose(LabSpec(lab="s", nodes=2), ComposePlan(subnet="10.9.0.0/24", workspace=Path("/ws"),
                                                                    user="1000:1000"), load_template())
    assert plain["services"]["node1"]["user"] == "1000:1000" and LABEL_SCHEDULER not in plain["services"]["node1"]["labels"]


def test_the_scheduler_setting():
    assert resolve_config(environ={}).scheduler == "none"
    assert resolve_config(environ={"DDPLAB_SCHEDULER": "slurm"}).scheduler == "slurm"
    with pytest.raises(ConfigError, match="DDPLAB_SCHEDULER='pbs'"):
        resolve_config(environ={"DDPLAB_SCHEDULER": "pbs"})


# Recorded from `labctl slurm run -N 3 -- tests/integration/scripts/fail_how.py exit 2` on this machine
# (abridged): srun names node1 first, whose rank only lost its peer; rank 2 on node2 failed first.
FAILED_JOB = [
    "salloc: Granted job allocation 5",
    "job 5: 3 nodes (node[0-2]) x 1 processes, rendezvous node0:29500",
    "0: FAIL_HOW rank=0 world=3 ready",
    "1: FAIL_HOW rank=1 world=3 ready",
    "2: FAIL_HOW rank=2 world=3 ready",
    "2: E1124 01:23:31.288000 125 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 3) "
    "local_rank: 0 (pid: 128) of binary: /opt/venv/bin/python3",
    "1: [rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[172.28.1.12]:5431",
    "1: E1124 01:23:31.393000 126 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) "
    "local_rank: 0 (pid: 129) of binary: /opt/venv/bin/python3",
    "srun: error: node1: task 1: Exited with exit code 1",
    "srun: launch/slurm: _step_signal: Terminating StepId=5.0",
    "srun: error: node2: task 2: Terminated",
    "srun: error: node0: task 0: Exited with exit code 1",
    "salloc: Relinquishing job allocation 5",
]


def read(lines: list[str], exit_code: int, tmp_path: Path, min_nodes: int | None = None):
    """salloc's output fed to the job's output streams: (the RunResult, the JobOutput)."""
    output = jobs.JobOutput(tmp_path, ["node0", "node1", "node2"], None)
    feed: queue.Queue = queue.Queue()
    for line in lines:
        feed.put(line)
    feed.put(exit_code)
    code = output.drain(feed)
    return output.result(code, ["salloc", "bash", "job.sbatch"], interrupted=False, min_nodes=min_nodes), output


def test_the_failed_node_is_the_root_causes_not_srun_s_first(tmp_path):
    result, output = read(FAILED_JOB, 1, tmp_path)
    assert output.job_id == "5" and not result.ok
    assert result.outcomes[1].lines[0] == "FAIL_HOW rank=1 world=3 ready"
    root = result.verdict.root
    assert root.node == "node2" and root.status == 3, root  # srun named node1 first
    assert result.exit_status == 3  # the rank's own status, as `labctl run` exits
    assert result.explain().startswith("node2 failed first")
    # saved as `labctl run` saves a run: a log per node, Slurm's own lines beside them
    assert (tmp_path / "node1.log").read_text().splitlines()[0] == "FAIL_HOW rank=1 world=3 ready"
    assert "salloc: Granted job allocation 5" in (tmp_path / "slurm.log").read_text()


def test_a_node_failure_is_named_and_a_success_has_its_summary(tmp_path):
    lost, _ = read(["salloc: Granted job allocation 9", "0: step 1", "salloc: Job allocation 9 has been revoked.",
                    "salloc: error: Node failure on node2"], 1, tmp_path)
    assert lost.verdict.root.node == "node2" and "went down" in lost.verdict.root.lost
    (tmp_path / "done").mkdir()
    done, _ = read(["salloc: Granted job allocation 3", '0: SUMMARY {"final_loss": 2.5, "world_size": 3}',
                    "salloc: Relinquishing job allocation 3"], 0, tmp_path / "done")
    assert done.ok and done.summary == {"final_loss": 2.5, "world_size": 3} and done.exit_status == 0


def test_a_line_srun_cut_into_pieces_of_1024_bytes_is_whole_again(tmp_path):
    """srun sends at most 1,024 bytes of a task's output at a time and labels each piece: a SUMMARY
    longer than that arrived as two labelled lines, and JSON could not read the first."""
    summary = json.dumps({"final_loss": 2.5, "world_size": 3, "note": "x" * 1500})
    line = f"SUMMARY {summary}"
    pieces = [line[i:i + jobs.SRUN_PIECE_BYTES] for i in range(0, len(line), jobs.SRUN_PIECE_BYTES)]
    assert len(pieces) == 2
    lines = ["salloc: Granted job allocation 3", f"0: {pieces[0]}", "1: step 1", f"0: {pieces[1]}",
             "0: " + "y" * jobs.SRUN_PIECE_BYTES, "salloc: Relinquishing job allocation 3"]
    done, output = read(lines, 0, tmp_path)
    assert done.ok and done.summary == json.loads(summary)
    assert done.outcomes[0].lines == [line, "y" * jobs.SRUN_PIECE_BYTES]  # the last piece: as it came
    assert done.outcomes[1].lines == ["step 1"]


def test_a_job_slurm_refused_fails_as_salloc(tmp_path):
    refused, _ = read(["salloc: error: Job submit/allocate failed: Requested node configuration is not available"], 1,
                      tmp_path)
    assert not refused.ok and refused.exit_status == 1
    assert refused.verdict.root.node == "slurm" and "not available" in refused.explain()


def test_an_elastic_job_survives_a_lost_node_in_slurm_and_in_torchrun(tmp_path):
    text = build_job_script(JobSpec(TRAIN, nodes=3, min_nodes=2, max_restarts=2))
    assert "#SBATCH --no-kill" in text and "srun --no-kill --label" in text and "--kill-on-bad-exit" not in text
    assert '--nnodes="2:$SLURM_JOB_NUM_NODES"' in text and "--max-restarts=2" in text
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in text and "last_call_timeout=10" in text
    script = tmp_path / "elastic.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    plain = build_job_script(JobSpec(TRAIN, nodes=3))
    assert "--no-kill" not in plain and "--max-restarts" not in plain and "TORCH_DISABLE" not in plain


def engine(**changes):
    from dataclasses import replace

    from labctl.engine.detect import Engine

    base = Engine(kind="docker", product="Docker Engine", version="27", endpoint="unix:///var/run/docker.sock",
                  context=None, os="Debian", arch="x86_64", cpus=2, engine_id="x")
    return replace(base, **changes)


def test_slurm_is_refused_where_its_daemons_cannot_start():
    from labctl.slurm.cluster import refusal

    assert refusal(engine()) is None  # on cgroup v1 and v2 hosts alike: cgroup.conf serves both
    assert "Docker only" in str(refusal(engine(kind="podman")))


def test_cgroup_conf_names_the_plugin_that_starts_read_only(tmp_path):
    from labctl.slurm.cluster import write_files
    from labctl.slurm.conf import build_cgroup_conf

    assert [line for line in build_cgroup_conf().splitlines() if not line.startswith("#")] == ["CgroupPlugin=cgroup/v1"]
    directory = write_files(tmp_path, "ClusterName=x\n")
    assert (directory / "cgroup.conf").read_text() == build_cgroup_conf()
    key = directory / "munge.key"
    assert len(key.read_bytes()) == 1024 and key.stat().st_mode & 0o777 == 0o600
    before = key.read_bytes()
    write_files(tmp_path, "ClusterName=y\n")  # a running cluster keeps its key
    assert key.read_bytes() == before and (directory / "slurm.conf").read_text() == "ClusterName=y\n"
