"""Engines that are not a local root daemon, named clearly: a docker context is followed as the
Docker CLI follows it, and an engine that cannot see the workspace (a remote one) is refused
before anything of the lab exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import NO_RUNS, lab_resources, labctl


def test_labctl_follows_the_docker_context_as_the_cli_does(docker_client, tmp_path, monkeypatch):
    """The Docker SDK before 7.2 ignored `docker context`, while `docker compose` follows it. Here the
    current context reaches this engine by a second path to its socket: labctl's client goes there and
    names it; a context that points nowhere fails naming the context, not the default socket."""
    import docker

    from labctl.engine.detect import inspect_engine

    config = tmp_path / "docker-config"
    alias = tmp_path / "engine.sock"
    alias.symlink_to("/var/run/docker.sock")
    for name, host in (("lab-ctx", f"unix://{alias}"), ("nowhere", f"unix://{tmp_path}/missing.sock")):
        subprocess.run(["docker", "context", "create", name, "--docker", f"host={host}"], check=True,
                       capture_output=True, env={**os.environ, "DOCKER_CONFIG": str(config)})
    (config / "config.json").write_text(json.dumps({"currentContext": "lab-ctx"}))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    engine = inspect_engine(docker.from_env())
    assert (engine.endpoint, engine.context) == (f"unix://{alias}", "lab-ctx")
    assert engine.engine_id == docker_client.info()["ID"]  # the very engine, reached through the context
    nowhere = subprocess.run([sys.executable, "-m", "labctl", "status", "--lab", "none"], capture_output=True, text=True,
                             env={**os.environ, "DOCKER_CONTEXT": "nowhere"}, timeout=60)
    assert nowhere.returncode == 1, nowhere.stdout + nowhere.stderr
    assert f"no Docker engine answers at unix://{tmp_path}/missing.sock (docker context nowhere)" in nowhere.stderr


def test_an_engine_that_cannot_see_the_workspace_is_refused_before_anything_exists(docker_client, lab_name, tmp_path):
    """labctl runs in a mount namespace of its own whose workspace (a tmpfs) the engine cannot see,
    exactly as with a remote engine, Docker in Docker, or a CI job in a container."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    script = (f'mount -t tmpfs ddplab-test "{workspace}" && cd "{workspace}" '
              f'&& {sys.executable} -m labctl up --lab {lab_name} --nodes 2; echo "exit=$?"; '
              f'find "{workspace}" -mindepth 1')
    unshare = ["unshare", "--mount", "--propagation", "private"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    result = subprocess.run([*unshare, "sh", "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "COLUMNS": "200"})
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "exit=1", result.stdout + result.stderr
    assert lines[1:] == [], f"left files in the workspace: {lines[1:]}"
    assert "does not see this workspace" in result.stderr and "found nothing there" in result.stderr
    assert "unset DOCKER_HOST" in result.stderr and "Traceback" not in result.stderr
    assert lab_resources(docker_client, lab_name) == {"containers": [], "networks": [], "volumes": []}
    # nor any probe container left behind
    assert docker_client.api.containers(all=True, filters={"label": f"io.ddplab.lab={lab_name}"}) == []


def test_doctor_names_the_engine(lab_name):
    labctl("up", "--lab", lab_name, "--nodes", "2", *NO_RUNS, check=True)
    report = json.loads(labctl("doctor", "--lab", lab_name, "--json", check=True).stdout)
    engine = next(f for f in report["findings"] if f["check"] == "engine")
    assert engine["ok"] and engine["message"].startswith("docker: Docker Engine ")
    assert "at unix:///var/run/docker.sock" in engine["message"]


def test_podman_is_named_and_refused_before_anything_exists(tmp_path, lab_name):
    """Podman's Docker-compatible API, for real (Debian's podman 4.3): labctl says which engine it
    found and why not, and creates nothing there."""
    import shutil
    import time

    if shutil.which("podman") is None:  # `make test` installs it first (test-engines); run alone, as root on Debian:
        apt = "apt-get -o DPkg::Lock::Timeout=600"  # wait for another apt-get, never fail on its lock
        install = subprocess.run(f"{apt} install -y -qq podman || ({apt} update -qq && {apt} install -y -qq podman)",
                                 shell=True, capture_output=True, text=True, timeout=900)
        assert install.returncode == 0, f"could not install podman to test against it: {install.stderr[-500:]}"
    socket = f"unix://{tmp_path}/podman.sock"
    service = subprocess.Popen(["podman", "system", "service", "--time=0", socket], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    podman = {**os.environ, "DOCKER_HOST": socket}
    try:
        for _ in range(100):
            if subprocess.run(["docker", "version"], env=podman, capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        result = subprocess.run([sys.executable, "-m", "labctl", "up", "--lab", lab_name, "--nodes", "2"],
                                capture_output=True, text=True, env={**podman, "COLUMNS": "200"}, timeout=120)
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"the engine at {socket} is Podman " in result.stderr and "does not support" in result.stderr
        assert "Docker Engine (rootful or rootless) or Docker Desktop" in result.stderr
        assert "Traceback" not in result.stderr
        for kind in ("ps", "network ls", "volume ls"):
            listed = subprocess.run(["docker", *kind.split(), "-q", "--filter", f"label=io.ddplab.lab={lab_name}"],
                                    env=podman, capture_output=True, text=True)
            assert listed.returncode == 0 and listed.stdout.split() == [], (kind, listed.stdout, listed.stderr)
    finally:
        service.terminate()
        service.wait(timeout=30)
