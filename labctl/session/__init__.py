"""This lab, on this engine, in this workspace: what every operation on a running lab needs, carried
together so that no caller passes a client, a lab name and a workspace side by side.

`LabSession` reads the lab (its nodes, env files, subnet, logs) and runs jobs on it through the one
run plan and executor: it sits above labctl.lab and labctl.run, which know nothing of each other,
and below the benches, diagnostics and the Slurm cluster, which receive a session and never make a
client of their own. Bringing labs up and down, shaping and faults are `labctl.api.Lab`'s, which is
a LabSession too.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterator

from labctl.engine.docker import (
    DockerNodes,
    container_log,
    docker_client,
    docker_exec_argv,
    engine_cpus,
    exec_user,
    follow_container_logs,
    lab_networks,
    network_subnets,
)
from labctl.engine.labels import container_name
from labctl.errors import LabError, StateError
from labctl.image.lockfile import describe_lock_file
from labctl.image.packages import LOCK_FILE
from labctl.lab.envfiles import read_node_envs
from labctl.lab.lifecycle import NodeState, lab_dir, lab_status, require_running
from labctl.net.overlay import Overlay, envs_on
from labctl.net.overlay_apply import running_overlay
from labctl.run.calibrations import latest_calibration
from labctl.run.executor import execute
from labctl.run.logs import check_tail, follow_run_logs, run_logs
from labctl.run.launch import job_args
from labctl.run.plan import RunOptions, RunPlan, build_run_plan
from labctl.run.result import RunResult
from labctl.spec.labspec import LabSpec


class LabSession:
    """One lab (`config.lab`) in one workspace, on the engine `client` talks to. Unless a client is
    given, `connect` makes one on first use (labctl.engine.docker.docker_client by default): reading a
    run's saved logs needs no engine."""

    def __init__(self, config: LabSpec, workspace: Path, client: Any = None,
                 connect: Callable[[], Any] = docker_client):
        self.config = config
        self.workspace = Path(workspace)
        self._client = client
        self._connect = connect  # how to make the client when first needed

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, workspace={str(self.workspace)!r})"

    @property
    def client(self) -> Any:
        """The docker.DockerClient (made once, on first use; a StateError when no engine answers)."""
        if self._client is None:
            self._client = self._connect()
        return self._client

    @property
    def name(self) -> str:
        return self.config.lab

    @property
    def directory(self) -> Path:
        """`.lab/<lab>/` in the workspace: env files, compose.yaml, runs."""
        return lab_dir(self.workspace, self.name)

    def link_calibration(self) -> dict | None:
        """When the lab's links were last calibrated, by which run (labctl.run.calibrations); None: never."""
        return latest_calibration(self.directory)

    @cached_property
    def cpus(self) -> int:
        """The engine's CPUs (asked once)."""
        return engine_cpus(self.client)

    def status(self) -> list[NodeState]:
        """Each node as the engine sees it now (empty when the lab is not up)."""
        return lab_status(self.client, self.name)

    def running(self) -> list[NodeState]:
        """The nodes, all running; a StateError when the lab is not up or a node is down."""
        return require_running(self.client, self.name)

    def node_names(self) -> list[str]:
        return [n.name for n in self.running()]

    def require_node(self, node: str, names: list[str] | None = None) -> str:
        names = names if names is not None else self.node_names()
        if node not in names:
            raise LabError(f"no node {node!r} in lab {self.name}", hint=f"nodes: {', '.join(names)}")
        return node

    def existing(self, node: str | None = None) -> list[NodeState]:
        """The lab's nodes as the engine has them, running or not (`node`'s alone when given): a
        StateError when the lab is not up, a LabError listing the nodes when it has no `node`."""
        nodes = self.status()
        if not nodes:
            raise StateError(f"lab '{self.name}' is not up", hint=f"`labctl up --lab {self.name}` brings it up; "
                                                                 "`labctl ls` lists the labs on this engine")
        found = [n for n in nodes if n.name == node] if node is not None else nodes
        if not found:
            raise LabError(f"no node {node!r} in lab {self.name}", hint=f"nodes: {', '.join(n.name for n in nodes)}")
        return found

    def exec_argv(self, node: str, argv: list[str], tty: bool = False) -> list[str]:
        """The `docker exec` command line that runs argv in `node`'s container (as its user, in the
        workspace, with its env file's environment), once the node is known to be running: the CLI
        execs it; from Python, `subprocess.run(lab.exec_argv(...))`. `tty`: give it a terminal."""
        argv = list(argv[1:] if argv[:1] == ["--"] else argv)
        if not argv:
            raise LabError(f"no command given to run on {node}", hint=f"labctl exec {node} -- hostname")
        state = self.existing(node)[0]
        if state.state != "running":
            raise StateError(f"{node} of lab {self.name} is not running ({state.state})",
                             hint=f"`labctl fault unpause {node} --lab {self.name}` resumes it" if state.state == "paused"
                             else f"`labctl up --lab {self.name}` restores the nodes")
        if shutil.which("docker") is None:
            raise StateError("no docker CLI on PATH (`labctl exec` runs `docker exec`)",
                             hint="install the Docker CLI (`make engine` does, as root on Debian)")
        return docker_exec_argv(container_name(self.name, node), argv, tty, exec_user(self.client, self.name))

    def subnet(self) -> str | None:
        subnets = [s for net in lab_networks(self.client, self.name) for s in network_subnets(net)]
        return subnets[0] if subnets else None

    def nodes(self) -> DockerNodes:
        """The nodes as a run reaches them (`docker exec`)."""
        return DockerNodes(self.client, self.name)

    def node_env(self, names: list[str] | None = None, ifname: str | None = None) -> dict[str, dict[str, str]]:
        """Each node's env file (what `labctl up` wrote), in node-rank order, for a job whose sockets
        use `ifname`: on a lab with an overlay its tunnel unless the bridge's is named (`run --ifname
        eth0`), the rendezvous then on node0's overlay address (labctl.net.overlay.envs_on)."""
        envs = read_node_envs(self.directory, names if names is not None else self.node_names())
        return envs_on(envs, self.overlay_spec(), self.config.iface, ifname)

    def overlay_spec(self) -> Overlay | None:
        """The lab's overlay (`up --overlay`) as its helpers make it; None without one."""
        subnets = [s for net in lab_networks(self.client, self.name) for s in network_subnets(net)]
        return running_overlay(self.client, self.name, subnets[0] if subnets else None)

    # ---------------------------------------------------------------------------------- logs

    def logs(self, node: str | None = None, run_id: str | None = None,
             tail: int | None = None) -> list[tuple[str, str]]:
        """(node, saved output) of a run (default: the latest), for every node or `node`; with
        `tail`, each node's last `tail` lines. Reads files only: no engine needed."""
        return run_logs(self.directory, run_id, node, tail)

    def follow_logs(self, node: str | None = None, run_id: str | None = None,
                    tail: int | None = None) -> Iterator[tuple[str, str]]:
        """(node, new lines) of a run as it writes them, until it has ended (`labctl logs -f`)."""
        return follow_run_logs(self.directory, run_id, node, tail)

    def container_logs(self, node: str | None = None, tail: int | None = None) -> list[tuple[str, str]]:
        """(node, the container's own log, or its last `tail` lines) for every node or `node`."""
        check_tail(tail)
        return [(n.name, container_log(self.client, self.name, n.name, tail)) for n in self.existing(node)]

    def follow_container_logs(self, node: str | None = None, tail: int | None = None) -> Iterator[tuple[str, str]]:
        """(node, new lines) of the containers' own logs as they come, until every one has stopped."""
        check_tail(tail)
        return follow_container_logs(self.client, self.name, [n.name for n in self.existing(node)], tail)

    # ---------------------------------------------------------------------------------- runs

    def plan_run(self, *argv: str, options: RunOptions = RunOptions(),
                 node_env: dict[str, dict[str, str]] | None = None, share_cpus: bool = True) -> RunPlan:
        """The plan of a run of `SCRIPT [ARGS]` or `-m MODULE [ARGS]` on the lab's nodes (or the nodes
        of `node_env`, a subset), as data: nothing starts. Started as `options` say (`options.env` is
        added to every process's environment, as `labctl run -e`). With `share_cpus`, every process
        gets OMP_NUM_THREADS from the engine's CPUs."""
        options = options.checked()  # bad input first, then whether the lab is up
        script_args = job_args(argv, self.workspace, options.cwd)
        if node_env is None:
            node_env = self.node_env(ifname=options.ifname)
        plan = build_run_plan(node_env, script_args, self.directory, options.launch(len(node_env)),
                              cpus=self.cpus if share_cpus else None)
        return replace(plan, packages=describe_lock_file(self.directory / LOCK_FILE))

    def execute(self, plan: RunPlan, *, echo: bool | str = True, check: bool = True) -> RunResult:
        """Run a plan on the lab's nodes (see labctl.run.executor.execute)."""
        return execute(self.nodes(), plan, echo=echo, check=check)
