"""The lab as the engine's API sees it: the client, the lab's labelled containers, networks and
volumes, `docker exec` into a node, and a node's CPU limit. Every other module that needs the engine
receives a client made here (by `docker_client`), never one of its own.
"""

from __future__ import annotations

import os
import queue
import socket as pysocket
import threading
import time
from typing import Callable, Iterator

from labctl.core.proc import run
from labctl.engine import detect as engine_mod
from labctl.engine.labels import LABEL_EXEC_USER, LABEL_LAB, LABEL_NODE, container_name
from labctl.errors import ConfigError, LabError, StateError


def docker_client():
    """A client for the engine DOCKER_HOST or the Docker CLI's context names (as `docker` and Compose
    find it), or a clear error saying which engine did not answer and how to get one."""
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=120)
        client.ping()
        return client
    except docker.errors.DockerException as exc:
        where, context = engine_mod.configured_endpoint()
        via = f" (docker context {context})" if context else " (DOCKER_HOST)" if os.environ.get("DOCKER_HOST") else ""
        reason = str(exc).splitlines()[0][:200]
        raise StateError(f"no Docker engine answers at {where}{via} ({reason})",
                         hint="start one: `make engine` (as root on Debian it installs and starts dockerd), "
                              "or start Docker Desktop / `sudo systemctl start docker`; check with `docker info`") from None


def lab_containers(client, lab: str) -> list[dict]:
    """The lab's containers as the engine lists them: one API call, whatever the lab's size.

    (The SDK's containers.list() inspects each container in turn; 16 nodes, 16 more calls.)
    """
    return client.api.containers(all=True, filters={"label": f"{LABEL_LAB}={lab}"})


def is_node(container: dict) -> bool:
    """Whether a listed container is a node, not a helper (a node's kept network helper, a pending
    --duration undo), which carries the lab's label but no node's."""
    return bool((container.get("Labels") or {}).get(LABEL_NODE))


def lab_nodes(client, lab: str) -> list[dict]:
    """The lab's nodes: its containers less its helpers (is_node)."""
    return [c for c in lab_containers(client, lab) if is_node(c)]


def removal_in_progress(exc: Exception) -> bool:
    """The engine's 409 when another client (a container's own auto-remove, a concurrent `down`) is
    removing the container already: it is going, so a caller that wanted it gone has what it wanted."""
    return getattr(exc, "status_code", None) == 409 and "already in progress" in str(exc)


