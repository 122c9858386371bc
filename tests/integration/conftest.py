"""Integration tests: a real Docker engine, real containers, real torch.distributed.

A missing engine fails these tests (it never skips them): `make test` starts one first.
Each test works on a lab of its own, with a unique name, removed in the fixture's finalizer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from labctl.run.launch import FORK_SOCKET

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
LABEL = "io.ddplab.lab"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"  # the first 8 bytes of every PNG file: a picture was drawn
# Per test, its fixtures' share included (pytest-timeout): above the longest timeout a test gives a
# command of its own (600 s: an image build, `docker load`, pip), so that one fails first and says
# which command hung; a test that hangs anywhere else fails here, with its stack, and its lab's
# finalizer still runs.
INTEGRATION_TIMEOUT_S = 900


# The longest modules (a minute or more each, measured on 2026-11-27, longest first), handed out
# first: `make test` spreads the integration tests over its workers a module at a time
# (pytest-xdist --dist loadfile --no-loadscope-reorder: xdist would otherwise deal the modules with
# the most tests first), and a long module dealt last would run on alone while the other workers
# idle. Only the order changes.
LONG_FIRST = ("test_slurm_cluster.py", "test_scenarios.py", "test_faults.py", "test_pytest_plugin.py",
              "test_other_python.py", "test_warm.py", "test_packages.py", "test_ci_workflow.py", "test_lab.py",
              "test_hosts.py", "test_netem_kernel.py", "test_packaging.py", "test_failed_runs.py",
              "test_packages_lightning.py", "test_equivalence.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(LONG_FIRST)))  # stable
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.integration)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(INTEGRATION_TIMEOUT_S))


@pytest.fixture(scope="session")
def docker_client():
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means no engine
        pytest.fail(f"integration tests need a running Docker engine ({exc}); `make test` starts one", pytrace=False)
    return client


def required_image(docker_client, tag: str, what: str, build: str) -> str:
    """`tag`, which `make test` builds before the suite: a failure, never a skip, where it is missing."""
    try:
        docker_client.images.get(tag)
    except Exception:  # noqa: BLE001
        pytest.fail(f"{what} {tag} is missing; `make test` builds it (or `{build}`)", pytrace=False)
    return tag


@pytest.fixture(scope="session")
def node_image(docker_client):
    from labctl.spec.labspec import resolve_config

    return required_image(docker_client, resolve_config(environ=os.environ).image_tag, "node image", "labctl build")


@pytest.fixture(scope="session")
def cuda_image(docker_client):
    """The CUDA node image at the lab's release (Dockerfile.cuda): `make test` builds it on every
    machine, GPU or not, so that the image is exercised on every run."""
    from labctl.spec.labspec import resolve_config

    return required_image(docker_client, resolve_config(environ=os.environ).cuda_image_tag, "CUDA node image",
                          "labctl build --cuda")


def copy_workspace(root: Path) -> Path:
    """The workspace's files into `root`, as a fresh clone has them (tracked and new, nothing ignored)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    return root


