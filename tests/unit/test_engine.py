"""Telling engines apart, and what a lab can run on: from what real engines answered.

The JSON files in tests/unit/engines/ are `docker info` and `docker version` as engines on our
machines answered them (trimmed to the fields that matter): Debian's Docker Engine 20.10 as root and
rootless (dockerd-rootless.sh with rootlesskit and slirp4netns), and Podman 4.3.1's
Docker-compatible API as root and rootless.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labctl.engine.detect import (
    DEFAULT_ENDPOINT,
    WorkspaceProbe,
    classify,
    cpu_limits_refusal,
    limits_warning,
    node_user,
    refusal,
    resolve_endpoint,
    ssh_refusal,
    workspace_problem,
)
from labctl.errors import StateError

ENGINES = Path(__file__).resolve().parent / "engines"


def recorded(name: str, endpoint: str = DEFAULT_ENDPOINT):
    data = json.loads((ENGINES / f"{name}.json").read_text())
    return classify(data["info"], data["version"], endpoint)


# Docker Desktop 4.x as it describes itself (not recorded here: no Docker Desktop on these machines).
DESKTOP_INFO = {"ID": "c0ffee", "Name": "docker-desktop", "OperatingSystem": "Docker Desktop", "OSType": "linux",
                "Architecture": "aarch64", "NCPU": 8, "ServerVersion": "27.3.1",
                "SecurityOptions": ["name=seccomp,profile=unconfined", "name=cgroupns"]}


@pytest.mark.parametrize("name, kind, product, version, arch", [
    ("docker-root", "docker", "Docker Engine", "20.10.24+dfsg1", "x86_64"),
    ("docker-rootless", "docker-rootless", "Docker Engine", "20.10.24+dfsg1", "x86_64"),
    ("podman", "podman", "Podman", "4.3.1", "x86_64"),  # Podman says amd64
    ("podman-rootless", "podman", "Podman", "4.3.1", "x86_64"),
])
def test_recorded_engines_are_told_apart(name, kind, product, version, arch):
    engine = recorded(name)
    assert (engine.kind, engine.product, engine.version, engine.arch) == (kind, product, version, arch)
    assert engine.cpus == 2 and engine.engine_id
    assert engine.rootless == (kind == "docker-rootless")


def test_docker_desktop():
    engine = classify(DESKTOP_INFO, {"Components": [{"Name": "Engine"}]}, "unix:///Users/me/.docker/run/docker.sock",
                      "desktop-linux")
    assert (engine.kind, engine.product, engine.arch) == ("docker-desktop", "Docker Desktop", "aarch64")
    assert "context desktop-linux" in engine.describe() and refusal(engine) is None


def test_only_podman_is_refused_and_the_message_says_what_to_do():
    for name in ("docker-root", "docker-rootless"):
        assert refusal(recorded(name)) is None
    problem = refusal(recorded("podman", "unix:///run/podman/podman.sock"))
    assert isinstance(problem, StateError) and problem.exit_code == 1
    assert "unix:///run/podman/podman.sock is Podman 4.3.1" in problem.message
    assert "Docker Engine (rootful or rootless) or Docker Desktop" in problem.hint


def test_nodes_run_as_root_of_a_rootless_engine_which_is_the_caller():
    assert node_user(recorded("docker-rootless"), "1000:1000") == "0:0"
    assert node_user(recorded("docker-root"), "1000:1000") == "1000:1000"


def test_describe_names_the_kind_version_and_endpoint():
    text = recorded("docker-rootless", "unix:///run/user/1000/docker.sock").describe()
    assert text == ("Docker Engine 20.10.24+dfsg1 at unix:///run/user/1000/docker.sock: rootless, no cgroup limits, "
                    "Debian GNU/Linux 12 (bookworm), x86_64, 2 CPUs")
    assert recorded("docker-root").describe().endswith(": Debian GNU/Linux 12 (bookworm), x86_64, 2 CPUs")


def test_an_engine_that_would_ignore_limits_says_so_and_refuses_cpu_limits():
    """Rootless Docker on cgroup v1 accepts --cpus, --memory and --pids-limit and enforces none (measured
    here: a CPU-bound loop ran at 1.0 CPU under --cpus 0.5, 1 GiB fit under --memory 512m)."""
    root, rootless = recorded("docker-root"), recorded("docker-rootless")
    assert root.limits and not rootless.limits
    assert cpu_limits_refusal(root, "--cpus") is None and limits_warning(root, "4g", 4096) is None
    refused = cpu_limits_refusal(rootless, "slowing node2 down")
    assert refused.exit_code == 1 and "slowing node2 down needs CPU limits" in refused.message
    assert "cgroup v2" in refused.hint
    warning = limits_warning(rootless, "4g", 4096)
    assert "without the 4g memory and 4096 process limits" in warning and "`labctl slow`" in warning
    assert "without the 4096 process limits" in limits_warning(rootless, None, 4096)
    # the same engine on a cgroup v2 machine, as rootless Docker reports it there: limits work
    data = json.loads((ENGINES / "docker-rootless.json").read_text())
    v2 = {**data["info"], "CgroupDriver": "systemd", "CgroupVersion": "2", "CpuCfsQuota": True, "MemoryLimit": True,
          "PidsLimit": True, "Warnings": None}
    assert classify(v2, data["version"], DEFAULT_ENDPOINT).limits


def test_ssh_nodes_need_addresses_the_host_can_reach():
    assert ssh_refusal(recorded("docker-root")) is None
    refused = ssh_refusal(recorded("docker-rootless"))
    assert "rootless Docker" in refused.message and "without --ssh" in refused.hint


@pytest.mark.parametrize("environ, current, expected", [
    ({}, None, (DEFAULT_ENDPOINT, None)),
    ({}, "default", (DEFAULT_ENDPOINT, None)),
    ({"DOCKER_HOST": "ssh://me@box"}, "desktop-linux", ("ssh://me@box", None)),  # DOCKER_HOST wins
    ({}, "desktop-linux", ("unix:///Users/me/.docker/run/docker.sock", "desktop-linux")),
    ({"DOCKER_CONTEXT": "remote"}, "desktop-linux", ("tcp://10.0.0.5:2376", "remote")),  # env over config
    ({"DOCKER_CONTEXT": "gone"}, None, (DEFAULT_ENDPOINT, "gone")),
])
def test_the_endpoint_is_found_as_the_docker_cli_finds_it(environ, current, expected):
    hosts = {"desktop-linux": "unix:///Users/me/.docker/run/docker.sock", "remote": "tcp://10.0.0.5:2376"}
    assert resolve_endpoint(environ, current, hosts) == expected


WS = Path("/home/me/project")


def problem(probe: WorkspaceProbe, engine_name: str = "docker-root", user: str = "1000:1000"):
    return workspace_problem(probe, recorded(engine_name, "ssh://me@gpu-box"), WS, user, caller_uid=1000)


def test_a_workspace_seen_and_written_as_the_caller_is_fine():
    assert problem(WorkspaceProbe(0, "token", True, True, 1000)) is None
    assert problem(WorkspaceProbe(0, "token", True, True, 1000), "docker-rootless", "0:0") is None


def test_a_remote_engine_is_named_with_what_to_do():
    found = problem(WorkspaceProbe(3, "cat: /home/me/project/.lab/x/.engine-probe-1: No such file or directory",
                                   False, False, None))
    assert isinstance(found, StateError) and found.exit_code == 1
    assert "the engine at ssh://me@gpu-box does not see this workspace" in found.message
    assert "found nothing there" in found.message and "remote" in found.message
    assert "unset DOCKER_HOST" in found.hint and "docker context use default" in found.hint
    other_folder = problem(WorkspaceProbe(0, "someone else's file", False, False, None))
    assert 'found something else there ("someone else\'s file")' in other_folder.message
    assert "would see another folder" in other_folder.message


def test_a_workspace_the_nodes_cannot_write():
    found = problem(WorkspaceProbe(4, "sh: 1: cannot create /home/me/project/x: Permission denied", True, False, None),
                    "docker-rootless", "0:0")
    assert "nodes cannot write the workspace /home/me/project" in found.message
    assert "running as 0:0 (rootless Docker)" in found.message and "Permission denied" in found.message


def test_files_that_would_belong_to_someone_else():
    found = problem(WorkspaceProbe(0, "token", True, True, 101000))
    assert "would belong to uid 101000, not to you (uid 1000)" in found.message
