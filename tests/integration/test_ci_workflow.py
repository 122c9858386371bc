"""The example GitHub Actions workflow (examples/ci/ddplab.yml), run step by step on this machine by
tests/ci/run_workflow.py: no GitHub runner exists here, and `act` needs runner images from a registry.

Twice, with one actions/cache folder between them, each in a fresh clone of HEAD (what is committed)
with a fresh venv, ddplab installed from that clone, and an empty ~/.cache:
1. the cache misses: `labctl build` makes the image (under a tag of this test's own, so docker's
   layer cache makes it a new name for the image the checkout built, and the shared tag is never
   touched), saves it with its base, and the smoke test trains on 2 nodes;
2. the tag is removed, the cache hits: `docker load` brings the image back, `labctl build` finds
   it up to date; the smoke test is made to crash after training (DDPLAB_SMOKE_CRASH=1), so the job
   fails, the nodes' logs are uploaded, and the clean-up step removes the lab the crash left up.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import REPO, lab_resources

pytestmark = pytest.mark.integration
WORKFLOW = REPO / "examples" / "ci" / "ddplab.yml"
RUNNER = REPO / "tests" / "ci" / "run_workflow.py"


def run_workflow(work: Path, store: Path, tag: str, *env: str) -> tuple[dict, str]:
    argv = [sys.executable, RUNNER, WORKFLOW, "--repo", REPO, "--work", work, "--cache-dir", store,
            "--env", "DDPLAB_SPEC=${{ github.workspace }}", "--env", f"DDPLAB_IMAGE={tag}"]
    for pair in env:
        argv += ["--env", pair]
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=840)
    output = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1), f"run_workflow could not run the workflow:\n{output[-5000:]}"
    result = json.loads((work / "result.json").read_text())
    assert (proc.returncode == 0) == (result["result"] == "success")
    return result, output


def outcome(result: dict, name: str) -> str:
    (step,) = [s for s in result["steps"] if s["step"].split(". ", 1)[1] == name]
    return step["outcome"]


@pytest.fixture
def image_tag(docker_client, node_image):
    tag = f"ddplab-node:ci-{uuid.uuid4().hex[:8]}"
    yield tag
    subprocess.run(["docker", "rmi", tag], capture_output=True)


@pytest.fixture
def work(tmp_path):
    """The runs' folders. What is heavy in them (the image tarball, 1.3 GB; each run's wheelhouse and
    venv) goes with the test rather than staying in pytest's last three temp folders; each run's
    result.json, workspace and artifacts stay for a look afterwards."""
    yield tmp_path
    shutil.rmtree(tmp_path / "actions-cache", ignore_errors=True)
    for run in ("run1", "run2"):
        for heavy in ("temp", "xdg-cache", "tool-cache"):
            shutil.rmtree(tmp_path / run / heavy, ignore_errors=True)


@pytest.mark.timeout(1800)
def test_the_workflow_caches_the_image_uploads_logs_and_cleans_up(work, docker_client, image_tag):
    tmp_path = work
    store = tmp_path / "actions-cache"

    first, output = run_workflow(tmp_path / "run1", store, image_tag)
    assert first["result"] == "success", output[-6000:]
    assert outcome(first, "Load the node image") == "skipped"
    assert outcome(first, "Save the node image") == "success"
    assert outcome(first, "Upload the nodes' logs") == "skipped"
    assert outcome(first, "Remove this job's labs") == "success"
    digest = first["outputs"]["image"]["hash"]
    assert first["outputs"]["image"]["tag"] == image_tag
    assert docker_client.images.get(image_tag).labels["io.ddplab.build-hash"] == digest
    assert (store / f"ddplab-image-Linux-X64-{digest}" / "0" / "images.tar").is_file()

    subprocess.run(["docker", "rmi", image_tag], check=True, capture_output=True)
    second, output = run_workflow(tmp_path / "run2", store, image_tag, "DDPLAB_SMOKE_CRASH=1")
    assert second["result"] == "failure", output[-6000:]
    assert second["outputs"]["image"]["hash"] == digest, "the same inputs must give the same cache key"
    assert second["outputs"]["image-cache"]["cache-hit"] == "true"
    assert outcome(second, "Load the node image") == "success"
    assert f"image {image_tag} up to date" in output
    assert outcome(second, "Save the node image") == "skipped"
    assert outcome(second, "Tests") == "failure"
    assert outcome(second, "Upload the nodes' logs") == "success"
    assert outcome(second, "Remove this job's labs") == "success"

    (artifact,) = (tmp_path / "run2" / "artifacts").iterdir()
    logs = sorted(p.name for p in artifact.glob(".lab/*/runs/*/*.log"))
    assert "node0.log" in logs and "node1.log" in logs, sorted(map(str, artifact.rglob("*")))
    (lab,) = {p.parts[-4] for p in artifact.glob(".lab/*/runs/*/node0.log")}
    assert lab_resources(docker_client, lab) == {"containers": [], "networks": [], "volumes": []}, \
        "the clean-up step left the crashed test's lab on the engine"
