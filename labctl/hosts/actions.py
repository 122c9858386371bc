"""`labctl hosts`: the lab's env files, preflight and trainer on real machines, over SSH.

  check  doctor's checks, over SSH: every host reached with a verified host key, torch and Python
         the same everywhere, the socket interface present with an address, the rendezvous port on
         the first host and a back-connect port between every pair of hosts reachable
  sync   the workspace mirrored to every host with rsync (no virtual environments, no .lab/ outputs,
         no caches), and each host's env file written beside it
  run    sync, then the same launch path as `labctl run` (run.executor.execute over hosts.ssh.SSHHosts): output
         streamed with each host's name, logs saved here, and every host stopped on Ctrl-C or on
         any host's failure

On each host, under its workspace: .lab/<inventory name>/<host>.env and runs/<run id>/ (the job's
per-rank metrics, copied back here after the run). Here: .lab/<inventory name>/runs/<run id>/.
"""

from __future__ import annotations

import io
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from dotenv import dotenv_values

from labctl.core.proc import run
from labctl.core.ui import Report
from labctl.diagnose.doctor import (
    check_env,
    check_iface,
    check_reach,
    check_versions,
    node_info,
    probe_reach,
)
from labctl.diagnose.compiler import HOST_FIX, check_compiler
from labctl.diagnose.findings import Diagnosis, Finding
from labctl.diagnose.gpus import check_gpus
from labctl.diagnose.packages import check_packages
from labctl.errors import CommandError, LabError, StateError
from labctl.hosts.inventory import Inventory
from labctl.hosts.packages import HostPackages, install, packages_path, with_pythonpath
from labctl.hosts.ssh import (
    PREPARE_SCRIPT,
    SSHError,
    SSHHosts,
    is_known,
    recorded_fingerprint,
    rsync_pull_argv,
    rsync_push_argv,
    rsync_stats,
)
from labctl.image.lockfile import Lock
from labctl.run.executor import execute
from labctl.run.plan import LaunchOptions, RunPlan, build_run_plan

T = TypeVar("T")
PROBE_CONNECT_S = 3.0  # hosts start their probes over separate SSH sessions, up to a second or so apart
SYNC_TIMEOUT_S = 1800


def env_file(inventory: Inventory, name: str) -> str:
    """Where a host's env file is, relative to its workspace (PREPARE_SCRIPT writes it there)."""
    return f"{inventory.state_dir}/{name}.env"


def local_dir(workspace: Path, inventory: Inventory) -> Path:
    return workspace / inventory.state_dir


def env_file_values(text: str) -> dict[str, str]:
    return {k: v for k, v in dotenv_values(stream=io.StringIO(text)).items() if v is not None}


def each_host(inventory: Inventory, work: Callable[[str], T]) -> tuple[dict[str, T], dict[str, LabError]]:
    """work(host name) on every host at once: what each returned, and the LabError each raised."""
    def attempt(name: str):
        try:
            return name, work(name), None
        except LabError as exc:
            return name, None, exc

    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = list(pool.map(attempt, inventory.names))
    return ({name: value for name, value, exc in outcomes if exc is None},
            {name: exc for name, _, exc in outcomes if exc is not None})


def on_every_host(inventory: Inventory, work: Callable[[str], T]) -> dict[str, T]:
    """work(host name) on every host at once; if any raise, one LabError naming each host that failed."""
    values, errors = each_host(inventory, work)
    if len(errors) == 1:
        raise next(iter(errors.values()))
    if errors:
        kind = StateError if all(isinstance(e, StateError) for e in errors.values()) else LabError
        raise kind("; ".join(e.message for e in errors.values()), hint=next(iter(errors.values())).hint)
    return values


# ----------------------------------------------------------------------------------- connect


@dataclass
class Reached:
    """What every host said when asked: its facts (doctor's INFO), or why it could not be asked."""

    info: dict[str, dict]
    failed: dict[str, LabError]


def unknown_hosts(hosts: SSHHosts) -> set[str]:
    """The hosts whose key --accept-new is about to record (none without it)."""
    return {h.name for h in hosts.inventory.hosts if hosts.accept_new and not is_known(h)}


