"""The node image does not depend on the Python that runs labctl: a copy of this workspace, as a
fresh clone has it, with labctl installed in a Python 3.12 environment (no torch in it), fills its
own wheelhouse, builds the node image and trains on 2 nodes."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import REPO, copy_workspace, summary_of
from labctl.image.wheelhouse import read_stamp

OTHER_PYTHON = "python3.12"  # Ubuntu 24.04's and GitHub's ubuntu-latest's; the nodes run 3.11


def sh(argv: list[str], cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    import os

    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "COLUMNS": "200", **(env or {})})
    assert result.returncode == 0, f"{' '.join(argv)} -> {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def clone(tmp_path_factory, docker_client, node_image) -> Path:
    """The workspace's files as a fresh clone has them (tracked and new, nothing ignored), with
    .venv made by `make venv PYTHON=python3.12`."""
    root = copy_workspace(tmp_path_factory.mktemp("py312") / "ddplab")
    sh(["make", "venv", f"PYTHON={OTHER_PYTHON}"], root)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_labctls_own_environment_is_that_python_without_torch(clone):
    version = sh([str(clone / ".venv/bin/python"), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], clone)
    assert version.stdout.strip() == "3.12"
    no_torch = subprocess.run([str(clone / ".venv/bin/python"), "-c", "import torch"], capture_output=True)
    assert no_torch.returncode != 0, "labctl's environment should not need torch"


def test_it_builds_the_node_image_and_trains_on_it(clone, docker_client):
    tag = f"ddplab-node:it-py312-{uuid.uuid4().hex[:6]}"
    lab = f"it-{uuid.uuid4().hex[:8]}"
    labctl = [str(clone / ".venv/bin/labctl")]
    env = {"DDPLAB_IMAGE": tag}
    try:
        sh([*labctl, "build"], clone, env)
        wheels = sorted(p.name for p in (clone / ".lab" / "wheelhouse").glob("*.whl"))
        # 3.12's pip filled it for the node's CPython 3.11: nothing built for the host's 3.12
        assert any(w.startswith("torch-") and "-cp311-cp311-manylinux" in w for w in wheels), wheels
        assert all("-cp311-" in w or "-py3-none-any" in w or "-abi3-" in w for w in wheels), wheels
        assert not any("cp312" in w for w in wheels), wheels
        # and with the very wheels labctl's 3.11 environment put into the workspace's own wheelhouse
        # (named by its stamp, which keeps their names where `build --lean` removed the files)
        ours = REPO / ".lab" / "wheelhouse"
        assert wheels == (read_stamp(ours).get("wheels") or sorted(p.name for p in ours.glob("*.whl")))
        sh([*labctl, "up", "--lab", lab, "--nodes", "2"], clone, env)
        run = sh([*labctl, "run", "--lab", lab, "--", "-m", "trainer", "--global-batch", "16", "--micro-batch", "8",
                  "--steps", "5"], clone, env)
        summary = summary_of(run.stdout)
        assert summary["world_size"] == 2 and summary["replicas_consistent"] is True
        status = json.loads(sh([*labctl, "status", "--lab", lab, "--json"], clone, env).stdout)
        assert {n["torch"] for n in status["nodes"]} == {"2.13.0+cpu"}
        image = docker_client.api.inspect_container(f"{lab}-node0")["Config"]["Image"]
        assert image == tag
    finally:
        subprocess.run([*labctl, "down", "--lab", lab, "--volumes"], cwd=clone, capture_output=True, timeout=120)
        try:
            docker_client.images.remove(tag)
        except Exception:  # noqa: BLE001 - nothing to remove if the build failed
            pass
