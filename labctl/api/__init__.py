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

import functools
import os
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from labctl.api.bringup import UpResult, bring_up, plan_up
from labctl.core.ui import Report
from labctl.diagnose.doctor import diagnose
from labctl.diagnose.findings import Diagnosis
from labctl.diagnose.ops import OpsReport, probe_ops
from labctl.engine.docker import apply_node_cpus, check_cpu_limits, clear_compile_caches, docker_client
from labctl.errors import LabError, StateError
from labctl.hosts.inventory import load_inventory
from labctl.hosts.labnodes import INVENTORY_FILE
from labctl.hosts.machines import Hosts, SyncResult
from labctl.image.lockfile import Lock, read_lab_lock
from labctl.image.packages import LOCK_FILE
from labctl.k8s.jobs import Kubernetes
from labctl.lab.envfiles import render_env, write_env_files
from labctl.lab.garbage import ImageVerdict, LabVerdict, collect_garbage, collect_package_images
from labctl.lab.lifecycle import apply_down, forget_secrets, lab_dir, lab_resources
from labctl.lab.listing import LabListing, list_labs
from labctl.lab.owner import owner_of
from labctl.lab.up import UpPlan
from labctl.net.apply import apply_routes, apply_shape, clear_shape, link_text, node_addresses, plan_routes, read_links
from labctl.net.faults import inject
from labctl.net.overlay_apply import OverlayState, read_overlay
from labctl.net.routes import build_node, routes_of
from labctl.net.tc import LinkState, Shape, ShapePlan, build_plan, check_to, parse_shape
from labctl.run.plan import RunOptions, RunPlan
from labctl.run.result import RunResult
from labctl.session import LabSession
from labctl.slurm.jobs import Slurm
from labctl.spec.labspec import LabSpec, given_settings, load_config
from labctl.spec.units import parse_duration_s
from labctl.trace import TraceReport, find_run, write_trace
from labctl.trace.breakdown import parse_steps

Fault = Literal["kill", "crash", "pause", "unpause", "partition", "heal"]

__all__ = ["Lab", "LabSpec", "lab_spec", "Workspace", "Hosts", "SyncResult", "RunResult", "RunPlan", "RunOptions", "Diagnosis",
           "UpResult", "Fault", "gc_labs", "gc_images", "labs", "inventory_hosts", "docker_client"]


def _quiet(_message: str) -> None:
    pass


def gc_labs(*, everything: bool = False, dry_run: bool = False, client=None) -> list[LabVerdict]:
    """Remove the labs whose owner process is gone (all labs with `everything`), as `labctl gc`
    does: a verdict for every lab on the engine (`remove`: removed, or with `dry_run` would be; `why`).
    `gc_images` then removes the package images no lab runs any more."""
    return collect_garbage(client or docker_client(), everything=everything, dry_run=dry_run)


def gc_images(*, dry_run: bool = False, going: list[str] | tuple[str, ...] = (), client=None) -> list[ImageVerdict]:
    """Remove the package images (a lab's packages on a node image, one per lock) that no container
    runs, as `labctl gc` does after the labs: a verdict for each (`remove`, `why`). With `dry_run`,
    the containers of the labs in `going` count as gone."""
    return collect_package_images(client or docker_client(), dry_run=dry_run, going=going)


def inventory_hosts(workspace: str | Path, config: LabSpec, *, accept_new: bool = False,
                    report: Report = _quiet) -> Hosts:
    """The Hosts of `config.inventory` (a hosts.toml), else of the one `labctl up --ssh` wrote for
    `config.lab` (`.lab/<lab>/hosts.toml`), as `labctl hosts` finds them."""
    workspace = Path(workspace)
    path = Path(config.inventory) if config.inventory else lab_dir(workspace, config.lab) / INVENTORY_FILE
    return Hosts(load_inventory(path, given=bool(config.inventory)), accept_new=accept_new, workspace=workspace,
                 report=report, cache_dir=config.cache_dir)