def remove_gone(client, container_id: str) -> None:
    """Force-remove a container; one already gone, or going (removal_in_progress), is what was wanted."""
    import docker.errors

    try:
        client.api.remove_container(container_id, force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if not removal_in_progress(exc):
            raise


def name_of(container: dict) -> str:
    return container["Names"][0].lstrip("/")


def exec_user(client, lab: str) -> str | None:
    """The uid:gid labctl's execs run as in a lab whose nodes run as root (a Slurm lab: the daemons
    need root), from its nodes' label; None where the nodes run as the user already."""
    for container in lab_containers(client, lab):
        user = (container.get("Labels") or {}).get(LABEL_EXEC_USER)
        if user:
            return user
    return None


def exec_in(client, container: str, argv: list[str], env: dict[str, str] | None = None, user: str = "",
            workdir: str | None = None) -> tuple[int, str]:
    """Run argv in a container and wait: (exit code, stdout and stderr together). `user` "" runs it
    as the container runs; `workdir` None in its working directory."""
    exec_id = client.api.exec_create(container, argv, environment=env or {}, user=user, workdir=workdir)["Id"]
    output = client.api.exec_start(exec_id).decode(errors="replace")
    return client.api.exec_inspect(exec_id)["ExitCode"], output


def docker_exec_argv(container: str, argv: list[str], tty: bool = False, user: str | None = None) -> list[str]:
    """`docker exec` of argv in the container, as a person types it: stdin attached (a pipe reaches
    the command), and a terminal (-t) when labctl has one, so a shell or top behaves as at a prompt;
    as `user` where the node itself runs as another (see exec_user)."""
    return ["docker", "exec", "-i", *(["-t"] if tty else []), *(["-u", user] if user else []), container, *argv]


class DockerNodes:
    """The lab's nodes as a run reaches them: `docker exec` into each node's container.

    One of the two kinds of `run.executor.Nodes` (the other is `hosts.ssh.SSHHosts`): the executor, the store,
    stopping and doctor's probes go through these few methods, whatever carries them.
    """

    holds_stdin = True  # a launch's stdin can be held open and closed (`release`)

    def __init__(self, client, lab: str):
        self.client = client
        self.lab = lab
        self.user = exec_user(client, lab) or ""  # "": as the node runs
        self.port_hint = f"move the lab to another port with `labctl up --lab {lab} --master-port PORT`"
        self._held: dict[str, object] = {}  # launch label -> the exec's socket, its stdin held open

    def address(self, node: str) -> str:
        return container_name(self.lab, node)

    def shell_hint(self, node: str) -> str:
        return f"docker exec {container_name(self.lab, node)}"

    def run(self, node: str, argv: list[str]) -> tuple[int, str]:
        return exec_in(self.client, container_name(self.lab, node), argv, user=self.user)

    def execute(self, launch, on_output: Callable[[bytes, int], None]) -> int:
        """Run a launch, each chunk of its output to `on_output` with its stream (1 stdout, 2 stderr)."""
        api = self.client.api
        exec_id = api.exec_create(container_name(self.lab, launch.node), launch.argv, environment=launch.env,
                                  workdir=launch.workdir, user=self.user, stdin=launch.hold_stdin)["Id"]
        if not launch.hold_stdin:
            for out, err in api.exec_start(exec_id, stream=True, demux=True):
                if out:
                    on_output(out, 1)
                if err:
                    on_output(err, 2)
            return api.exec_inspect(exec_id)["ExitCode"]
        from docker.utils.socket import frames_iter

        sock = api.exec_start(exec_id, socket=True)
        self._held[launch.label] = sock
        try:
            for stream, chunk in frames_iter(sock, tty=False):
                on_output(chunk, 2 if stream == 2 else 1)
        finally:
            self._held.pop(launch.label, None)
            sock.close()
        return api.exec_inspect(exec_id)["ExitCode"]

    def release(self, launch) -> None:
        """Close the stdin of a launch started with `hold_stdin`: it reads end-of-file (the warm store ends)."""
        sock = self._held.get(launch.label)
        if sock is not None:
            raw = getattr(sock, "_sock", sock)  # the socket under docker's SocketIO
            try:
                raw.shutdown(pysocket.SHUT_WR)
            except OSError:
                pass

    def node_lost(self, node: str, exit_code: int) -> str | None:
        """Whether a launch ended because its node went down (the engine may take a moment to tell)."""
        for _ in range(10 if exit_code == 137 else 1):  # 137: SIGKILL, as `docker kill` sends
            state = self.client.api.inspect_container(container_name(self.lab, node))["State"]
            if not state["Running"]:
                return f"{node} itself went down (container {state['Status']}, exit code {state['ExitCode']}): node lost"
            time.sleep(0.2)
        return None

    def close(self) -> None:
        pass


def lab_networks(client, lab: str) -> list:
    return client.networks.list(filters={"label": f"{LABEL_LAB}={lab}"})


def network_subnets(network) -> list[str]:
    config = (network.attrs.get("IPAM") or {}).get("Config") or []
    return [c["Subnet"] for c in config if c.get("Subnet")]


def engine_cpus(client) -> int:
    return int(client.info().get("NCPU") or os.cpu_count() or 1)


def check_cpu_limits(client, limits: dict[str, float]) -> None:
    """Each limit (keyed by how to name it in an error) at most the engine's CPUs; one engine query."""
    if not limits:
        return
    ncpu = engine_cpus(client)
    for key, cpus in limits.items():
        if cpus > ncpu:
            raise ConfigError(key, cpus, f"must be at most the engine's {ncpu} CPUs", hint="a node cannot have more CPUs than the machine")


def lab_volumes(client, lab: str) -> list:
    return client.volumes.list(filters={"label": f"{LABEL_LAB}={lab}"})


def node_cpus_limit(client, lab: str, node: str, cpus: int | None = None) -> float | None:
    """The node's CPU limit as the engine applies it now; None when it has none (a limit of all the
    engine's `cpus`, asked of the engine unless given, is none)."""
    nano = client.api.inspect_container(container_name(lab, node))["HostConfig"].get("NanoCpus") or 0
    return nano / 1e9 if nano and nano < (cpus or engine_cpus(client)) * 1e9 else None


def apply_node_cpus(client, lab: str, node: str, cpus: float | None, purpose: str = "") -> float | None:
    """Change a running node's CPU limit in place (no restart): a straggler on demand, or a manifest's
    limit for a `k8s run` (`purpose` says which, where an engine refuses CPU limits).

    None lifts the limit. `docker update --cpus 0` is ignored by the engine once a limit is set,
    so "no limit" is written as all of the engine's CPUs, which is the same thing.
    """
    engine = engine_mod.inspect_engine(client)
    refused = engine_mod.cpu_limits_refusal(engine, purpose or f"slowing {node} down") if cpus is not None else None
    if refused:
        raise refused
    value = cpus if cpus is not None else engine.cpus
    run(["docker", "update", "--cpus", f"{value:g}", container_name(lab, node)], timeout_s=60)
    return node_cpus_limit(client, lab, node, engine.cpus)


def container_log(client, lab: str, node: str, tail: int | None = None) -> str:
    """The node container's own log (its entry point's output), or its last `tail` lines."""
    import docker.errors

    try:
        return client.api.logs(container_name(lab, node), tail="all" if tail is None else tail).decode(errors="replace")
    except docker.errors.NotFound:
        raise LabError(f"no node {node!r} in lab {lab!r}", hint="`labctl status` lists the nodes") from None


def follow_container_logs(client, lab: str, nodes: list[str], tail: int | None = None,
                          wait_s: float = 0.5) -> Iterator[tuple[str, str]]:
    """(node, whole lines) from the containers' logs as they come (`docker logs -f` on each node at
    once), after each one's last `tail` lines; ends when every container has stopped."""
    lines: queue.Queue = queue.Queue()

    def pump(node: str) -> None:
        try:
            for chunk in client.api.logs(container_name(lab, node), stream=True, follow=True,
                                         tail="all" if tail is None else tail):
                lines.put((node, chunk))
        except Exception as exc:  # noqa: BLE001 - the engine's error, raised again in the caller's thread
            lines.put((node, exc))
        lines.put((node, None))

    for node in nodes:
        threading.Thread(target=pump, args=(node,), name=f"logs-{node}", daemon=True).start()
    partial = {node: b"" for node in nodes}
    open_streams = len(nodes)
    while open_streams:
        try:
            node, chunk = lines.get(timeout=wait_s)  # a timeout, so that Ctrl-C is seen at once
        except queue.Empty:
            continue
        if isinstance(chunk, Exception):
            raise chunk
        if chunk is None:
            open_streams -= 1
            text, partial[node] = partial[node], b""
            if text:
                yield node, text.decode(errors="replace") + "\n"
            continue
        *complete, partial[node] = (partial[node] + chunk).split(b"\n")
        if complete:
            yield node, b"".join(line + b"\n" for line in complete).decode(errors="replace")


def node_limits(client, lab: str, node: str) -> tuple[int, int, int]:
    """The node's (NanoCpus, Memory, MemorySwap) as the engine has them now (0: none)."""
    config = client.api.inspect_container(container_name(lab, node))["HostConfig"]
    return config.get("NanoCpus") or 0, config.get("Memory") or 0, config.get("MemorySwap") or 0


def apply_node_memory(client, lab: str, node: str, memory: int | None, before: tuple[int, int, int]) -> None:
    """A running node's memory limit (bytes) changed in place (`docker update`); swap keeps the room over
    memory it had in `before` (node_limits). None puts back no limit, written as all of the engine's
    memory: the engine ignores 0 once a limit is set (as apply_node_cpus does for CPUs)."""
    _nano, mem, swap = before
    memory = memory if memory is not None else engine_mod.inspect_engine(client).memory_bytes
    run(["docker", "update", "--memory", str(memory), "--memory-swap",
         str(memory + swap - mem if swap > 0 and mem > 0 else -1), container_name(lab, node)], timeout_s=60)


# Empty the folder a node's TORCHINDUCTOR_CACHE_DIR names (compose.compile_cache_dir), as the node's
# user, who wrote it, and say which it was: none where the variable is not set.
CLEAR_COMPILE_CACHE = 'd="$TORCHINDUCTOR_CACHE_DIR"; [ -z "$d" ] || { rm -rf "$d" && echo "$d"; }'


def clear_compile_caches(client, lab: str, nodes: list[str]) -> dict[str, str]:
    """Each node's torch.compile cache emptied in place (the lab stays up): node -> the folder, on
    the shared volume, "" for a node without one. Nodes of one image share a folder; emptying it
    again is harmless."""
    out = {}
    for node in nodes:
        code, said = exec_in(client, container_name(lab, node), ["sh", "-c", CLEAR_COMPILE_CACHE])
        if code != 0:
            raise StateError(f"{node}: could not empty its compile cache: {said.strip()}",
                             hint=f"labctl exec {node} -- ls -ld \"$TORCHINDUCTOR_CACHE_DIR\"")
        out[node] = said.strip()
    return out
