"""Which container engine labctl talks to, and whether a lab can work on it.

The Docker SDK (7.2 and newer) and `docker compose` find the engine the same way: DOCKER_HOST,
else DOCKER_CONTEXT, else the Docker CLI's current context (~/.docker/config.json), else the local
socket. Older SDKs skipped the context, so labctl and Compose could talk to two different engines;
pyproject.toml requires 7.2.

What a lab needs of an engine, beyond answering:
- It runs Docker, not Podman. Podman's Docker-compatible API answers most calls, but a lab has
  not been made to work on it or tested there (rootless Podman, for one, accepts limits on
  cgroup v1 that it does not enforce): refused with one message rather than failing half-way.
- The nodes can see and write the workspace, as the invoking user. The workspace is bind-mounted
  into every node, and a bind mount is resolved on the engine's machine: a remote engine
  (DOCKER_HOST=ssh://..., tcp://..., a CI job inside a container talking to the host's engine)
  mounts an empty or different folder. Rootless Docker maps the caller to root inside its user
  namespace, so nodes run as uid 0 there (which is the caller outside); running them as the
  caller's own uid would make them a subordinate uid that cannot write the workspace.
  `check_workspace` proves all of this with one short container before a lab is created.
"""

from __future__ import annotations

import json
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Mapping

from labctl.errors import StateError

EngineKind = Literal["docker", "docker-rootless", "docker-desktop", "podman"]
DEFAULT_ENDPOINT = "unix:///var/run/docker.sock"
CHECKED_FILE = "engine-checked.json"  # in .lab/: the engine that last passed check_workspace
LOCAL_ENDPOINT_HINT = ("run labctl on the machine the engine runs on, or point it at a local engine: "
                       "unset DOCKER_HOST, or `docker context use default`")


@dataclass(frozen=True)
class Engine:
    """The engine as it describes itself (`docker info`, `docker version`), and how it was reached."""

    kind: EngineKind
    product: str  # "Docker Engine", "Docker Desktop", "Podman"
    version: str
    endpoint: str
    context: str | None  # the Docker CLI context it came from, if any
    os: str
    arch: str
    cpus: int
    engine_id: str
    userns_remap: bool = False
    limits: bool = True  # it enforces CPU, memory and process limits (rootless Docker on cgroup v1 does not)
    runtimes: tuple[str, ...] = ()  # the container runtimes it offers (runc, nvidia, ...)
    memory_bytes: int = 0  # the memory of the machine (or VM) its containers run on; 0: not said

    @property
    def local(self) -> bool:
        """Reached through a socket on this machine (which may still be a VM's, as Docker Desktop's is)."""
        return self.endpoint.startswith(("unix://", "npipe://"))

    @property
    def rootless(self) -> bool:
        return self.kind == "docker-rootless"

    def describe(self) -> str:
        via = f" (context {self.context})" if self.context else ""
        mode = "rootless" if self.rootless else "userns-remap" if self.userns_remap else ""
        cgroups = "" if self.limits else "no cgroup limits"
        extra = ", ".join(x for x in (mode, cgroups, f"{self.os}, {self.arch}, {self.cpus} CPUs") if x)
        return f"{self.product} {self.version} at {self.endpoint}{via}: {extra}"


# --------------------------------------------------------------------------------------- pure


def normalize_machine(arch: str) -> str:
    """Docker, Podman and uname spell architectures differently: amd64/x86_64, arm64/aarch64."""
    return {"amd64": "x86_64", "x86-64": "x86_64", "arm64": "aarch64", "arm64/v8": "aarch64"}.get(arch.lower(), arch.lower())


def resolve_endpoint(environ: Mapping[str, str], current_context: str | None,
                     context_hosts: Mapping[str, str | None]) -> tuple[str, str | None]:
    """(endpoint, context name) the way the Docker CLI, Compose and the SDK pick them."""
    if environ.get("DOCKER_HOST"):
        return environ["DOCKER_HOST"], None
    name = environ.get("DOCKER_CONTEXT") or current_context or "default"
    if name == "default":
        return DEFAULT_ENDPOINT, None
    return context_hosts.get(name) or DEFAULT_ENDPOINT, name


