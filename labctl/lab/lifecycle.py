"""Bring a lab up, read its state back from Docker, and tear it down. The side-effect half of
config, envfiles and compose: plans are built there (labctl.lab.up gathers them), applied here (`apply_up`).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from labctl.core.ui import Report
from labctl.engine import detect as engine_mod
from labctl.engine.detect import Engine
from labctl.engine.docker import (
    is_node,
    lab_containers,
    lab_networks,
    lab_nodes,
    lab_volumes,
    name_of,
    removal_in_progress,
)
from labctl.engine.labels import LABEL_GPUS, LABEL_LAB, LABEL_NODE, LABEL_RANK, container_name, network_name
from labctl.errors import CommandError, LabError, StateError
from labctl.image.packages import LABEL_PACKAGES
from labctl.lab import compose as compose_mod
from labctl.lab.envfiles import (
    write_env_files,
    write_if_changed,
)
from labctl.spec.labspec import (
    LabSpec,
)

log = logging.getLogger("labctl.lab.lifecycle")
READY_PREFIX = "DDPLAB_READY"
NOT_READY_PREFIX = "DDPLAB_NOT_READY"
READY_TIMEOUT_S = 60.0



@dataclass(frozen=True)
class NodeState:
    name: str
    ip: str
    torch: str
    state: str
    rank: int
    gpus: str = ""  # the machine's GPU indices the node has ("0,1"), from its label; "" for none
    packages: str = ""  # the hash of the package set its image was made with (labctl.image.packages); "" for none


def lab_dir(workspace: Path, lab: str) -> Path:
    return workspace / ".lab" / lab


OVERLAY_KEYS_DIR = "overlay"  # in the lab's folder: its overlay's WireGuard keys (labctl.net.overlay_apply), 0700


def forget_secrets(directory: Path) -> bool:
    """Remove the secrets a lab's bring-up made that live and die with the lab, in its folder: its
    overlay's keys (`down`; `gc` after a crash). Whether there were any."""
    folder = directory / OVERLAY_KEYS_DIR
    if not folder.exists():
        return False
    shutil.rmtree(folder)
    return True


COMPOSE_MISSING_HINT = "run `make engine`, which installs Compose v2 as a Docker CLI plugin"


def invoking_user() -> str:
    """uid:gid of the person running labctl (under sudo, the person behind sudo)."""
    uid = int(os.environ.get("SUDO_UID", os.getuid()))
    gid = int(os.environ.get("SUDO_GID", os.getgid()))
    return f"{uid}:{gid}"


def write_project(directory: Path, document: dict, env_files: dict[str, str]) -> Path:
    write_env_files(directory, env_files)
    for stale in directory.glob("node*.env"):
        if stale.name not in env_files:
            stale.unlink()
    compose_file = directory / "compose.yaml"
    write_if_changed(compose_file, compose_mod.render_compose(document))
    return compose_file


def compose_up_argv(compose_file: Path, lab: str) -> list[str]:
    # --remove-orphans: nodes beyond the new count (shrinking 5 -> 3) belong to the project but
    # not to the file any more. Compose recreates nodes whose env file changed (NNODES grew).
    return ["docker", "compose", "-f", str(compose_file), "-p", lab, "up", "-d", "--remove-orphans", "--quiet-pull"]


def apply_up(client, config: LabSpec, workspace: Path, document: dict, env_files: dict[str, str],
             report: Report, engine: Engine | None = None, started: str | None = None) -> list[NodeState]:
    """Write the project and run `docker compose up -d`, reporting `started` once Compose runs (what
    labctl says then costs Compose no time); wait until every node reports torch."""
    existed = bool(lab_containers(client, config.lab) or lab_networks(client, config.lab))
    if not existed:  # a new lab: first prove that its nodes will see and write the workspace as the caller
        # The probe runs the image node0 runs: a lab of CUDA-image nodes needs no CPU image.
        engine_mod.check_workspace(client, engine or engine_mod.usable_engine(client),
                                   document["services"]["node0"]["image"], workspace,
                                   lab_dir(workspace, config.lab), document["services"]["node0"]["user"],
                                   int(invoking_user().split(":")[0]), {LABEL_LAB: config.lab})
    compose_file = write_project(lab_dir(workspace, config.lab), document, env_files)
    argv = compose_up_argv(compose_file, config.lab)
    log.debug("$ %s", shlex.join(argv))
    try:
        # Compose runs in the background while we already watch the nodes that have started.
        compose = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        raise StateError("no docker CLI on PATH", hint=COMPOSE_MISSING_HINT) from None
    try:
        if started:
            report(started)
        return wait_nodes_ready(client, config.lab, config.node_names, compose, argv)
    except (CommandError, LabError, KeyboardInterrupt):
        compose.kill()
        compose.wait()
        # Never leave a half-built lab behind: a lab this call created goes again.
        if not existed:
            apply_down(client, config.lab, volumes=True)
        raise


