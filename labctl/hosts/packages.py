"""Your project's packages on real hosts, from the same lock as the lab's nodes.

The lock is the one `hosts sync --requirements/--with` resolves for the hosts' Python (asked of the
first host) and the torch release it has, kept here as .lab/<inventory name>/hosts-pylock.toml; else
the lab's own lock, .lab/<name>/pylock.toml, for the inventory `labctl up --ssh` writes (the lab's
nodes as hosts). Each host gets the wheels it
lacks with rsync (the hosts may reach no index), and its own Python installs them in hash-checking
mode into a folder of the lock's (.lab/<name>/packages-<hash12> under its workspace: pip --target),
which the host's env file puts first on PYTHONPATH: the job sees the lock's versions whatever the
host's Python has, and nothing of the host's own environment changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from labctl import remote
from labctl.core.proc import last_json_line, run
from labctl.core.ui import Report
from labctl.diagnose.doctor import node_info
from labctl.errors import CommandError, LabError, StateError
from labctl.hosts.inventory import Inventory
from labctl.hosts.ssh import SSHHosts, rsync_files_argv
from labctl.image.lockfile import Lock, hash_requirements, read_lab_lock, release, render_lock, to_install
from labctl.image.packages import LOCK_FILE, Declaration
from labctl.image.resolve import ensure_lock, fetch_wheels, write_atomic
from labctl.image.wheelhouse import Target, target_from_probe

HOSTS_LOCK = "hosts-pylock.toml"  # beside the lab's own lock, which it takes the place of for the hosts
INSTALL_SCRIPT = remote.load("install-packages.sh")
TARGET_SCRIPT = remote.load("python_target.py")
PRESENT = "DDPLAB_PACKAGES_PRESENT"


@dataclass(frozen=True)
class HostPackages:
    lock: Lock
    target: Target  # the hosts' Python, as the first host reports it
    path: str  # the packages folder, relative to each host's workspace


def packages_path(inventory: Inventory, lock: Lock) -> str:
    return f"{inventory.state_dir}/packages-{lock.short}"


def with_pythonpath(env_texts: dict[str, str], path: str) -> dict[str, str]:
    """The hosts' env files with the packages folder first on PYTHONPATH, before what the host sets
    (a node image's own /opt/ddplab, say). Relative: each job starts in its workspace, and Python
    makes sys.path's entries absolute as it starts."""
    line = f"PYTHONPATH={path}${{PYTHONPATH:+:$PYTHONPATH}}\n"
    return {name: text + ("" if text.endswith("\n") else "\n") + line for name, text in env_texts.items()}


def host_target(hosts: SSHHosts, name: str) -> Target:
    code, output = hosts.run(name, ["python", "-c", TARGET_SCRIPT])
    report = last_json_line(output)
    if code != 0 or report is None:
        raise StateError(f"{name}: its Python did not say what it is: {output.strip()[-300:]}",
                         hint=f"check python for {name} in {hosts.inventory.path}")
    return target_from_probe(report)


def hosts_lock_path(workspace: Path, inventory: Inventory) -> Path:
    """The lock the hosts get: their own where `hosts sync` resolved one, else the lab's of that name."""
    folder = workspace / inventory.state_dir
    return folder / HOSTS_LOCK if (folder / HOSTS_LOCK).is_file() else folder / LOCK_FILE


def host_packages(hosts: SSHHosts, declaration: Declaration | None, workspace: Path, cache: Path,
                  report: Report) -> HostPackages | None:
    """The lock the hosts get: resolved for them from `declaration` (and kept as their own), else the
    one they have (hosts_lock_path); None where there is none."""
    inventory = hosts.inventory
    local = hosts_lock_path(workspace, inventory)
    if declaration is None and not local.is_file():
        return None
    first = inventory.names[0]
    target = host_target(hosts, first)
    if declaration is None:
        lock = read_lab_lock(local)
    else:
        torch = node_info(hosts, first).get("torch")
        if not torch:
            raise StateError(f"{first}: its Python has no torch, which the packages are resolved with",
                             hint=f"point python for {first} in {inventory.path} at the environment that has torch")
        lock = ensure_lock(declaration, torch=release(torch), target=target, cache=cache, report=report)
        own = workspace / inventory.state_dir / HOSTS_LOCK
        if declaration.file != own.resolve():
            write_atomic(own, render_lock(lock, target))
    return HostPackages(lock, target, packages_path(inventory, lock))


def install(hosts: SSHHosts, packages: HostPackages, cache: Path, report: Report,
            on_every_host: Callable) -> dict[str, int]:
    """The lock's packages on every host (`on_every_host`: labctl.hosts.actions's, all at once): what
    each host's Python lacks is fetched here once, sent with rsync and installed there into the
    packages folder, unless that folder holds this lock already. Returns how many each host got."""
    inventory, lock = hosts.inventory, packages.lock
    have = on_every_host(inventory, lambda name: node_info(hosts, name).get("packages") or {})
    pins = {name: to_install(lock, installed) for name, installed in have.items()}
    wanted = sorted({pin for missing in pins.values() for pin in missing})
    files = dict(zip(wanted, fetch_wheels(wanted, cache, packages.target, report)))
    wheels = f"{inventory.state_dir}/wheels"

    def one(name: str) -> int:
        host = inventory.host(name)
        if pins[name]:
            sent = [files[pin] for pin in pins[name]]
            try:
                result = run(rsync_files_argv(host, sent, wheels, accept_new=hosts.accept_new), check=False,
                             timeout_s=1800)
            except CommandError as exc:
                raise LabError(f"{name}: rsync of the wheels did not finish: {exc}") from None
            if result.returncode != 0:
                raise LabError(f"{name}: rsync of the wheels to {host.destination} failed: "
                               f"{result.stderr.strip()[-300:]}")
        code, output = hosts.run(name, ["sh", "-c", INSTALL_SCRIPT, "sh", host.python,
                                        f"{host.workspace}/{packages.path}", f"{host.workspace}/{wheels}",
                                        lock.digest], input_text=hash_requirements(pins[name]), timeout_s=1800)
        if code != 0:
            raise LabError(f"{name}: its Python could not install the lock's wheels (status {code}): "
                           f"{output.strip()[-400:]}")
        return 0 if PRESENT in output else len(pins[name])

    given = on_every_host(inventory, one)
    report(f"packages {lock.short}: " + ", ".join(f"{name} {'has them' if n == 0 else f'got {n}'}"
                                                  for name, n in given.items()))
    return given