def classify(info: Mapping, version: Mapping, endpoint: str, context: str | None = None) -> Engine:
    """An Engine from the engine's own `info` and `version` answers."""
    components = [c.get("Name", "") for c in version.get("Components") or []]
    security = " ".join(info.get("SecurityOptions") or [])
    operating_system = str(info.get("OperatingSystem") or "?")
    if any("podman" in c.lower() for c in components):
        kind, product = "podman", "Podman"
    elif "name=rootless" in security:
        kind, product = "docker-rootless", "Docker Engine"
    elif operating_system == "Docker Desktop" or str(info.get("Name")) == "docker-desktop":
        kind, product = "docker-desktop", "Docker Desktop"
    else:
        kind, product = "docker", "Docker Engine"
    return Engine(kind=kind, product=product, version=str(info.get("ServerVersion") or version.get("Version") or "?"),
                  endpoint=endpoint, context=context, os=operating_system,
                  arch=normalize_machine(str(info.get("Architecture") or "?")), cpus=int(info.get("NCPU") or 1),
                  memory_bytes=int(info.get("MemTotal") or 0),
                  engine_id=str(info.get("ID") or ""), userns_remap="name=userns" in security,
                  # Docker says what its cgroups can do; rootless Docker on cgroup v1 runs without any
                  # and accepts --cpus, --memory and --pids-limit silently, enforcing none of them.
                  limits=info.get("CgroupDriver") != "none"
                  and all(info.get(flag, True) for flag in ("CpuCfsQuota", "MemoryLimit", "PidsLimit")),
                  runtimes=tuple(sorted(info.get("Runtimes") or {})))


def refusal(engine: Engine) -> StateError | None:
    """Why a lab cannot run on this engine, or None."""
    if engine.kind == "podman":
        return StateError(
            f"the engine at {engine.endpoint} is Podman {engine.version}, which ddplab does not support: its "
            "Docker-compatible API answers, but a lab has not been made to work on it or tested there (rootless "
            "Podman, for one, accepts CPU and memory limits on cgroup v1 that it does not enforce)",
            hint="use Docker Engine (rootful or rootless) or Docker Desktop; point DOCKER_HOST or "
                 "`docker context use` at it")
    return None


NO_LIMITS_WHY = ("it runs without cgroups (rootless Docker on a cgroup v1 system) and accepts limits without "
                 "enforcing them")
NO_LIMITS_HINT = ("boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1), where rootless Docker enforces limits, "
                  "or use rootful Docker")


def cpu_limits_refusal(engine: Engine, what: str) -> StateError | None:
    """A CPU limit asked of an engine that would ignore it: a straggler that is not slow, silently."""
    if engine.limits:
        return None
    return StateError(f"{what} needs CPU limits, and the engine at {engine.endpoint} cannot enforce them: {NO_LIMITS_WHY}",
                      hint=NO_LIMITS_HINT)


def limits_warning(engine: Engine, memory: str | None, pids_limit: int) -> str | None:
    """What a lab on this engine goes without (said once at `up`, never silently)."""
    if engine.limits:
        return None
    caps = " and ".join(x for x in (f"{memory} memory" if memory else "", f"{pids_limit} process") if x)
    return (f"warning: the engine at {engine.endpoint} {NO_LIMITS_WHY}: the nodes run without the {caps} limits, "
            f"and `labctl slow`, `--cpus` and `fault pause` are not available ({NO_LIMITS_HINT})")


def ssh_refusal(engine: Engine) -> StateError | None:
    """`up --ssh` hands the nodes' addresses to SSH on this machine: rootless Docker keeps its networks
    inside its own network namespace, where nothing on the host can reach them."""
    if not engine.rootless:
        return None
    return StateError(f"--ssh needs the nodes' addresses reachable from this machine, and rootless Docker (at "
                      f"{engine.endpoint}) keeps its networks inside its own network namespace",
                      hint="bring the lab up without --ssh (`labctl run` reaches the nodes through the engine), "
                           "or use rootful Docker for `labctl hosts` rehearsals")


