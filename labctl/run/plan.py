"""One run as plain data: which process starts on which node, with what environment, and where its
logs go. Built the same way for the lab's containers and for real hosts; `--dry-run` prints it and
`executor.execute` is the one thing that runs it. Building a plan touches no node.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from labctl.errors import LabError
from labctl.run.launch import Elastic, Launch, Launcher, LaunchOptions, build_launches, choose_launcher, parse_nnodes
from labctl.spec.labspec import check_nproc, check_timeout

__all__ = ["Launcher", "LaunchOptions", "RunOptions", "RunPlan", "build_run_plan", "new_run"]


@dataclass(frozen=True)
class RunOptions:
    """What one run asks for, as `labctl run` and `labctl hosts run` take it: one frozen value shared
    by the CLI, `Lab.run`, `Hosts.run`, the pytest plugin and the benches, as LabSpec is for `up`.

    `env` is added to every process's environment (as `-e`); a relative script is taken from `cwd`
    (default: the workspace). `check` raises RunFailed on a failed run; `preflight` runs doctor's
    cheap checks first; `echo` shows the nodes' output (True), on stderr ("stderr") or not (False).
    The lab's nodes only: `max_restarts` and `nnodes` (torchrun's fault tolerance), `ifname` (the
    interface the ranks' sockets use; None: the lab's overlay tunnel where it has one, else the
    bridge's). Real hosts only: `sync` (the workspace first) and `excludes` (what sync leaves out).
    """

    launcher: Launcher = "auto"
    nproc_per_node: int | None = None  # processes per node; None: each node's env file's NPROC_PER_NODE
    pg_timeout_s: float | None = 30.0  # the trainer's process-group timeout (DDPLAB_PG_TIMEOUT_S); None: torch's
    env: Mapping[str, str] | None = None
    cwd: str | Path | None = None
    timeout_s: float | None = None  # the whole run is stopped after this long; None: no limit
    preflight: bool = True
    echo: bool | str = True
    check: bool = True
    max_restarts: int = 0
    nnodes: str | None = None  # "MIN:MAX", MAX the lab's node count
    ifname: str | None = None
    sync: bool = True
    excludes: tuple[str, ...] = ()

    LAB_ONLY = ("max_restarts", "nnodes", "ifname")
    HOSTS_ONLY = ("sync", "excludes")

    @classmethod
    def given(cls, options: RunOptions | None, settings: Mapping[str, Any], call: str, where: str) -> RunOptions:
        """`options` (default: every default) with `settings`, keyword arguments of `call` (Lab.run,
        Hosts.run, ...), over it, for a run on `where` ("lab" or "hosts"): a name that is no option is
        refused, naming the ones there are, and so is an option of the other kind of run (only_for)."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise LabError(f"{call} has no option {', '.join(unknown)}", hint=f"its options: {', '.join(names)}")
        return replace(options or cls(), **settings).only_for(where)

    def only_for(self, where: str) -> RunOptions:
        """Itself, refusing the options of the other kind of run set away from their defaults
        (`where`: "lab" or "hosts")."""
        other = self.HOSTS_ONLY if where == "lab" else self.LAB_ONLY
        default = type(self)()
        wrong = [name for name in other if getattr(self, name) != getattr(default, name)]
        if wrong:
            kind = "real hosts'" if where == "lab" else "the lab's nodes'"
            raise LabError(f"{', '.join(wrong)}: {kind} option{'s' if len(wrong) > 1 else ''}, not a {where} run's",
                           hint="Lab.run takes max_restarts, nnodes and ifname; Hosts.run takes sync and excludes")
        return self

    def checked(self) -> RunOptions:
        """Itself, its syntax checked (ConfigError, exit 2): what needs no node, so bad input is told
        before a lab that is not up is."""
        return replace(self, nproc_per_node=check_nproc(self.nproc_per_node))

    def launch(self, nodes: int) -> LaunchOptions:
        """How the processes start, checked, for a run on `nodes` nodes (what `nnodes`' MAX must be)."""
        low, high = parse_nnodes(self.nnodes, nodes) if self.nnodes else (None, None)
        return LaunchOptions(launcher=self.launcher, nproc_per_node=check_nproc(self.nproc_per_node),
                             elastic=Elastic(self.max_restarts, low, high), pg_timeout_s=self.pg_timeout_s,
                             env=self.env, timeout_s=self.timeout_s)


@dataclass(frozen=True)
class RunPlan:
    """What one run will do. `node_env` maps each node to its env file's values, in node-rank order."""

    run_id: str
    run_dir: Path  # here: logs (and, from real hosts, the outputs copied back)
    node_env: dict[str, dict[str, str]]
    launches: list[Launch]
    store: bool  # the run's own rendezvous store starts on the first node (torchrun, warm)
    min_nodes: int | None = None  # elastic: the run succeeds when this many nodes finish cleanly
    remote_run_dir: str | None = None  # real hosts: the run folder on each, relative to its workspace
    timeout_s: float | None = None  # --timeout-s: the run is stopped after this long (exit 124); None: no limit
    launcher: str = ""  # how the workers start: warm, torchrun or static (`--dry-run` says it, and why)
    why: str = ""
    packages: str = ""  # the lock the nodes' packages come from, as `--dry-run` names it; "" for none

    @property
    def nodes(self) -> list[str]:
        return list(self.node_env)

    def describe(self, address) -> list[str]:
        """One line per process, as `--dry-run` prints it: `label (address): ENV=... argv`."""
        return [f"{launch.label} ({address(launch.node)}): {launch.display()}" for launch in self.launches]


def new_run(runs_parent: Path) -> tuple[str, Path]:
    """A fresh run id and its folder under <runs_parent>/runs/ (created when the run starts)."""
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
    return run_id, runs_parent / "runs" / run_id


def build_run_plan(node_env: dict[str, dict[str, str]], script_args: list[str], runs_parent: Path,
                   options: LaunchOptions = LaunchOptions(), *, cpus: int | None = None,
                   remote_runs_parent: str | None = None) -> RunPlan:
    """The plan for `script_args` (`SCRIPT [ARGS]` or `-m MODULE [ARGS]`) on the nodes of `node_env`,
    started as `options` say (its launcher "auto" settled here, see choose_launcher).

    The run's folder is made under `runs_parent`; on real hosts (`remote_runs_parent`, relative to
    each host's workspace) the processes write their outputs there instead, and they are copied back.
    `options.env` (-e and --env-file) goes to every process; `options.timeout_s` bounds the whole run.
    Given the machine's `cpus`, every process gets an OMP_NUM_THREADS that shares them out.
    """
    check_timeout(options.timeout_s)
    launcher, why = choose_launcher(options.launcher, options.elastic)
    run_id, run_dir = new_run(runs_parent)
    remote_run_dir = f"{remote_runs_parent}/runs/{run_id}" if remote_runs_parent is not None else None
    launches = build_launches(node_env, script_args, replace(options, launcher=launcher), run_id=run_id,
                              run_dir=remote_run_dir or run_dir, cpus=cpus)
    return RunPlan(run_id, run_dir, dict(node_env), launches, launcher in ("torchrun", "warm"),
                   options.elastic.min_nodes, remote_run_dir, options.timeout_s, launcher, why)
