"""Who owns a lab: labels on every container, network and volume, so that labs whose owner died
(a test session killed with -9, a script that crashed inside `with Lab(...)`) can be found and
removed later by `labctl gc`, and nobody else's lab is touched.

- `io.ddplab.owner.user`, `io.ddplab.owner.host`: who brought it up, on which machine;
- `io.ddplab.owner.session`: `cli` for `labctl up`, `api` for the Python API, `scenario` for the
  throwaway lab of `labctl scenario`, or what the owner said in DDPLAB_OWNER_SESSION (the pytest
  plugin: `pytest-<id>`);
- `io.ddplab.owner.pid`, `io.ddplab.owner.pid-start` and `io.ddplab.owner.pid-ns`: the process
  whose life the lab's is tied to, its start time (so a pid reused by another process does not
  keep a dead lab alive), and the boot and PID namespace its pid means something in (a test
  session in another container that shares the engine, or before a reboot, is never judged from
  here: its pids are not ours). Only a lab with an owner process has them: `with Lab(...)` and a
  scenario's lab (this process), or a process that set DDPLAB_OWNER_PID (the pytest plugin: the
  test session). A lab from `labctl up` is meant to outlive labctl, so it has none, and only
  `labctl gc --all` removes it.
"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass
from typing import Mapping

PREFIX = "io.ddplab.owner."
LABEL_USER = PREFIX + "user"
LABEL_HOST = PREFIX + "host"
LABEL_SESSION = PREFIX + "session"
LABEL_PID = PREFIX + "pid"
LABEL_PID_START = PREFIX + "pid-start"
LABEL_PID_NS = PREFIX + "pid-ns"
OWNER_PID_VAR = "DDPLAB_OWNER_PID"
OWNER_SESSION_VAR = "DDPLAB_OWNER_SESSION"


@dataclass(frozen=True)
class Owner:
    user: str
    host: str
    session: str
    pid: int | None = None
    pid_start: str | None = None
    pid_ns: str | None = None

    def labels(self) -> dict[str, str]:
        labels = {LABEL_USER: self.user, LABEL_HOST: self.host, LABEL_SESSION: self.session}
        if self.pid is not None:
            labels[LABEL_PID] = str(self.pid)
            labels[LABEL_PID_START] = self.pid_start or ""
            labels[LABEL_PID_NS] = self.pid_ns or ""
        return labels


def pid_namespace() -> str:
    """This boot and this PID namespace (`<boot id>/pid:[inode]`): where a pid names one process."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return socket.gethostname()


def process_start(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot, /proc/PID/stat field 22), or None
    when there is no such process (or no /proc), or only its zombie, which has exited."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: count from its end.
    fields = stat[stat.rfind(")") + 2:].split()
    if not fields or fields[0] in ("Z", "X"):  # state: a zombie (not reaped yet) or dead
        return None
    return fields[19] if len(fields) > 19 else None


def current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid with no passwd entry and no $USER
        return str(os.getuid())


def owner_of(environ: Mapping[str, str], session: str, pid: int | None = None) -> Owner:
    """The owner of a lab brought up now: `pid` (or DDPLAB_OWNER_PID) is the process it lives and
    dies with; `session` is `cli` or `api` unless DDPLAB_OWNER_SESSION says otherwise."""
    given = environ.get(OWNER_PID_VAR, "")
    if pid is None and given.isdigit():
        pid = int(given)
    return Owner(current_user(), socket.gethostname(), environ.get(OWNER_SESSION_VAR) or session, pid,
                 process_start(pid) if pid is not None else None, pid_namespace() if pid is not None else None)


def owner_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The owner labels among a resource's labels."""
    return {k: v for k, v in labels.items() if k.startswith(PREFIX)}


def owner_gone(labels: Mapping[str, str], host: str | None = None) -> str | None:
    """Why a lab's owner is gone ("process 4242 has exited"), or None: alive, on another machine
    or in another PID namespace (a container sharing the engine: this one cannot tell), or a lab
    with no owner process (from `labctl up`)."""
    pid = labels.get(LABEL_PID, "")
    if not pid.isdigit():
        return None
    if labels.get(LABEL_HOST) != (host or socket.gethostname()) or labels.get(LABEL_PID_NS) != pid_namespace():
        return None
    started = process_start(int(pid))
    if started is None:
        return f"its owner, process {pid} ({labels.get(LABEL_SESSION, '?')}), has exited"
    if labels.get(LABEL_PID_START) and started != labels[LABEL_PID_START]:
        return f"its owner, process {pid} ({labels.get(LABEL_SESSION, '?')}), has exited (the pid is another's now)"
    return None
