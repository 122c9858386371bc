"""Where the lab's lock is used: doctor's packages check, the plan that puts nodes on the package
image, a running lab keeping its packages, gc of package images, the Slurm job's lines, the hosts'
env files and the pytest marker."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from labctl.diagnose.packages import check_packages
from labctl.errors import ConfigError
from labctl.hosts.packages import with_pythonpath
from labctl.image.lockfile import Lock, Pin, render_lock
from labctl.image.packages import LABEL_PACKAGES, LOCK_FILE
from labctl.image.wheelhouse import Target
from labctl.lab.garbage import plan_images
from labctl.lab.gpus import GpuPlan, NodeGpus
from labctl.lab.up import UpPlan, kept_packages
from labctl.pytest_plugin.settings import Settings, lab_request
from labctl.session import LabSession
from labctl.slurm.jobs import Slurm
from labctl.slurm.script import JobSpec, build_job_script
from labctl.spec.labspec import resolve_config

LOCK = Lock((Pin("torch", "2.13.0+cpu", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "", "a" * 64),
             Pin("tqdm", "4.67.1", "tqdm-4.67.1-py3-none-any.whl", "", "b" * 64),
             Pin("numpy", "2.4.6", "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl", "", "c" * 64)))


def nodes(**overrides: dict) -> dict:
    same = {"torch": "2.13.0+cpu", "tqdm": "4.67.1", "numpy": "2.4.6", "pip": "23.0.1"}
    return {f"node{i}": {"packages": {**same, **overrides.get(f"node{i}", {})}} for i in range(3)}


# ------------------------------------------------------------------------------------- doctor


def test_nodes_that_match_the_lock_pass_naming_it():
    [finding] = check_packages(nodes(), LOCK, ".lab/demo/pylock.toml")
    assert finding.ok and finding.message == f"4 distributions on every node, as .lab/demo/pylock.toml says ({LOCK.short})"
    [plain] = check_packages(nodes(), None)
    assert plain.ok and plain.message == "the same 4 distributions on every node"


def test_a_node_whose_package_differs_from_the_lock_is_named_with_the_package():
    found = check_packages(nodes(node1={"tqdm": "4.66.6"}), LOCK, ".lab/demo/pylock.toml")
    assert [(f.node, f.ok) for f in found] == [("node1", False)]
    assert found[0].message.startswith("tqdm 4.66.6 on node1, 4.67.1 in .lab/demo/pylock.toml")
    assert "labctl down && labctl up --requirements .lab/demo/pylock.toml" in found[0].fix
    without = nodes()
    del without["node2"]["packages"]["tqdm"]
    missing = check_packages(without, LOCK, "the lock")
    assert [f.message for f in missing] == ["tqdm 4.67.1 is in the lock, but node2's Python does not have it"]


def test_without_a_lock_the_nodes_are_compared_with_each_other():
    found = check_packages(nodes(node2={"einops": "0.8.1"}), None)
    assert [(f.node, f.message) for f in found] == [("node2", "einops 0.8.1 on node2 alone")]
    found = check_packages(nodes(node0={"pip": "24.0"}), None)
    assert [(f.node, f.message) for f in found] == [("node0", "pip 24.0 on node0, 23.0.1 on node1, node2")]


def test_torch_and_its_cuda_builds_packages_are_the_versions_checks():
    cuda = {"torch": "2.13.0", "nvidia-nccl-cu12": "2.27.3", "triton": "3.4.0"}
    assert all(f.ok for f in check_packages(nodes(node1=cuda), LOCK, "the lock"))


# ------------------------------------------------------------------------------------ the plan


def test_the_plan_puts_every_node_on_its_images_package_image():
    gpus = GpuPlan((NodeGpus("node0", (), False, "ddplab-node:cpu"), NodeGpus("node1", (), True, "ddplab-node:cuda")))
    document = {"services": {"node0": {"image": "ddplab-node:cpu", "hostname": "node0"},
                             "node1": {"image": "ddplab-node:cuda"}}}
    plan = UpPlan(resolve_config(), None, False, document, {}, "172.28.0.0/24", None, gpus)
    images = {"ddplab-node:cpu": "ddplab-node:cpu-pkgs-1", "ddplab-node:cuda": "ddplab-node:cuda-pkgs-1"}
    planned = plan.with_package_images(LOCK, images, "lock text")
    assert [n.image for n in planned.gpus.nodes] == ["ddplab-node:cpu-pkgs-1", "ddplab-node:cuda-pkgs-1"]
    assert planned.document["services"]["node0"] == {"image": "ddplab-node:cpu-pkgs-1", "hostname": "node0"}
    assert (planned.lock, planned.package_images, planned.lock_text) == (LOCK, images, "lock text")
    assert plan.document["services"]["node0"]["image"] == "ddplab-node:cpu"  # the plan itself is left as it was


def test_a_running_lab_keeps_its_packages_unless_asked(tmp_path):
    (tmp_path / LOCK_FILE).write_text("lock")
    running = [{"Labels": {LABEL_PACKAGES: LOCK.digest}}]
    kept = kept_packages(resolve_config(), running, tmp_path)
    assert kept.requirements == str(tmp_path / LOCK_FILE)
    assert kept_packages(resolve_config(flags={"with_packages": ("einops",)}), running, tmp_path).requirements == ""
    assert kept_packages(resolve_config(flags={"requirements": "none"}), running, tmp_path).requirements == ""
    assert kept_packages(resolve_config(), [{"Labels": {}}], tmp_path).requirements == ""  # a plain lab stays plain
    assert kept_packages(resolve_config(), [], tmp_path).requirements == ""  # after `down`, nothing to keep


# ------------------------------------------------------------------------------------------ gc


def test_gc_removes_the_package_images_no_container_uses():
    images = [{"Id": "sha256:" + "1" * 64, "RepoTags": ["ddplab-node:cpu-pkgs-aaaa"]},
              {"Id": "sha256:" + "2" * 64, "RepoTags": ["ddplab-node:cpu-pkgs-bbbb"]},
              {"Id": "sha256:" + "3" * 64, "RepoTags": ["<none>:<none>"]}]
    used = {"sha256:" + "1" * 64}
    verdicts = plan_images(images, used)
    assert [(v.image, v.remove) for v in verdicts] == [("ddplab-node:cpu-pkgs-aaaa", False),
                                                       ("ddplab-node:cpu-pkgs-bbbb", True), ("333333333333", True)]
    assert plan_images(images, used, going=used)[0].remove  # only the labs that go use it (gc --dry-run)
    assert verdicts[1].as_dict() == {"image": "ddplab-node:cpu-pkgs-bbbb", "remove": True,
                                     "why": "no lab's node runs it (a package set no lab uses now)"}


# --------------------------------------------------------------------------------------- Slurm


def test_the_job_script_installs_the_lock_into_its_environment(tmp_path):
    text = build_job_script(JobSpec(("-m", "trainer"), packages="train.requirements.txt"))
    line = 'python -m pip install --quiet --no-deps --require-hashes -r "${DDPLAB_LOCK_DIR:-$SLURM_SUBMIT_DIR}/train.requirements.txt"'
    assert line in text.splitlines() and text.index(line) < text.index("export NPROC_PER_NODE")
    assert "pip install" not in build_job_script(JobSpec(("-m", "trainer")))
    (tmp_path / "job.sbatch").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0


def test_export_writes_the_labs_lock_beside_the_script(tmp_path):
    workspace, out = tmp_path / "ws", tmp_path / "out"
    (workspace / ".lab" / "demo").mkdir(parents=True)
    out.mkdir()
    (workspace / ".lab" / "demo" / LOCK_FILE).write_text(render_lock(LOCK, Target()))
    jobs = Slurm(LabSession(resolve_config(flags={"lab": "demo"}), workspace))
    written = jobs.export(JobSpec(("-m", "trainer")), out / "train.sbatch")
    assert [p.name for p in written] == ["train.sbatch", "pylock.train.toml", "train.requirements.txt"]
    assert (out / "pylock.train.toml").read_text() == render_lock(LOCK, Target())
    assert (out / "train.requirements.txt").read_text() == (f"numpy==2.4.6 --hash=sha256:{'c' * 64}\n"
                                                            f"tqdm==4.67.1 --hash=sha256:{'b' * 64}\n")  # no torch
    assert "train.requirements.txt" in (out / "train.sbatch").read_text()
    plain = Slurm(LabSession(resolve_config(flags={"lab": "plain"}), workspace))
    assert [p.name for p in plain.export(JobSpec(("-m", "trainer")), out / "p.sbatch")] == ["p.sbatch"]


# --------------------------------------------------------------------------------------- hosts


def test_the_hosts_env_files_put_the_packages_folder_first():
    texts = with_pythonpath({"node0": "MASTER_ADDR=10.0.0.1\n", "node1": "MASTER_ADDR=10.0.0.1"}, ".lab/c/packages-1")
    line = "PYTHONPATH=.lab/c/packages-1${PYTHONPATH:+:$PYTHONPATH}"
    assert texts == {"node0": f"MASTER_ADDR=10.0.0.1\n{line}\n", "node1": f"MASTER_ADDR=10.0.0.1\n{line}\n"}
    done = subprocess.run(["sh", "-c", f'PYTHONPATH=/opt/ddplab; set -a; {line}; echo "$PYTHONPATH"'],
                          capture_output=True, text=True)
    assert done.stdout.strip() == ".lab/c/packages-1:/opt/ddplab"


# -------------------------------------------------------------------------------------- marker


def test_the_marker_gives_a_lab_its_packages_and_labs_differ_by_them():
    def request(**kwargs):
        return lab_request([((), kwargs)], Settings(), Path("/nonexistent-workspace"), {})

    plain, tqdm = request(), request(with_packages=["tqdm"], preload="tqdm")
    assert (tqdm.lab.with_packages, tqdm.lab.preload) == (("tqdm",), ("tqdm",))
    assert tqdm.key != plain.key and request(with_packages="tqdm").key != tqdm.key
    assert request(requirements="req.txt").lab.requirements == "/nonexistent-workspace/req.txt"  # from the rootdir
    assert "packages /nonexistent-workspace/req.txt" in request(requirements="req.txt").describe()
    with pytest.raises(Exception, match="with"):
        request(with_packages=["foo=="])


def test_the_marker_turns_the_idle_imports_off_and_labs_differ_by_them():
    def request(**kwargs):
        return lab_request([((), kwargs)], Settings(), Path("/nonexistent-workspace"), {})

    assert request().lab.idle_imports == "on"
    assert request(idle_imports="off").lab.idle_imports == request(idle_imports=False).lab.idle_imports == "off"
    assert request(idle_imports="off").key != request().key  # a lab of one is never handed to a test of the other
    assert request(idle_imports="ON").key == request().key
    with pytest.raises(ConfigError, match=r"ddplab\(idle_imports=\)='maybe': must be one of on, off"):
        request(idle_imports="maybe")
    env = lab_request([((), {})], Settings(), Path("/nonexistent-workspace"), {"DDPLAB_IDLE_IMPORTS": "off"})
    assert env.lab.idle_imports == "off"  # the environment's setting, as `labctl up` reads it
