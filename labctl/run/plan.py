"""One run as plain data: which process starts on which node, with what environment, and where its
logs go. Built the same way for the lab's containers and for real hosts; `--dry-run` prints it and
`executor.execute` is the one thing that runs it. Building a plan touches no node.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace
from pathlib import Path

from labctl.run.launch import Launch, Launcher, RunOptions, build_launches, choose_launcher
from labctl.spec.labspec import check_timeout

__all__ = ["Launcher", "RunOptions", "RunPlan", "build_run_plan", "new_run"]


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
                   options: RunOptions = RunOptions(), *, cpus: int | None = None,
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
