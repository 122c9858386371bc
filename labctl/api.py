"""labctl from Python: the lab and real hosts as objects, for test suites, notebooks and benchmark
scripts, and for the CLI itself (every `labctl` command is a thin layer over these).

    from labctl.api import Lab

    with Lab("demo", nodes=3, bw="100mbit") as lab:        # up on enter, down on exit
        result = lab.run("-m", "trainer", "--epochs", "1")  # raises RunFailed if a node fails
        assert result.summary["replicas_consistent"]

Settings resolve as for the CLI: defaults, then the workspace's `.env`, then DDPLAB_* in the
environment, then the arguments given here. Errors are the project's own (labctl.errors): a
LabError (bad input) or StateError (no engine, lab not up) carrying the message and a hint, and
RunFailed, with the RunResult attached, when a run fails.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Mapping, Sequence

from labctl.config import check_nproc, check_timeout, load_config
from labctl.errors import LabError
from labctl.hosts.api import Hosts, SyncResult
from labctl.lab.session import LabSession

if TYPE_CHECKING:  # imported where used: `labctl up` starts Compose sooner without them
    from labctl.diagnose.doctor import Diagnosis
    from labctl.lab.lifecycle import NodeState
    from labctl.lab.up import UpPlan
    from labctl.net.tc import LinkState, Shape
    from labctl.run.plan import Launcher, RunPlan
    from labctl.run.result import RunResult

Fault = Literal["kill", "crash", "pause", "unpause", "partition", "heal"]
Report = Callable[[str], None]

__all__ = ["Lab", "Hosts", "SyncResult", "RunResult", "RunPlan", "Diagnosis", "UpResult", "Fault", "gc"]
_LAZY = {"RunResult": "labctl.run.result", "RunPlan": "labctl.run.plan", "Diagnosis": "labctl.diagnose.doctor"}


def __getattr__(name: str):
    """`from labctl.api import RunResult` (and RunPlan, Diagnosis) without importing them at startup."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _quiet(_message: str) -> None:
    pass


def gc(*, everything: bool = False, dry_run: bool = False, client=None) -> list[str]:
    """Remove the labs whose owner process is gone (all labs with `everything`), as `labctl gc`
    does; the names of the labs removed (or, with `dry_run`, that would be)."""
    from labctl.lab.docker import docker_client
    from labctl.lab.gc import collect_garbage

    verdicts = collect_garbage(client or docker_client(), everything=everything, dry_run=dry_run)
    return [v.lab for v in verdicts if v.remove]


@dataclass(frozen=True)
class UpResult:
    """A lab as `up` left it."""

    nodes: list[NodeState]
    subnet: str
    links: dict[str, LinkState] | None  # read back from the kernel when the lab was shaped at bring-up
    inventory: Path | None  # .lab/<lab>/hosts.toml when every node is an SSH host
    seconds: float