NVIDIA_HOOKS = ("nvidia-container-runtime-hook", "nvidia-container-cli")


def gpu_runtime_refusal(engine: Engine, asked: str, hooks_found: list[str]) -> StateError | None:
    """GPUs for the nodes need the NVIDIA Container Toolkit where the engine runs: Docker hands a GPU
    request to its `nvidia` runtime, or (its built-in GPU support) to nvidia-container-runtime-hook on
    its PATH. `hooks_found`: the NVIDIA_HOOKS on this machine's PATH, which say something only of a local engine."""
    if "nvidia" in engine.runtimes or (hooks_found and engine.local):
        return None
    where = "this machine has none of " + " or ".join(NVIDIA_HOOKS) + " on PATH" if engine.local else \
        "it is not on this machine, so its tools cannot be looked for"
    return StateError(f"{asked} needs the NVIDIA Container Toolkit on the engine at {engine.endpoint}: its runtimes are "
                      f"{', '.join(engine.runtimes) or 'not listed'} (no nvidia), and {where}",
                      hint="install the NVIDIA Container Toolkit, then `sudo nvidia-ctk runtime configure "
                           "--runtime=docker` and restart Docker; or leave --gpus out (`--cuda N` runs the CUDA image "
                           "on CPU)")


def node_user(engine: Engine, caller: str) -> str:
    """The uid:gid nodes run as, so that what they write in the workspace belongs to the caller.

    Rootless Docker maps the caller to uid 0 inside its user namespace: 0:0 there is the caller here.
    Any other uid inside would be one of the caller's subordinate uids, which cannot write the workspace.
    """
    return "0:0" if engine.rootless else caller


# ------------------------------------------------------------------------------ side effects


def configured_endpoint(environ: Mapping[str, str] = os.environ) -> tuple[str, str | None]:
    """(endpoint, context) as configured here: DOCKER_HOST, DOCKER_CONTEXT and the CLI's config."""
    from docker.context import ContextAPI

    try:
        current = ContextAPI.get_current_context()
        contexts = {c.Name: c.Host for c in ContextAPI.contexts()}
        current_name = current.Name if current else None
    except Exception:  # noqa: BLE001 - an unreadable CLI config means no context to follow
        current_name, contexts = None, {}
    return resolve_endpoint(environ, current_name, contexts)


