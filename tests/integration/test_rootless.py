"""A lab on rootless Docker, driven by the engine's own (unprivileged) user, as such a user would.

The engine is Debian's dockerd-rootless.sh under a user of its own (tests/integration/scripts/
rootless-docker.sh). labctl runs as that user, with the system's Python and a copy of labctl that
user can read, from a workspace it owns. On these machines (cgroup v1, no systemd) rootless Docker
has no cgroups: it accepts CPU, memory and process limits and enforces none, which labctl says
once and does not pretend otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, SCRIPTS, summary_of

SYSTEM_PYTHON = "/usr/bin/python3"  # pyenv's Pythons live under /root, which the user cannot enter


@dataclass
class RootlessUser:
    socket: str
    uid: int
    home: str
    pythonpath: str
    workspace: Path

    def labctl(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        env = ["env", "-i", f"HOME={self.home}", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               f"DOCKER_HOST={self.socket}", f"PYTHONPATH={self.pythonpath}", "COLUMNS=200", "PYTHONDONTWRITEBYTECODE=1"]
        argv = ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--init-groups", "--", *env,
                SYSTEM_PYTHON, "-m", "labctl", *args]
        return subprocess.run(argv, cwd=self.workspace, capture_output=True, text=True, timeout=timeout)


def engine(socket: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, env={**os.environ, "DOCKER_HOST": socket},
                          **kwargs)


@pytest.fixture(scope="module")
def rootless(docker_client, node_image):
    base = Path(tempfile.mkdtemp(prefix="ddplab-rootless-", dir="/tmp"))
    base.chmod(0o755)
    script = SCRIPTS / "rootless-docker.sh"
    started = subprocess.run(["bash", str(script), "start", str(base / "engine")], capture_output=True, text=True,
                             timeout=300)
    assert started.returncode == 0, started.stderr
    fields = dict(part.split("=", 1) for part in started.stdout.strip().splitlines()[-1].split())
    try:
        # The node image, from the root engine: the rootless engine has its own store.
        wanted = docker_client.images.get(node_image).id
        have = engine(fields["socket"], "image", "inspect", "--format", "{{.Id}}", node_image).stdout.strip()
        if have != wanted:
            save = subprocess.Popen(["docker", "save", node_image], stdout=subprocess.PIPE)
            load = subprocess.run(["docker", "load"], stdin=save.stdout, capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "DOCKER_HOST": fields["socket"]})
            save.stdout.close()
            assert save.wait() == 0 and load.returncode == 0, load.stderr
        # labctl as the user may read it: its sources, and its dependencies installed beside them.
        source = base / "src"
        # A checkout, as labctl.core.assets tells one (its files at the top): the sources, the Compose
        # template and what the image is built from.
        for part in ("labctl", "trainer", "compose"):
            shutil.copytree(REPO / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "Dockerfile", ".dockerignore"):
            shutil.copy2(REPO / name, source / name)
        deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
        site = base / "site"
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site), *deps],
                             capture_output=True, text=True, timeout=600)
        assert pip.returncode == 0, pip.stderr
        subprocess.run(["chmod", "-R", "a+rX", str(source), str(site)], check=True)
        workspace = base / "workspace"
        workspace.mkdir()
        os.chown(workspace, int(fields["uid"]), int(fields["uid"]))
        yield RootlessUser(fields["socket"], int(fields["uid"]), fields["home"], f"{source}:{site}", workspace)
    finally:
        for container in engine(fields["socket"], "ps", "-aq", "--filter", "label=io.ddplab.lab").stdout.split():
            engine(fields["socket"], "rm", "-f", container)
        subprocess.run(["bash", str(script), "stop", str(base / "engine")], capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


def test_a_lab_runs_on_rootless_docker_and_its_files_belong_to_the_user(rootless):
    lab = f"it-{uuid.uuid4().hex[:8]}"
    up = rootless.labctl("up", "--lab", lab, "--nodes", "2")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        # said once, never silently: this engine cannot enforce the nodes' limits
        assert "warning: the engine at" in up.stderr and "without the 4g memory and 4096 process limits" in up.stderr
        nodes = engine(rootless.socket, "inspect", f"{lab}-node0", f"{lab}-node1").stdout
        for node in json.loads(nodes):
            # root in the engine's user namespace, which is the user outside it
            assert node["Config"]["User"] == "0:0"
            assert node["HostConfig"]["Memory"] == 0 and node["HostConfig"]["NanoCpus"] == 0
        doctor = json.loads(rootless.labctl("doctor", "--lab", lab, "--json").stdout)
        found = next(f for f in doctor["findings"] if f["check"] == "engine")
        assert found["message"].startswith("docker-rootless: Docker Engine") and "rootless, no cgroup limits" in found["message"]
        assert doctor["ok"] is True
        run = rootless.labctl("run", "--lab", lab, "--", "-m", "trainer", "--global-batch", "16", "--micro-batch", "8",
                              "--steps", "5")
        assert run.returncode == 0, run.stdout + run.stderr
        summary = summary_of(run.stdout)
        assert summary["world_size"] == 2 and summary["replicas_consistent"] is True
        run_dir = Path(summary["run_dir"])
        written = [run_dir / "metrics-rank0.jsonl", run_dir / "metrics-rank1.jsonl"]
        assert all(p.stat().st_uid == rootless.uid for p in written)  # the nodes wrote them as the user
        shaped = rootless.labctl("shape", "--lab", lab, "--bw", "100mbit")
        assert shaped.returncode == 0, shaped.stdout + shaped.stderr
        assert rootless.labctl("shape", "--lab", lab, "--show").stdout.count("100mbit") == 2  # read back from tc
        slow = rootless.labctl("slow", "--lab", lab, "node1", "--cpus", "0.5")
        assert slow.returncode == 1 and "slowing node1 down needs CPU limits" in slow.stderr
        assert "Traceback" not in slow.stderr
    finally:
        down = rootless.labctl("down", "--lab", lab, "--volumes")
    assert down.returncode == 0, down.stderr
    assert engine(rootless.socket, "ps", "-aq", "--filter", f"label=io.ddplab.lab={lab}").stdout.split() == []


def test_what_rootless_docker_cannot_do_is_refused_before_anything_exists(rootless):
    lab = f"it-{uuid.uuid4().hex[:8]}"
    for args, fragment in ((["--ssh"], "--ssh needs the nodes' addresses reachable"),
                           (["--cpus", "0.5"], "--cpus needs CPU limits"),
                           (["--node-cpus", "node1=0.5"], "--node-cpus needs CPU limits")):
        result = rootless.labctl("up", "--lab", lab, "--nodes", "2", *args)
        assert result.returncode == 1 and fragment in result.stderr, result.stdout + result.stderr
        assert engine(rootless.socket, "ps", "-aq", "--filter", f"label=io.ddplab.lab={lab}").stdout.split() == []
        assert engine(rootless.socket, "network", "ls", "-q", "--filter", f"label=io.ddplab.lab={lab}").stdout.split() == []