def report_recorded(hosts: SSHHosts, names: set[str], report: Report) -> None:
    """Say which key was recorded for each host that was new: labctl tells what it trusted."""
    for name in sorted(names):
        host = hosts.host(name)
        if is_known(host):
            report(f"{name}: recorded its host key {recorded_fingerprint(host)} in "
                   f"{host.known_hosts or '~/.ssh/known_hosts'} (--accept-new)")


def connect(hosts: SSHHosts, report: Report, packages: str = "") -> Reached:
    """Reach every host at once and gather doctor's facts (the packages as a job sees them, with
    `packages`, the folder of the inventory's lock, first on sys.path); a host SSH refuses is a
    failure, not an abort."""
    inventory = hosts.inventory
    new = unknown_hosts(hosts)

    def ask(name: str) -> dict:
        host = inventory.host(name)
        try:
            info = node_info(hosts, name, (f"{host.workspace}/{packages}",) if packages else ())
        except ValueError as exc:  # the Python named in the inventory did not run: what the shell said
            said = re.search(r"no report \((.*)\)$", str(exc), re.S)
            raise LabError(f"{name} ({host.destination}): {host.python} did not run there: "
                           f"{(said.group(1) if said else str(exc)).strip()}",
                           hint=f"set python (or venv) for {name} in {inventory.path} to the Python that has torch"
                           ) from None
        return {**info, "ip": host.address, "iface": host.iface}

    info, failed = each_host(inventory, ask)
    report_recorded(hosts, new, report)
    return Reached(info, failed)


def host_findings(inventory: Inventory, reached: Reached, nproc_per_node: int | None = None,
                  lock: tuple[str, Lock] | None = None) -> list[Finding]:
    """Everything doctor checks that needs no traffic between the hosts; with `lock` (its path, the
    Lock), every host's packages against it too."""
    out = [Finding("ssh" if isinstance(exc, SSHError) else "python", name, False, exc.message, exc.hint or "")
           for name, exc in reached.failed.items()]
    if not reached.failed:
        out.append(Finding("ssh", "all", True, f"{len(inventory.hosts)} host{'s' * (len(inventory.hosts) != 1)} "
                           "reached, every host key verified"))
    envs = {name: env_file_values(text) for name, text in inventory.env_files(nproc_per_node).items()}
    out += check_env(envs)
    info = reached.info
    with_torch = {name: i for name, i in info.items() if i.get("torch")}
    for name in info.keys() - with_torch.keys():
        host = inventory.host(name)
        out.append(Finding("versions", name, False, f"{host.python} on {name} has no torch",
                           "install the same torch release as on the other hosts, or point python (or venv) in "
                           "the inventory at the environment that has it"))
    checked = check_versions(with_torch) if with_torch else []
    fix = (f"`labctl hosts sync --inventory {inventory.path}` installs the lock's packages on every host" if lock else
           "install the same versions on every host, or give them one lock: `labctl hosts sync --requirements FILE`")
    checked += check_packages(info, lock[1] if lock else None, lock[0] if lock else "", fix=fix)
    checked += check_gpus(with_torch, {name: envs[name] for name in with_torch})  # envs carry nproc_per_node
    checked += check_compiler(with_torch, fix=HOST_FIX)
    if info:
        checked += check_iface(info, {name: envs[name] for name in info}, None,
                               how_to_set=lambda node: f"set iface for {node} in {inventory.path} to")
    if len(with_torch) == len(inventory.hosts):
        out += checked
    else:  # "the same on every node" would claim hosts that were not asked, or have no torch
        out += [f for f in checked if not f.ok]
    no_rsync = sorted(name for name, i in info.items() if not i.get("rsync"))
    out += [Finding("tools", name, False, f"{name} has no rsync, which `labctl hosts sync` needs at both ends",
                    "install it there: apt-get install rsync (or dnf install rsync)") for name in no_rsync]
    return out