def labctl(*args: str, timeout: float = 300, check: bool | None = None, env: dict | None = None,
           cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    result = subprocess.run([sys.executable, "-m", "labctl", *args], cwd=cwd, capture_output=True, text=True,
                            timeout=timeout, env={**os.environ, "COLUMNS": "200", **(env or {})})
    if check is True:
        assert result.returncode == 0, f"labctl {' '.join(args)} -> {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def interruptible() -> None:
    """preexec_fn for a labctl the test will Ctrl-C: SIGINT back to its default. A suite started in the
    background by a non-interactive shell (`make test &`) runs with SIGINT ignored, children inherit
    that, and Python then installs no KeyboardInterrupt handler: the SIGINT would never arrive."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def summary_of(output: str) -> dict:
    """The one SUMMARY line a trainer run prints, parsed."""
    lines = [line for line in output.splitlines() if "SUMMARY {" in line]
    assert len(lines) == 1, f"expected one SUMMARY line, got {len(lines)}:\n{output}"
    return json.loads(lines[0].split("SUMMARY ", 1)[1])


def neighbours(client, lab: str, node: str) -> dict[str, tuple[str, str]]:
    """A node's neighbour table as its kernel has it: IP to (MAC, state)."""
    output = client.containers.get(f"{lab}-{node}").exec_run(["ip", "neigh", "show", "dev", "eth0"]).output.decode()
    return {f[0]: (f[2], f[-1]) for f in (line.split() for line in output.splitlines()) if len(f) >= 4}


def permanent_peers(client, lab: str, nodes: list[dict]) -> dict[str, bool]:
    """Whether each node holds a permanent entry with the right MAC for every peer and nothing else
    (labctl.net.neighbors); `nodes` as `status --json` lists them."""
    macs = {n["ip"]: client.containers.get(f"{lab}-{n['name']}").exec_run(["cat", "/sys/class/net/eth0/address"])
            .output.decode().strip() for n in nodes}
    return {n["name"]: neighbours(client, lab, n["name"]) == {ip: (mac, "PERMANENT") for ip, mac in macs.items()
                                                            if ip != n["ip"]} for n in nodes}


PS = ["ps", "-eo", "pid=,ppid=,args="]
FORK_SERVER = f" serve {FORK_SOCKET} "  # in a fork server's command line, and its forked workers'


def still_running(ps_output: str, pattern: str) -> list[str]:
    """The processes of `ps -eo pid=,ppid=,args=` whose command line matches `pattern` (a regex, as
    pgrep -f takes it), less the node's fork server, which lives as long as the lab: its command
    line holds its own source, torchrun and all. A worker it forked has the same command line and is
    counted: its parent is the server."""
    rows = [line.split(None, 2) for line in ps_output.splitlines() if len(line.split(None, 2)) == 3]
    forked = {pid for pid, _, args in rows if FORK_SERVER in args}
    return [f"{pid} {args[:80]}" for pid, ppid, args in rows
            if re.search(pattern, args) and not (pid in forked and ppid not in forked)]


def lab_resources(client, lab: str) -> dict[str, list[str]]:
    """Names of everything labelled with the lab. Raw list calls: the SDK's containers.list()
    inspects each container and fails on one removed in between."""
    selector = {"label": f"{LABEL}={lab}"}
    return {
        "containers": sorted(c["Names"][0].lstrip("/") for c in client.api.containers(all=True, filters=selector)),
        "networks": sorted(n.name for n in client.networks.list(filters=selector)),
        "volumes": sorted(v.name for v in client.volumes.list(filters=selector)),
    }


def wait_for(done, timeout_s: float = 20, interval_s: float = 1.0) -> bool:
    """Asks done() every interval_s until it holds or timeout_s has passed: whether it held at last
    (the caller asserts on that, or on the state itself for a message that shows it)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True


def new_lab_name() -> str:
    """it-<random>; DDPLAB_IT_LAB_PREFIX replaces "it" where several suites share one engine."""
    return f"{os.environ.get('DDPLAB_IT_LAB_PREFIX', 'it')}-{uuid.uuid4().hex[:8]}"


def module_lab(nodes: int):
    """A lab of `nodes` nodes for the tests of one module, removed after them."""
    name = new_lab_name()
    labctl("up", "--lab", name, "--nodes", str(nodes), check=True)
    yield name
    drop_lab(name)


def drop_lab(name: str) -> None:
    """Remove the lab and its workspace folder (env files, run logs): a test leaves nothing behind."""
    labctl("down", "--lab", name, "--volumes")
    shutil.rmtree(REPO / ".lab" / name, ignore_errors=True)


@pytest.fixture
def lab_name(docker_client, node_image):
    """A unique lab name, torn down (volumes too) whatever the test did."""
    name = new_lab_name()
    yield name
    drop_lab(name)


@pytest.fixture(scope="module")
def lab3(docker_client, node_image):
    """A 3-node lab shared by the tests of one module."""
    name = new_lab_name()
    result = labctl("up", "--lab", name, "--nodes", "3", "--json", check=True)
    status = json.loads(result.stdout)
    yield name, status
    drop_lab(name)
