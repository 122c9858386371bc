"""Real machines from Python: `Hosts`, re-exported by labctl.api (`from labctl.api import Hosts`).

    hosts = Hosts(".lab/demo/hosts.toml")
    hosts.check().raise_for_problems()
    result = hosts.run("-m", "trainer")

The methods mirror `labctl hosts check|sync|run`; each imports what it needs when called.
"""

from __future__ import annotations

import shlex
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.core import assets
from labctl.core.ui import Report
from labctl.diagnose.findings import Diagnosis
from labctl.hosts import actions
from labctl.hosts.inventory import Inventory, load_inventory
from labctl.hosts.packages import host_packages, hosts_lock_path, packages_path, with_pythonpath
from labctl.hosts.ssh import SSHHosts, require_tools, rsync_push_argv, sync_excludes
from labctl.image.lockfile import Lock, read_lab_lock
from labctl.image.packages import read_declaration
from labctl.run.launch import job_args
from labctl.run.plan import RunOptions
from labctl.run.result import RunResult
from labctl.spec.labspec import check_nproc



def _quiet(_message: str) -> None:
    pass


@dataclass(frozen=True)
class SyncResult:
    stats: dict[str, dict[str, int]]  # host -> rsync's files changed and bytes sent
    seconds: float
    manual_commands: list[tuple[str, str]]  # (host, what to type there to run the job by hand)


class Hosts:
    """Real machines over SSH, from an inventory (TOML): `check()`, `sync()`, `run(...)`."""

    def __init__(self, inventory, *, accept_new: bool = False, workspace: str | Path | None = None,
                 report: Report | None = None, cache_dir: str = ""):
        """`cache_dir`: where resolved locks and wheels are kept (DDPLAB_CACHE_DIR; "" for labctl's default)."""
        self.inventory = inventory if isinstance(inventory, Inventory) else load_inventory(Path(inventory))
        self.accept_new = accept_new
        self.workspace = Path(workspace or Path.cwd()).resolve()
        self.report = report or _quiet
        self.cache = assets.cache_dir(cache_dir)

    def _ssh(self):
        return SSHHosts(self.inventory, accept_new=self.accept_new)

    @property
    def lock_path(self) -> Path:
        """The hosts' lock: `.lab/<inventory name>/hosts-pylock.toml` where `sync` resolved one, else the
        lab's own pylock.toml there (for `up --ssh`'s inventory)."""
        return hosts_lock_path(self.workspace, self.inventory)

    def lock(self) -> tuple[str, Lock] | None:
        """(its path, the Lock) of the packages the hosts get, or None."""
        lock = read_lab_lock(self.lock_path)
        return (str(self.lock_path), lock) if lock is not None else None

    def check(self) -> Diagnosis:
        """doctor over SSH: host keys, versions, packages, interfaces, and reachability between every pair."""
        require_tools("ssh")
        return actions.check(self._ssh(), self.report, self.lock())

    def sync(self, excludes: tuple[str, ...] = (), *, requirements: str | None = None,
             with_packages: tuple[str, ...] = ()) -> SyncResult:
        """Mirror the workspace to every host, write each host's env file, and give every host the
        hosts' packages: those of `requirements` (a file, relative to the workspace, as for `Lab`) and
        `with_packages`, resolved for the hosts, else the inventory's lock where it has one."""
        require_tools("ssh", "rsync")
        started = time.monotonic()
        hosts = self._ssh()
        declaration = read_declaration(requirements or "", with_packages, self.workspace)
        packages = host_packages(hosts, declaration, self.workspace, self.cache, self.report)
        env_texts = self.inventory.env_files()
        if packages is not None:
            env_texts = with_pythonpath(env_texts, packages.path)
        stats = actions.sync(hosts, self.workspace, sync_excludes(self.workspace, excludes), env_texts, self.report,
                             packages, self.cache)
        return SyncResult(stats, time.monotonic() - started, actions.manual_commands(hosts))

    def sync_commands(self, excludes: tuple[str, ...] = ()) -> list[tuple[str, str]]:
        """(host, the rsync command `sync` runs for it): a plan."""
        patterns = sync_excludes(self.workspace, excludes)
        return [(host.name, shlex.join(rsync_push_argv(host, self.workspace, patterns)))
                for host in self.inventory.hosts]

    def plan_run(self, *argv: str, options: RunOptions | None = None, **settings: Any):
        """What `run(*argv, ...)` will do on each host, as data (a hosts.actions.HostsRun)."""
        options = RunOptions.given(options, settings, "Hosts.plan_run", "hosts").checked()
        lock = self.lock()
        return actions.plan_run(self.inventory, self.workspace, job_args(argv, self.workspace, options.cwd),
                                options.launch(len(self.inventory.hosts)), accept_new=self.accept_new,
                                packages=packages_path(self.inventory, lock[1]) if lock else "")

    def run_plan(self, *argv: str, **settings: Any):
        """Deprecated: `plan_run`, its one name now; this one warns and goes in the next release."""
        warnings.warn("Hosts.run_plan is now Hosts.plan_run", DeprecationWarning, stacklevel=2)
        return self.plan_run(*argv, **settings)

    def preflight(self, plan, nproc_per_node: int | None = None) -> Diagnosis:
        """doctor's cheap checks on the plan's hosts, over SSH, before a run."""
        nproc = check_nproc(nproc_per_node)
        require_tools("ssh")
        return actions.preflight(plan.hosts, nproc, self.report, self.lock())

    def run(self, *argv: str, options: RunOptions | None = None, **settings: Any) -> RunResult:
        """Sync (or only write the env files), check, and run on every host, as `labctl hosts run`:
        `options` a RunOptions, or its fields as keywords, as for Lab.run (`sync`, `excludes`: the
        workspace synced first, less these patterns)."""
        options = RunOptions.given(options, settings, "Hosts.run", "hosts")
        plan = self.plan_run(*argv, options=options)
        if options.preflight:
            self.preflight(plan, options.nproc_per_node).raise_for_problems(self.full_check)
        return self.execute(plan, sync=options.sync, excludes=options.excludes, echo=options.echo, check=options.check)

    @property
    def full_check(self) -> str:
        return f"labctl hosts check --inventory {self.inventory.path}"

    def execute(self, plan, *, sync: bool = True, excludes: tuple[str, ...] = (), echo: bool | str = True,
                check: bool = True) -> RunResult:
        """Run a plan from `run_plan`: sync (or only write the env files), run, copy the outputs back."""
        require_tools("ssh", *(["rsync"] if sync else []))
        excluded = sync_excludes(self.workspace, excludes) if sync else None
        packages = host_packages(plan.hosts, None, self.workspace, self.cache, self.report) if sync else None
        return actions.execute_run(plan, self.workspace, excluded, self.report, echo=echo, check=check,
                                   packages=packages, cache=self.cache)