def reach_findings(hosts: SSHHosts, reached: Reached) -> list[Finding]:
    """doctor's probes between the hosts: the rendezvous port on the first, and a back-connect port
    between every pair, dialled at the address each host's interface carries, which is the address
    gloo and NCCL will advertise to their peers."""
    inventory = hosts.inventory
    first = inventory.hosts[0]
    ips = {}
    for name, info in reached.info.items():
        addrs = info.get("ifaces", {}).get(inventory.host(name).iface) or []
        if addrs:
            ips[name] = addrs[0].split("/")[0]
    if ips.keys() != set(inventory.names):
        # A host that SSH cannot reach, or without an address on its interface, cannot take part.
        return [Finding("ports", "all", False, "the rendezvous and back-connect ports were not probed: every host "
                        "must be reached with an address on its interface first (see above)", warn=True)]
    master = (first.name, first.address, inventory.master_port)
    port, results = probe_reach(hosts, ips, master, connect_s=PROBE_CONNECT_S)
    return check_reach(results, master, port, connect_s=PROBE_CONNECT_S)


def check(hosts: SSHHosts, report: Report, lock: tuple[str, Lock] | None = None) -> Diagnosis:
    """doctor over SSH: every host's facts (their packages against `lock` too) and the reachability between them."""
    started = time.monotonic()
    reached = connect(hosts, report, packages_path(hosts.inventory, lock[1]) if lock else "")
    findings = host_findings(hosts.inventory, reached, lock=lock)
    findings += reach_findings(hosts, reached)
    return Diagnosis(f"hosts of {hosts.inventory.path}", findings, reached.info, time.monotonic() - started)


def preflight(hosts: SSHHosts, nproc_per_node: int | None, report: Report,
              lock: tuple[str, Lock] | None = None) -> Diagnosis:
    """The cheap checks before `hosts run` (no reachability probes)."""
    started = time.monotonic()
    reached = connect(hosts, report, packages_path(hosts.inventory, lock[1]) if lock else "")
    findings = host_findings(hosts.inventory, reached, nproc_per_node, lock)
    return Diagnosis(f"hosts of {hosts.inventory.path}", findings, {}, time.monotonic() - started)


# -------------------------------------------------------------------------------------- sync


def prepare(hosts: SSHHosts, env_texts: dict[str, str]) -> None:
    """Every host's workspace made (or found to be labctl's) and its env file written."""
    inventory = hosts.inventory
    state = inventory.state_dir

    def one(name: str) -> None:
        host = inventory.host(name)
        code, output = hosts.run(name, ["sh", "-c", PREPARE_SCRIPT, "sh", host.workspace, state, f"{name}.env"],
                                 input_text=env_texts[name])
        if code == 3 and "DDPLAB_NOT_OURS" in output:
            raise LabError(f"{name}: {host.workspace} on {host.destination} is not empty and was not made by labctl; "
                           "`hosts sync` mirrors the workspace into it and would delete what is there",
                           hint=f"set workspace for {name} in {inventory.path} to a new or empty folder")
        if code != 0:
            raise LabError(f"{name}: could not prepare {host.workspace} on {host.destination} (status {code}): "
                           f"{output.strip()[-300:]}")

    on_every_host(inventory, one)


def push(hosts: SSHHosts, workspace: Path, excludes: list[str]) -> dict[str, dict[str, int]]:
    """rsync the workspace to every host at once: {host: {"files", "bytes_sent"}}."""

    def one(name: str) -> dict[str, int]:
        host = hosts.host(name)
        try:
            result = run(rsync_push_argv(host, workspace, excludes, accept_new=hosts.accept_new), check=False,
                         timeout_s=SYNC_TIMEOUT_S)
        except CommandError as exc:
            raise LabError(f"{name}: rsync to {host.destination} did not finish: {exc}") from None
        if result.returncode != 0:
            error = hosts.failure(name, result.stderr)
            if error is not None:
                raise error
            raise LabError(f"{name}: rsync to {host.destination} failed (status {result.returncode}): "
                           f"{result.stderr.strip()[-300:]}", hint="rsync must be installed on the host too; "
                           f"`labctl hosts check --inventory {hosts.inventory.path}` checks")
        return rsync_stats(result.stdout)

    return on_every_host(hosts.inventory, one)