def _check_compose(compose: subprocess.Popen, argv: list[str]) -> bool:
    """True once compose has finished well; raises if it failed."""
    if compose.poll() is None:
        return False
    stdout, stderr = compose.communicate()
    if compose.returncode == 0:
        return True
    if "is not a docker command" in stderr or "unknown command" in stderr:
        raise StateError("Docker Compose v2 is not installed (`docker compose` is not a docker command)",
                         hint=COMPOSE_MISSING_HINT)
    raise CommandError(argv, compose.returncode, stdout, stderr)


def _ready_line(client, name: str) -> str | None:
    import docker.errors

    try:
        text = client.api.logs(name, tail=20).decode(errors="replace")
    except docker.errors.NotFound:  # compose has not created it yet
        return None
    for line in text.splitlines():
        if line.startswith((READY_PREFIX, NOT_READY_PREFIX)):
            return line
    return None


def wait_nodes_ready(client, lab: str, names: list[str], compose: subprocess.Popen, argv: list[str],
                     timeout_s: float = READY_TIMEOUT_S) -> list[NodeState]:
    """Wait for Compose, then poll each node's log for the line its entry point prints once its
    Python finds torch.

    Nothing is asked of the engine while Compose works: `up -d` returns as soon as every node has
    started, and each request made meanwhile waits on the engine that is starting them, which only
    slows Compose down (a node that fails at start is seen just after). Each round then lists the
    lab's containers once and reads the logs of the nodes still pending.
    """
    deadline = time.monotonic() + timeout_s
    exited = threading.Event()  # set the moment compose exits (Popen.wait with a timeout looks every 50 ms)
    threading.Thread(target=lambda: (compose.wait(), exited.set()), name="compose-wait", daemon=True).start()
    if not exited.wait(timeout_s):
        raise LabError(f"nodes (compose) not ready within {timeout_s:.0f} s",
                       hint="the machine may be overloaded; `docker logs` on those containers shows why")
    _check_compose(compose, argv)
    pending = {name: container_name(lab, name) for name in names}
    ready: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=8) as pool:
        while pending:
            containers = lab_containers(client, lab)
            lines = dict(zip(pending, pool.map(lambda c: _ready_line(client, c), pending.values())))
            for name, line in lines.items():
                if line is None:
                    continue
                if line.startswith(NOT_READY_PREFIX):
                    raise LabError(f"{name}: {line}", hint="`labctl build --force` rebuilds the node image")
                ready[name] = line
                del pending[name]
            if not pending:
                break
            _check_exited(client, containers, pending)
            if time.monotonic() > deadline:
                raise LabError(f"nodes {', '.join(sorted(pending))} not ready within {timeout_s:.0f} s",
                               hint="the machine may be overloaded; `docker logs` on those containers shows why")
            time.sleep(0.02)
    return lab_status(client, lab, ready_lines=ready)


def _check_exited(client, containers: list[dict], pending: dict[str, str]) -> None:
    for container in containers:
        node = container["Labels"].get(LABEL_NODE)
        if node in pending and container["State"] in ("exited", "dead"):
            tail = client.api.logs(container["Id"], tail=5).decode(errors="replace").strip()
            raise LabError(f"{node} exited during start-up ({container['Status']}): {tail}",
                           hint=f"`docker logs {name_of(container)}` shows why; `labctl build --force` rebuilds the image")


def _torch_from(line: str | None) -> str:
    if not line or not line.startswith(READY_PREFIX):
        return "?"
    fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
    return fields.get("torch", "?")


def lab_status(client, lab: str, ready_lines: dict[str, str] | None = None) -> list[NodeState]:
    """Each node as Docker sees it now (not as a cache remembers it), in node-rank order."""
    net = network_name(lab)

    def describe(container: dict) -> NodeState:
        labels = container.get("Labels") or {}
        name = labels.get(LABEL_NODE, name_of(container))
        networks = (container.get("NetworkSettings") or {}).get("Networks") or {}
        ip = (networks.get(net) or {}).get("IPAddress") or "-"
        line = (ready_lines or {}).get(name)
        if line is None and container["State"] == "running":
            line = _ready_line(client, container["Id"])
        return NodeState(name=name, ip=ip, torch=_torch_from(line), state=container["State"],
                         rank=int(labels.get(LABEL_RANK, "0")), gpus=labels.get(LABEL_GPUS, ""),
                         packages=labels.get(LABEL_PACKAGES, "")[:12])

    with ThreadPoolExecutor(max_workers=8) as pool:
        containers = lab_nodes(client, lab)
        nodes = list(pool.map(describe, containers))
    return sorted(nodes, key=lambda n: n.rank)


