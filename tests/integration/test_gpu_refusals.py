"""`up --gpus` where the machine cannot give the GPUs: one clear error, exit status 1, and nothing
created (no container, network, volume, nor the lab's folder), with --dry-run as without."""

from __future__ import annotations

import uuid

import pytest

from conftest import REPO, drop_lab, labctl, lab_resources
from labctl.errors import StateError
from labctl.lab.gpus import detect_gpus


def gpus_here() -> int:
    try:
        return len(detect_gpus("--gpus 1"))
    except StateError:
        return 0


@pytest.fixture
def gpus_lab(docker_client):
    name = f"gpus-{uuid.uuid4().hex[:8]}"
    yield name
    drop_lab(name)


def test_up_gpus_on_a_machine_that_cannot_give_them_creates_nothing(gpus_lab, docker_client):
    # Without a GPU (or the NVIDIA runtime): --gpus 1. With GPUs: more than the machine has.
    have = gpus_here()
    args = ["--gpus", "1"] if not have else ["--gpus", str(have + 1), "--nodes", str(have + 1)]
    for dry_run in ([], ["--dry-run"]):
        result = labctl("up", "--lab", gpus_lab, *args, *dry_run)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == 1, result.stdout + result.stderr
        assert len(errors) == 1 and "gpu" in errors[0].lower() and "Traceback" not in result.stderr, result.stderr
        assert lab_resources(docker_client, gpus_lab) == {"containers": [], "networks": [], "volumes": []}
        assert not (REPO / ".lab" / gpus_lab).exists()
