"""A PyTorch Lightning job on 3 nodes whose packages come from a requirements file that names
`lightning` (issue 39): through `labctl up --requirements` and `labctl run`, through `Lab(...)`, and
through the pytest marker of a project's own suite. Every rank ends with the same parameters."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO, labctl, new_lab_name, summary_of
from labctl.api import Lab

REQUIREMENTS = "examples/packages/requirements.txt"
SCRIPT = "examples/packages/lightning_ddp.py"


def test_lightning_through_labctl_up_and_run(docker_client, node_image, lab_name):
    labctl("up", "--lab", lab_name, "--nodes", "3", "--requirements", REQUIREMENTS, timeout=600, check=True)
    summary = summary_of(labctl("run", "--lab", lab_name, "--", SCRIPT, "--epochs", "1", timeout=300,
                                check=True).stdout)
    assert summary["world_size"] == 3 and summary["replicas_consistent"], summary


def test_lightning_through_the_python_api(docker_client, node_image):
    with Lab(new_lab_name(), nodes=3, requirements=REQUIREMENTS, workspace=REPO) as lab:
        result = lab.run(SCRIPT, "--epochs", "1", echo=False, timeout_s=300)
        assert result.summary["world_size"] == 3 and result.summary["replicas_consistent"], result.summary
        assert lab.lock() is not None and lab.lock()[1].pin("lightning") is not None


def test_lightning_through_the_pytest_marker(docker_client, node_image):
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "DDPLAB_OWNER_"))}
    clean.update(PYTHONPATH=str(REPO), COLUMNS="200")
    result = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "examples" / "packages"), "-p",
                             "labctl.pytest_plugin", "-p", "no:ddplab", "-p", "no:cacheprovider", "-v"], cwd=REPO,
                            env=clean, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "1 passed" in output, output[-5000:]