def labs(client=None) -> list[LabListing]:
    """Every lab on the engine, whoever brought it up, with its running nodes' links read back (`labctl ls`)."""
    client = client or docker_client()
    return list_labs(client, functools.partial(link_text, client))


def lab_spec(name: str | None = None, *, workspace: str | Path | None = None,
             environ: Mapping[str, str] | None = None, **settings: Any) -> LabSpec:
    """The lab spec `Lab(name, **settings)` and `labctl up` work from: defaults, then the workspace's
    `.env`, then DDPLAB_* in `environ` (default: this process's environment), then `settings`, any
    of LabSpec's fields given as `labctl up` takes them (nodes=3, bw='1gbit', node_cpus={'node2':
    0.25}, gpus=[0, 2], ssh=True, ...; None: not given)."""
    workspace = Path(workspace or Path.cwd()).resolve()
    return load_config(workspace, os.environ if environ is None else environ, given_settings(name, settings))


class Lab(LabSession):
    """A lab of N nodes: `up()`, `run(...)`, `shape(...)`, `fault(...)`, `doctor()`, `down()`.

    As a context manager it is brought up on enter and removed on exit (volumes included), also
    when `up` fails half-way or the body raises. Outside one, `Lab(name)` attaches to a lab that
    is already up (as `labctl --lab NAME ...` does).
    """

    def __init__(self, name: str | None = None, *, spec: LabSpec | None = None, workspace: str | Path | None = None,
                 environ: Mapping[str, str] | None = None, client=None, connect: Callable | None = None,
                 report: Report | None = None, build_progress=None, **settings: Any):
        """`settings`: the lab as `labctl up`'s options say it, resolved by `lab_spec` (nodes=3,
        bw='1gbit', gpus='all', scheduler='slurm', requirements='requirements.txt' (relative to the
        workspace), with_packages=['tqdm'], preload=['lightning'], ...); or `spec`, a LabSpec already resolved
        (`labctl.api.lab_spec`, or the pytest plugin's). `report` receives progress lines and
        `build_progress` makes progress bars for an image build; `client` is a docker.DockerClient
        to use, else `connect` makes one on first need."""
        workspace = Path(workspace or Path.cwd()).resolve()
        if spec is None:
            spec = lab_spec(name, workspace=workspace, environ=environ, **settings)
        elif settings or name:
            raise LabError("give Lab() either a spec or settings, not both",
                           hint="Lab(spec=labctl.api.lab_spec('demo', nodes=3)) or Lab('demo', nodes=3)")
        super().__init__(spec, workspace, client, **({"connect": connect} if connect else {}))
        self.report = report or _quiet
        self.build_progress = build_progress  # a factory of progress bars for an image build, or None
        self._environ = os.environ if environ is None else environ
        self._owner_pid: int | None = None  # set by `with`: the lab lives and dies with this process
        self.owner_session = "api"  # `labctl up` says "cli"

    @property
    def slurm(self) -> Slurm:
        """The lab's Slurm cluster (`scheduler='slurm'`): run, submit, status, cancel, export (labctl.slurm.jobs)."""
        return Slurm(self)

    @property
    def k8s(self) -> Kubernetes:
        """The lab and Kubernetes: export its job as a TrainJob or JobSet, run such a manifest (labctl.k8s.jobs)."""
        return Kubernetes(self)

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
        return plan_up(self.client, self.config, self.workspace, dry_run=dry_run,
                       owner=owner_of(self._environ, self.owner_session, self._owner_pid))

    def up(self) -> UpResult:
        """Start (or reconcile) the lab, building the node images it runs first if missing; shape every
        link when `bw` was given; with `ssh`, write the SSH inventory of the nodes."""
        plan = self.plan_up()
        self.config = plan.config  # settled: a running lab's own count, GPUs, scheduler
        return bring_up(self, plan, self.report, self.build_progress)

    def down(self, volumes: bool = False) -> dict[str, int]:
        """Remove every container and network of the lab (and its volume with `volumes`), and its overlay's
        keys: counts removed."""
        removed = apply_down(self.client, self.name, volumes=volumes)
        forget_secrets(self.directory)
        return removed

    def resources(self, volumes: bool = False) -> dict[str, list[str]]:
        """What `down` would remove, by kind."""
        return lab_resources(self.client, self.name, volumes)

    # ------------------------------------------------------------------------------------ runs

    def plan_run(self, *argv: str, options: RunOptions | None = None, node_env: dict[str, dict[str, str]] | None = None,
                 share_cpus: bool = True, **settings: Any) -> RunPlan:
        """The plan of `run(*argv, ...)`, as data (what `labctl run --dry-run` prints): nothing starts.
        `node_env` and `share_cpus` as for LabSession.plan_run (the benches run on a subset)."""
        options = RunOptions.given(options, settings, "Lab.plan_run", "lab")
        return super().plan_run(*argv, options=options, node_env=node_env, share_cpus=share_cpus)

    def run_plan(self, *argv: str, **settings: Any) -> RunPlan:
        """Deprecated: `plan_run`, its one name now; this one warns and goes in the next release."""
        warnings.warn("Lab.run_plan is now Lab.plan_run", DeprecationWarning, stacklevel=2)
        return self.plan_run(*argv, **settings)

    def run(self, *argv: str, options: RunOptions | None = None, **settings: Any) -> RunResult:
        """Run `SCRIPT [ARGS]` or `-m MODULE [ARGS]` on every node at once, as `labctl run` does.

        `options`: a RunOptions; or its fields as keywords (`timeout_s=60, env={...}, check=False`),
        over `options` where both are given. `check` (the default) raises RunFailed, naming the node
        and its error line, with the RunResult attached; `check=False` returns the result whatever
        happened. `preflight` runs doctor's cheap checks first and raises PreflightFailed on a
        problem. `ifname`: the interface the ranks' sockets use; None: the lab's, its overlay's
        tunnel where it has one (`up --overlay`), else the bridge's.
        """
        options = RunOptions.given(options, settings, "Lab.run", "lab")
        plan = self.plan_run(*argv, options=options)
        if options.preflight:
            self.preflight(options.nproc_per_node, options.env).raise_for_problems(f"labctl doctor --lab {self.name}")
        return self.execute(plan, echo=options.echo, check=options.check)

    def clear_compile_cache(self) -> dict[str, str]:
        """Empty torch.compile's cache on every running node without taking the lab down (`labctl run
        --fresh-compile-cache`): the next run compiles from nothing and fills it again. node -> the
        folder emptied on the shared volume (nodes of one image share it). The image's precompiled
        C++ header, which every node links, stays."""
        return clear_compile_caches(self.client, self.name, self.node_names())

    def trace(self, run: str | Path | RunResult | None = None, *,
              steps: str | tuple[int | None, int | None] | None = None, base: str | Path | None = None) -> TraceReport:
        """`labctl trace`: every rank of a run on one aligned time axis. Writes timeline.png (with the
        `plot` extra), trace-merged.json and breakdown.json into the run folder and returns the table
        per rank. `run`: a RunResult, a run id under the lab's runs/, or a run folder's path relative
        to `base` (default: the workspace); None: the lab's latest run. `steps`: "A:B". LabError: bad
        steps (before anything is read) or no such run; StateError: nothing to draw from."""
        bounds = parse_steps(steps) if isinstance(steps, str) else steps
        if isinstance(run, RunResult):
            return write_trace(run.run_dir, steps=bounds)
        found = find_run(self.directory, None if run is None else str(run), Path(base or self.workspace))
        return write_trace(found, steps=bounds)

    # --------------------------------------------------------------------------------- doctor

    def doctor(self, *, cheap: bool = False) -> Diagnosis:
        """doctor's checks on the running lab (`cheap`: without the reachability probes)."""
        return diagnose(self.client, self.name, self.running(), self.subnet(), cheap=cheap, lock=self.lock())

    def doctor_ops(self) -> OpsReport:
        """What the lab's backend can do, tried on its nodes (`labctl doctor --ops`, labctl.diagnose.ops)."""
        return probe_ops(self)

    def lock(self) -> tuple[str, Lock] | None:
        """(its path, the Lock) of the packages the lab's nodes run (`.lab/<lab>/pylock.toml`), or None."""
        path = self.directory / LOCK_FILE
        lock = read_lab_lock(path)
        return (str(path), lock) if lock is not None else None

    def preflight(self, nproc_per_node: int | None = None, env: Mapping[str, str] | None = None) -> Diagnosis:
        """doctor's cheap checks, for a run with `nproc_per_node` processes per node (default the lab's)
        and `env` added to every process's (a -e DDPLAB_BACKEND=gloo counts)."""
        overrides = {n: dict(env) for n in self.node_names()} if env else None
        return diagnose(self.client, self.name, self.running(), self.subnet(), cheap=True, env_overrides=overrides,
                        nproc_per_node=nproc_per_node, lock=self.lock())

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
              duration: str | int | None = None, to: list[str] | None = None) -> dict[str, LinkState]:
        """Shape the links of `nodes` (default all): any of rate, delay, jitter, loss; the links read
        back. `duration` ('30s', '2m', seconds): undone then (a later shape or clear cancels that).
        `to` (node names): only what `nodes` (default every other node) send to those, as racks
        joined by a slower spine; the rest of each link stays as it was."""
        wanted = bw.validate() if isinstance(bw, Shape) else parse_shape(bw, delay, jitter, loss, ingress)
        if to:
            check_to(False, wanted.ingress, None if duration is None else str(duration))
            sources, dsts = self.groups(nodes, to)
            apply_routes(self.client, self.name, sources, dsts, wanted, self.config.iface)
            return self.links(sources)
        duration_s = parse_duration_s(duration) if duration is not None else None
        return self._apply_shape(self.targets(nodes), wanted, duration_s)

    def groups(self, nodes: list[str] | tuple[str, ...] | None, to: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
        """(senders, receivers) of links between groups: `nodes` (default every node not in `to`) and `to`,
        running nodes that are not in both."""
        dsts = self.targets(to)
        sources = self.targets(nodes) if nodes else [n for n in self.node_names() if n not in dsts]
        both = [n for n in sources if n in dsts]
        if both or not sources:
            raise LabError(f"--node and --to must be two groups of nodes: {', '.join(both) or 'no node'} "
                           f"{'is in both' if both else 'is left to send'}",
                           hint="labctl shape --node node0,node1 --to node2,node3 --bw 100mbit")
        return sources, dsts

    def shape_plan(self, wanted: Shape | None, duration: str | int | None = None):
        """The tc commands `shape` (or, for None, `clear_shape`) runs in each node's namespace, and with
        `duration` the undo run then: a tc.ShapePlan, for nodes without links to groups of nodes."""
        return build_plan(wanted, self.config.iface, None if duration is None else parse_duration_s(duration))

    def shape_plans(self, wanted: Shape | None, duration: str | int | None = None, nodes: list[str] | None = None,
                    to: list[str] | None = None) -> dict[str, ShapePlan]:
        """`shape --dry-run`: each node's tc.ShapePlan, made from its link as the kernel reports it now
        (its links to groups of nodes are kept, or with `to` changed)."""
        if to:
            sources, dsts = self.groups(nodes, to)
            links = self.links(sources)
            plans = plan_routes(links, node_addresses(self.client, self.name), dsts, wanted, self.config.iface)
            return {node: ShapePlan(commands) for node, commands in plans.items()}
        names = self.targets(nodes)
        plan = self.shape_plan(wanted, duration)
        if wanted is None:
            return {node: plan for node in names}
        kept = {node: routes_of(state) for node, state in self.links(names).items()}
        return {node: replace(plan, commands=build_node(wanted, kept[node], self.config.iface)) for node in names}

    def _apply_shape(self, names: list[str], wanted: Shape, duration_s: int | None = None) -> dict[str, LinkState]:
        apply_shape(self.client, self.name, names, wanted, self.config.iface, duration_s)
        return self.links(names)

    def clear_shape(self, nodes: list[str] | None = None, to: list[str] | None = None) -> dict[str, LinkState]:
        """Unshape `nodes` (default all) entirely; with `to`, only their links to those nodes."""
        if to:
            sources, dsts = self.groups(nodes, to)
            apply_routes(self.client, self.name, sources, dsts, None, self.config.iface)
            return self.links(sources)
        names = self.targets(nodes)
        clear_shape(self.client, self.name, names, self.config.iface)
        return self.links(names)

    def links(self, nodes: list[str] | None = None) -> dict[str, LinkState]:
        """Each node's link as the kernel reports it now (tc, read back; not a cache)."""
        names = list(nodes) if nodes is not None else self.node_names()
        return read_links(self.client, self.name, names, self.config.iface) if names else {}

    def addresses(self) -> dict[str, str]:
        """Node name -> its address on the lab's network (links to groups name their nodes by it)."""
        return node_addresses(self.client, self.name)

    def overlay(self) -> OverlayState | None:
        """The lab's mesh VPN as its nodes have it now (each node's address read from its tunnel), None
        where it has none (`up --overlay`)."""
        return read_overlay(self.client, self.name, [n.name for n in self.status() if n.state == "running"])

    def write_overlay_env(self, out_dir: str | Path) -> list[Path]:
        """`labctl env --overlay`: each node's env file with the job on the lab's overlay (MASTER_ADDR
        node0's overlay address, the sockets on the tunnel), written to `out_dir` for a run by hand.
        StateError (exit 1) where the lab has no overlay."""
        mesh = self.overlay_spec()
        if mesh is None:
            raise StateError(f"lab {self.name} has no overlay, so there are no env files to write for one",
                             hint=f"`labctl up --lab {self.name} --overlay tailscale` gives its nodes a tunnel")
        envs = self.node_env(ifname=mesh.iface)
        comment = (f"ddplab: {{node}}'s identity on lab {self.name}'s {mesh.kind} overlay ({mesh.iface}), made by "
                   "`labctl env --overlay`.\nLoad it in the node and run a bare `torchrun script.py`: "
                   "set -a; . ./THIS_FILE; set +a")
        files = {f"{node}.env": render_env(env, comment.format(node=node)) for node, env in envs.items()}
        return write_env_files(Path(out_dir), files)

    def fault(self, kind: Fault, node: str) -> str:
        """Inject a fault into a node; a sentence saying what happened."""
        return inject(self.client, self.name, node, kind, self.config.iface)

    def slow(self, node: str, cpus: float | None) -> float | None:
        """Change a running node's CPU limit in place (None lifts it); the limit read back."""
        self.require_node(node)
        if cpus is not None:
            check_cpu_limits(self.client, {"--cpus": cpus})
        return apply_node_cpus(self.client, self.name, node, cpus)


_RENAMED = {"gc": ("gc_labs", gc_labs), "LabConfig": ("LabSpec", LabSpec)}


def __getattr__(name: str):
    """`Workspace`, imported at its first use: it brings the benches and the scenarios, which a command
    on a lab (every `labctl run`) has no use for. And the old names, `gc` (now `gc_labs`: `gc` is also
    the standard module) and `LabConfig` (now `LabSpec`): kept for one release, with a DeprecationWarning."""
    if name == "Workspace":
        from labctl.api.workspace import Workspace

        return Workspace
    if name in _RENAMED:
        new, value = _RENAMED[name]
        warnings.warn(f"labctl.api.{name} is now labctl.api.{new}; {name} goes in the next release", DeprecationWarning,
                      stacklevel=2)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