def lab_resources(client, lab: str, volumes: bool = True) -> dict[str, list[str]]:
    """Names of everything labelled with the lab: what `down` removes."""
    return {
        "containers": sorted(name_of(c) for c in lab_containers(client, lab)),
        "networks": sorted(n.name for n in lab_networks(client, lab)),
        "volumes": sorted(v.name for v in lab_volumes(client, lab)) if volumes else [],
    }


def is_compose_up_for(argv: list[str], lab: str) -> bool:
    """Whether a command line is `docker compose ... -p LAB up ...` (or the plugin it execs)."""
    if "compose" not in argv or "up" not in argv:
        return False
    return any(a == "-p" and b == lab for a, b in zip(argv, argv[1:]))


def kill_orphaned_compose(lab: str) -> int:
    """SIGKILL a `compose up` of this lab that outlived its labctl (killed with -9 mid-up), so it
    cannot create nodes after `down` has removed them."""
    killed = 0
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv = entry.joinpath("cmdline").read_bytes().decode(errors="replace").split("\0")
            if is_compose_up_for(argv, lab):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
        except (OSError, ValueError):
            continue
    return killed


def apply_down(client, lab: str, volumes: bool = False) -> dict[str, int]:
    """Remove every container and network labelled with the lab (the volume with `volumes`).

    Works from labels alone, not from the compose file, so it also cleans up after an `up` that was
    interrupted or crashed half-way; running it again finds nothing and succeeds.
    """
    import docker.errors

    def remove(resource) -> int:
        try:
            if isinstance(resource, dict):
                client.api.remove_container(resource["Id"], force=True)
            else:
                resource.remove()
            return 1
        except docker.errors.NotFound:
            return 0
        except docker.errors.APIError as exc:
            # Another process (a concurrent `down` or `gc` of the same lab) is removing it already: wait
            # for that to end, as if this call had removed it, rather than fail on the engine's 409.
            if not removal_in_progress(exc) or not isinstance(resource, dict):
                raise
            _wait_gone(client, resource["Id"])
            return 0

    if kill_orphaned_compose(lab):
        time.sleep(0.5)  # let the engine finish the create calls already in flight
    containers = lab_containers(client, lab)
    with ThreadPoolExecutor(max_workers=8) as pool:
        removed = list(pool.map(remove, containers))
    # the nodes are what a user counts; their helpers (labctl.net.apply) go with them
    removed_containers = sum(n for n, c in zip(removed, containers) if is_node(c))
    names = [name_of(c) for c in containers]
    removed_networks = sum(_remove_network(n, lab, names) for n in lab_networks(client, lab))
    removed_volumes = 0
    if volumes:
        removed_volumes = sum(remove(v) for v in lab_volumes(client, lab))
    return {"containers": removed_containers, "networks": removed_networks, "volumes": removed_volumes}


def _wait_gone(client, container_id: str, wait_s: float = 30.0) -> None:
    """Until the engine no longer knows the container (another process is removing it)."""
    import docker.errors

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return
        time.sleep(0.2)


def _remove_network(network, lab: str, removed: list[str], wait_s: float = 10.0) -> int:
    """Remove a lab network; a container still being attached (a concurrent `up` of the same lab, a
    create call in flight) is given `wait_s` to go, then named in a StateError.

    Docker 20.10 can keep the endpoint of a container it has just force-removed (moby/moby#42119:
    "has active endpoints" with no container listed); a forced disconnect of each removed container
    by name clears such a stale endpoint, as `docker network disconnect -f` does.
    """
    import docker.errors

    deadline = time.monotonic() + wait_s
    stale_cleared = False
    while True:
        try:
            network.remove()
            return 1
        except docker.errors.NotFound:
            return 0
        except docker.errors.APIError as exc:
            if "active endpoints" not in str(exc):
                raise
            if not stale_cleared:
                stale_cleared = True
                for name in removed:
                    try:
                        network.disconnect(name, force=True)
                    except docker.errors.APIError:  # not attached, or gone: nothing stale to clear
                        pass
                continue
            if time.monotonic() > deadline:
                network.reload()
                attached = ", ".join(c.get("Name", "?") for c in (network.attrs.get("Containers") or {}).values())
                raise StateError(f"lab {lab}: network {network.name} still has containers attached ({attached or 'none listed'})",
                                 hint=f"another `labctl up --lab {lab}` may be running; wait for it, then `labctl down --lab {lab}`") from None
            time.sleep(0.2)


def require_running(client, lab: str) -> list[NodeState]:
    nodes = lab_status(client, lab)
    if not nodes:
        raise StateError(f"lab '{lab}' is not up (no containers labelled {LABEL_LAB}={lab})",
                         hint=f"`labctl up --lab {lab} --nodes 3` brings it up")
    down = [n.name for n in nodes if n.state != "running"]
    if down:
        raise StateError(f"lab '{lab}': {', '.join(down)} not running ({', '.join(n.state for n in nodes if n.state != 'running')})",
                         hint=f"`labctl up --lab {lab}` restores the nodes")
    return nodes