def sync(hosts: SSHHosts, workspace: Path, excludes: list[str], env_texts: dict[str, str],
         report: Report, packages: HostPackages | None = None, cache: Path | None = None) -> dict[str, dict[str, int]]:
    """Every host's workspace prepared and its env file written, the workspace mirrored, and with
    `packages` the lock's packages installed (labctl.hosts.packages)."""
    new = unknown_hosts(hosts)
    try:
        prepare(hosts, env_texts)
    finally:
        report_recorded(hosts, new, report)
    stats = push(hosts, workspace, excludes)
    if packages is not None:
        install(hosts, packages, cache or workspace / ".lab", report, on_every_host)
    return stats


def fetch_outputs(hosts: SSHHosts, remote_run_dir: str, run_dir: Path, report: Report) -> None:
    """Copy what the job wrote on each host (per-rank metrics) into the local run folder; best effort."""

    def one(name: str) -> None:
        try:
            result = run(rsync_pull_argv(hosts.host(name), remote_run_dir, run_dir), check=False, timeout_s=300)
        except CommandError as exc:  # it never masks how the run itself ended
            report(f"{name}: could not copy {remote_run_dir} back: {exc}")
            return
        if result.returncode not in (0, 23):  # 23: nothing there (a job that wrote no metrics)
            report(f"{name}: could not copy {remote_run_dir} back: {result.stderr.strip()[-200:]}")

    each_host(hosts.inventory, one)


# --------------------------------------------------------------------------------------- run


@dataclass(frozen=True)
class HostsRun:
    """What `hosts run` will do, as plain data: nothing has touched a host yet."""

    hosts: SSHHosts
    env_texts: dict[str, str]  # host name -> its env file
    job: RunPlan  # the run itself; its remote_run_dir is on each host, relative to its workspace


def plan_run(inventory: Inventory, workspace: Path, script_args: list[str], options: LaunchOptions, *,
             accept_new: bool, packages: str = "") -> HostsRun:
    """The run on the hosts, started as `options` say (each host's env file written for
    `options.nproc_per_node` processes); `packages`: the folder of the inventory's lock, which the
    env files put first on PYTHONPATH."""
    env_texts = inventory.env_files(options.nproc_per_node)
    if packages:
        env_texts = with_pythonpath(env_texts, packages)
    node_env = {name: env_file_values(text) for name, text in env_texts.items()}
    job = build_run_plan(node_env, script_args, local_dir(workspace, inventory), options,
                         remote_runs_parent=inventory.state_dir)
    hosts = SSHHosts(inventory, accept_new=accept_new,
                     env_files={name: env_file(inventory, name) for name in inventory.names}, packages=packages)
    return HostsRun(hosts, env_texts, job)


def execute_run(plan: HostsRun, workspace: Path, excludes: list[str] | None, report: Report,
                echo: bool | str = True, check: bool = True, packages: HostPackages | None = None,
                cache: Path | None = None):
    """Sync (unless `excludes` is None: then only the env files are written), with `packages` the
    lock's packages too, run on every host through the one executor, as `labctl run` does, and copy
    each host's outputs back, whatever happened."""
    if excludes is None:
        prepare(plan.hosts, plan.env_texts)
    else:
        started = time.monotonic()
        stats = sync(plan.hosts, workspace, excludes, plan.env_texts, report, packages, cache)
        report(f"synced {len(stats)} hosts in {time.monotonic() - started:.1f} s "
               f"({sum(s['files'] for s in stats.values())} files changed)")
    report(f"run {plan.job.run_id} on {', '.join(plan.hosts.inventory.names)} (logs: {plan.job.run_dir})")
    try:
        return execute(plan.hosts, plan.job, echo=echo, check=check)
    finally:
        fetch_outputs(plan.hosts, plan.job.remote_run_dir, plan.job.run_dir, report)


def manual_commands(hosts: SSHHosts) -> list[tuple[str, str]]:
    """(host, what to type to run the job by hand there), as `labctl env` prints for its files."""
    inventory = hosts.inventory
    out = []
    for host in inventory.hosts:
        out.append((host.name, f"{host.ssh_command}, then: cd {host.workspace} && set -a && "
                               f". ./{env_file(inventory, host.name)} && "
                               f"set +a && {host.python} -m torch.distributed.run -m trainer"))
    return out
