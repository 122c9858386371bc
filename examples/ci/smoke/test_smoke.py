"""A stand-in for your own tests: bring a 2-node lab up, train across it, take it down.

examples/ci/ddplab.yml runs the tests that DDPLAB_TESTS names; point it at yours. This one drives
labctl as a subprocess, as a person types it, from the folder pytest runs in (the workspace, so a
failed run's node logs land in .lab/<lab>/runs/, where the workflow uploads them from).

DDPLAB_SMOKE_CRASH=1 makes it die after training, as a crashed test session does (no fixture
runs): the lab stays up and the job fails, which rehearses the workflow's failure path (the logs
uploaded, the lab removed by the clean-up step). tests/integration/test_ci_workflow.py sets it.
"""

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

LABCTL = [shutil.which("labctl")] if shutil.which("labctl") else [sys.executable, "-m", "labctl"]


def labctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LABCTL, *args], capture_output=True, text=True, timeout=600)


@pytest.fixture
def lab():
    """A lab name of its own, removed with its volume whatever the test did."""
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    yield name
    labctl("down", "--lab", name, "--volumes")


def test_two_nodes_train_in_step(lab):
    up = labctl("up", "--lab", lab, "--nodes", "2")
    assert up.returncode == 0, up.stderr
    run = labctl("run", "--lab", lab, "--json", "--", "-m", "trainer", "--epochs", "1")
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)["summary"]
    assert summary["world_size"] == 2
    assert summary["replicas_consistent"], "the two ranks' parameters differ after training"
    if os.environ.get("DDPLAB_SMOKE_CRASH") == "1":
        os._exit(1)  # pytest's own output is lost with it; the job's logs and artifacts tell the rest