class Lab(LabSession):
    """A lab of N nodes: `up()`, `run(...)`, `shape(...)`, `fault(...)`, `doctor()`, `down()`.

    As a context manager it is brought up on enter and removed on exit (volumes included), also
    when `up` fails half-way or the body raises. Outside one, `Lab(name)` attaches to a lab that
    is already up (as `labctl --lab NAME ...` does).
    """

    def __init__(self, name: str | None = None, *, nodes: int | None = None, nproc_per_node: int | None = None,
                 cpus: float | None = None, memory: str | None = None, subnet: str | None = None,
                 master_port: int | None = None, image: str | None = None, bw: str | Shape | None = None,
                 node_cpus: str | Mapping[str, float] | None = None, ssh: bool | None = None,
                 gpus: str | int | Sequence[int] | None = None, gpus_per_node: int | None = None,
                 cuda: str | int | Sequence[str] | None = None, nccl_transport: str | None = None,
                 tcp_cc: str | None = None, scheduler: str | None = None, workspace: str | Path | None = None, client=None, connect: Callable | None = None,
                 report: Report | None = None, build_progress=None, environ: Mapping[str, str] | None = None):
        """`gpus`: 'all', a count, or the machine's GPU indices (a list); `gpus_per_node` each, in order.
        `cuda`: the nodes on the CUDA image ('all', a count, or node names; default the GPU nodes).
        `nccl_transport`: 'socket' (default: NCCL over the lab's shaped network) or 'auto'.
        `tcp_cc`: the nodes' TCP congestion control ('cubic' by default, 'host' for the host's).
        `scheduler`: 'slurm' makes the nodes a Slurm cluster (see `Lab.slurm`)."""
        from labctl.lab.gpus import as_setting

        workspace = Path(workspace or Path.cwd()).resolve()
        given = dict(lab=name, nodes=nodes, nproc_per_node=nproc_per_node, cpus=cpus, memory=memory, subnet=subnet,
                     master_port=master_port, image=image, gpus=as_setting(gpus), gpus_per_node=gpus_per_node,
                     cuda=as_setting(cuda), nccl_transport=nccl_transport, tcp_cc=tcp_cc, scheduler=scheduler)
        flags = {key: str(value) for key, value in given.items() if value is not None}
        config = load_config(workspace, os.environ if environ is None else environ, flags)
        super().__init__(config, workspace, client, **({"connect": connect} if connect else {}))
        self.report = report or _quiet
        self.build_progress = build_progress  # a factory of progress bars for an image build, or None
        self._shape = bw
        self._node_cpus = dict(node_cpus) if isinstance(node_cpus, Mapping) else node_cpus
        self._ssh = ssh
        self._environ = os.environ if environ is None else environ
        self._owner_pid: int | None = None  # set by `with`: the lab lives and dies with this process
        self.owner_session = "api"  # `labctl up` says "cli"

    @property
    def slurm(self):
        """The lab's Slurm cluster (`scheduler='slurm'`): run, submit, status, cancel, export (labctl.slurm.jobs)."""
        from labctl.slurm.jobs import Slurm

        return Slurm(self)

    # ------------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Lab:
        self._owner_pid = os.getpid()  # a crash inside `with` leaves a lab `labctl gc` can tell is dead
        try:
            self.up()
        except BaseException:
            try:
                self.down(volumes=True)
            except LabError:  # no engine to remove anything from: nothing was made either
                pass
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down(volumes=True)

    def plan_up(self, *, dry_run: bool = False) -> UpPlan:
        """What `up` would create (the Compose document, env files, subnet); changes nothing."""
        from labctl.lab.up import build_up_plan

        self._wanted_shape()  # a bad --bw is refused before anything is asked of the engine
        from labctl.lab.owner import owner_of

        return build_up_plan(self.client, self.config, self.workspace, node_cpus=self._node_cpus, ssh=self._ssh,
                             dry_run=dry_run, owner=owner_of(self._environ, self.owner_session, self._owner_pid))

    def up(self) -> UpResult:
        """Start (or reconcile) the lab, building the node images it runs first if missing; shape every
        link when `bw` was given; with `ssh`, write the SSH inventory of the nodes."""
        from labctl.lab import engine as engine_mod
        from labctl.lab import image as image_mod
        from labctl.lab.up import apply_up_plan

        wanted = self._wanted_shape()
        plan = self.plan_up()
        self.config = plan.config
        started = time.monotonic()
        image_mod.build_missing(self.client, self.config, {n.image for n in plan.gpus.nodes}, self.report,
                                self.build_progress)
        for warning in (engine_mod.limits_warning(plan.engine, self.config.memory, self.config.pids_limit),
                        plan.tcp_note):
            if warning:
                self.report(warning)
        plan, nodes = apply_up_plan(self.client, plan, self.workspace, self.report)
        names = [n.name for n in nodes]
        links = None
        if wanted:
            links = self._apply_shape(names, wanted)
        inventory = self._write_inventory(nodes, plan.ssh)
        return UpResult(nodes, plan.subnet, links, inventory, time.monotonic() - started)

    def _wanted_shape(self) -> Shape | None:
        if not isinstance(self._shape, str):
            return self._shape
        from labctl.net.tc import parse_shape

        return parse_shape(self._shape)

    def _write_inventory(self, nodes: list[NodeState], ssh: bool) -> Path | None:
        from labctl.hosts import labnodes

        inventory = self.directory / labnodes.INVENTORY_FILE
        if ssh:
            inventory = labnodes.write_ssh_files(self.client, self.config, self.directory, nodes, self.cpus)
            self.report(f"every node is an SSH host; {inventory} describes them: "
                        f"`labctl hosts check --lab {self.name}`")
            return inventory
        if inventory.is_file():  # the nodes no longer run sshd: an inventory of them would mislead
            inventory.unlink()
        return None

    def down(self, volumes: bool = False) -> dict[str, int]:
        """Remove every container and network of the lab (and its volume with `volumes`): counts removed."""
        from labctl.lab.lifecycle import apply_down

        return apply_down(self.client, self.name, volumes=volumes)

    def resources(self, volumes: bool = False) -> dict[str, list[str]]:
        """What `down` would remove, by kind."""
        from labctl.lab.lifecycle import lab_resources

        return lab_resources(self.client, self.name, volumes)

    # ------------------------------------------------------------------------------------ runs

    def run_plan(self, *argv: str, launcher: Launcher = "torchrun", nproc_per_node: int | None = None,
                 max_restarts: int = 0, nnodes: str | None = None, pg_timeout_s: float | None = 30.0,
                 env: Mapping[str, str] | None = None, cwd: str | Path | None = None) -> RunPlan:
        """The plan of `run(*argv)`, as data: nothing starts."""
        from labctl.run.launch import Elastic, job_args, parse_nnodes

        nproc = check_nproc(nproc_per_node)
        script_args = job_args(argv, self.workspace, cwd)
        node_env = self.node_env()
        low, high = parse_nnodes(nnodes, len(node_env)) if nnodes else (None, None)
        return self.plan_run(script_args, node_env=node_env, launcher=launcher, nproc_per_node=nproc,
                             elastic=Elastic(max_restarts, low, high), pg_timeout_s=pg_timeout_s, env=env)

    def run(self, *argv: str, timeout_s: float | None = None, launcher: Launcher = "torchrun",
            nproc_per_node: int | None = None, max_restarts: int = 0, nnodes: str | None = None,
            pg_timeout_s: float | None = 30.0, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
            preflight: bool = True, echo: bool = True, check: bool = True) -> RunResult:
        """Run `SCRIPT [ARGS]` or `-m MODULE [ARGS]` on every node at once, as `labctl run` does.

        `env` is added to every process's environment (as `-e`); a relative SCRIPT is taken from
        `cwd` (default: the workspace, the nodes' working directory). `check` (the default) raises
        RunFailed, naming the node and its error line, with the RunResult attached; `check=False`
        returns the result whatever happened. `preflight` runs doctor's cheap checks first and
        raises PreflightFailed on a problem.
        """
        check_timeout(timeout_s)
        plan = self.run_plan(*argv, launcher=launcher, nproc_per_node=nproc_per_node, max_restarts=max_restarts,
                             nnodes=nnodes, pg_timeout_s=pg_timeout_s, env=env, cwd=cwd)
        if preflight:
            self.preflight(nproc_per_node, env).raise_for_problems(f"labctl doctor --lab {self.name}")
        return self.execute(plan, timeout_s=timeout_s, echo=echo, check=check)

    # --------------------------------------------------------------------------------- doctor

    def doctor(self, *, cheap: bool = False) -> Diagnosis:
        """doctor's checks on the running lab (`cheap`: without the reachability probes)."""
        from labctl.diagnose.doctor import diagnose

        return diagnose(self.client, self.name, self.running(), self.subnet(), cheap=cheap)

    def preflight(self, nproc_per_node: int | None = None, env: Mapping[str, str] | None = None) -> Diagnosis:
        """doctor's cheap checks, for a run with `nproc_per_node` processes per node (default the lab's)
        and `env` added to every process's (a -e DDPLAB_BACKEND=gloo counts)."""
        from labctl.diagnose.doctor import diagnose

        overrides = {n: dict(env) for n in self.node_names()} if env else None
        return diagnose(self.client, self.name, self.running(), self.subnet(), cheap=True, env_overrides=overrides,
                        nproc_per_node=nproc_per_node)

    # ----------------------------------------------------------------------- network, faults

    def targets(self, nodes: list[str] | tuple[str, ...] | None = None) -> list[str]:
        """The running nodes asked for (every one by default); an error naming any that is not."""
        running = self.node_names()
        unknown = [n for n in nodes or () if n not in running]
        if unknown:
            raise LabError(f"no node {', '.join(unknown)} in lab {self.name}", hint=f"nodes: {', '.join(running)}")
        return list(dict.fromkeys(nodes or ())) or running

    def shape(self, bw: str | Shape | None = None, delay: str | None = None, jitter: str | None = None,
              loss: str | None = None, ingress: bool = False, nodes: list[str] | None = None, *,
              duration: str | int | None = None) -> dict[str, LinkState]:
        """Shape the links of `nodes` (default all): any of rate, delay, jitter, loss; the links read
        back. `duration` ('30s', '2m', seconds): undone then (a later shape or clear cancels that)."""
        from labctl.net.tc import Shape, parse_shape
        from labctl.units import parse_duration_s

        wanted = bw.validate() if isinstance(bw, Shape) else parse_shape(bw, delay, jitter, loss, ingress)
        duration_s = parse_duration_s(duration) if duration is not None else None
        return self._apply_shape(self.targets(nodes), wanted, duration_s)

    def shape_plan(self, wanted: Shape | None, duration: str | int | None = None):
        """The tc commands `shape` (or, for None, `clear_shape`) runs in each node's namespace, and with
        `duration` the undo run then: a tc.ShapePlan."""
        from labctl.net.tc import build_plan
        from labctl.units import parse_duration_s

        return build_plan(wanted, self.config.iface, None if duration is None else parse_duration_s(duration))

    def _apply_shape(self, names: list[str], wanted: Shape, duration_s: int | None = None) -> dict[str, LinkState]:
        from labctl.net.apply import apply_shape

        apply_shape(self.client, self.name, names, wanted, self.config.iface, duration_s)
        return self.links(names)

    def clear_shape(self, nodes: list[str] | None = None) -> dict[str, LinkState]:
        from labctl.net.apply import clear_shape

        names = self.targets(nodes)
        clear_shape(self.client, self.name, names, self.config.iface)
        return self.links(names)

    def links(self, nodes: list[str] | None = None) -> dict[str, LinkState]:
        """Each node's link as the kernel reports it now (tc, read back; not a cache)."""
        from labctl.net.apply import read_links

        names = list(nodes) if nodes is not None else self.node_names()
        return read_links(self.client, self.name, names, self.config.iface) if names else {}

    def fault(self, kind: Fault, node: str) -> str:
        """Inject a fault into a node; a sentence saying what happened."""
        from labctl.net.faults import inject

        return inject(self.client, self.name, node, kind, self.config.iface)

    def slow(self, node: str, cpus: float | None) -> float | None:
        """Change a running node's CPU limit in place (None lifts it); the limit read back."""
        from labctl.lab.docker import apply_node_cpus, check_cpus

        self.require_node(node)
        if cpus is not None:
            check_cpus(self.client, {"--cpus": cpus})
        return apply_node_cpus(self.client, self.name, node, cpus)