def inspect_engine(client, environ: Mapping[str, str] = os.environ) -> Engine:
    """Ask the engine labctl's client talks to what it is: two API calls, made at once (each takes the
    engine 5-8 ms), while the CLI's context is read here."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        info, version = pool.submit(client.info), pool.submit(client.version)
        endpoint, context = configured_endpoint(environ)
        return classify(info.result(), version.result(), endpoint, context)


def usable_engine(client) -> Engine:
    """The engine the client talks to, refused here if a lab cannot run on it (Podman)."""
    found = inspect_engine(client)
    problem = refusal(found)
    if problem:
        raise problem
    return found


@dataclass(frozen=True)
class WorkspaceProbe:
    """What one short container as a node saw of the workspace."""

    exit_code: int
    output: str  # what it printed: the token it read back, or the error
    seen: bool  # it read the token written here: the engine mounts this very folder
    wrote: bool  # the file it wrote appeared here
    owner_uid: int | None  # and belongs to this uid here


def probe_workspace(client, image: str, workspace: Path, lab_dir: Path, user: str, labels: dict[str, str]) -> WorkspaceProbe:
    """Run a container as a node would (the workspace bind-mounted at its own path, as `user`): it
    reads a token written here, and writes one back."""
    import docker.errors

    token, name = secrets.token_hex(8), secrets.token_hex(4)  # the name must not give the token away
    made = [d for d in (lab_dir.parent, lab_dir) if not d.exists()]
    lab_dir.mkdir(parents=True, exist_ok=True)
    inbound, outbound = lab_dir / f".engine-probe-{name}", lab_dir / f".engine-probe-{name}.back"
    inbound.write_text(token + "\n")
    script = Path(__file__).resolve().parents[1] / "remote" / "workspace-probe.sh"
    try:
        container = client.containers.run(image, ["sh", "-c", script.read_text(), "workspace-probe", str(inbound),
                                                  str(outbound)],
                                          entrypoint=[], detach=True, user=user, network_disabled=True,
                                          labels=labels, security_opt=["no-new-privileges"],
                                          volumes={str(workspace): {"bind": str(workspace), "mode": "rw"}})
        try:
            code = container.wait(timeout=60)["StatusCode"]
            output = container.logs().decode(errors="replace").strip()
        finally:
            container.remove(force=True)
        wrote = outbound.exists()
        owner = outbound.stat().st_uid if wrote else None
        return WorkspaceProbe(code, output, output.splitlines()[:1] == [token], wrote, owner)
    except docker.errors.APIError as exc:  # e.g. the bind source does not exist on the engine's machine
        return WorkspaceProbe(125, str(exc.explanation or exc), False, False, None)
    finally:
        for path in (inbound, outbound):
            path.unlink(missing_ok=True)
        for directory in reversed(made):  # leave no trace of a lab that may never be made
            try:
                directory.rmdir()
            except OSError:  # something else wrote there meanwhile: not ours to remove
                pass


def workspace_problem(probe: WorkspaceProbe, engine: Engine, workspace: Path, user: str,
                      caller_uid: int) -> StateError | None:
    """Pure: what the probe says is wrong with running nodes on this engine from this workspace."""
    where = f"the engine at {engine.endpoint}"
    if not probe.seen:
        empty = "No such file" in probe.output or not probe.output
        found = "nothing there" if empty else f"something else there ({probe.output[:120]!r})"
        return StateError(
            f"{where} does not see this workspace: a container mounting {workspace} found {found}. A bind mount "
            "is resolved on the engine's own machine, so the engine is remote (DOCKER_HOST, a docker context, Docker "
            "in Docker, or a CI job inside a container) and the nodes would see "
            f"{'an empty folder' if empty else 'another folder'} instead of your files",
            hint=LOCAL_ENDPOINT_HINT)
    if not probe.wrote:
        mode = " (rootless Docker)" if engine.rootless else " (userns-remap)" if engine.userns_remap else ""
        return StateError(
            f"nodes cannot write the workspace {workspace}: a container running as {user}{mode} on {where} "
            f"could read it but not write it ({probe.output[-200:] or f'exit status {probe.exit_code}'})",
            hint="make the workspace writable by your user, or run labctl from a folder you own")
    if probe.owner_uid != caller_uid:
        return StateError(
            f"files the nodes write in {workspace} would belong to uid {probe.owner_uid}, not to you (uid {caller_uid}): "
            f"{where} maps container users to other uids{' (userns-remap)' if engine.userns_remap else ''}",
            hint="run the lab on an engine without userns-remap, or as rootless Docker of your own user")
    return None


def check_workspace(client, engine: Engine, image: str, workspace: Path, lab_dir: Path, user: str,
                    caller_uid: int, labels: dict[str, str]) -> None:
    """Refuse (before anything of a lab exists) an engine whose nodes would not see and write this
    workspace as the caller. About 0.2 s, once per engine, workspace and user: a pass is remembered
    in .lab/ by the engine's id, which a remote engine does not share."""
    record = lab_dir.parent / CHECKED_FILE
    key = {"engine_id": engine.engine_id, "workspace": str(workspace), "user": user, "caller_uid": caller_uid}
    try:
        if engine.engine_id and json.loads(record.read_text()) == key:
            return
    except (OSError, ValueError):
        pass
    problem = workspace_problem(probe_workspace(client, image, workspace, lab_dir, user, labels), engine, workspace,
                                user, caller_uid)
    if problem:
        raise problem
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(key) + "\n")
