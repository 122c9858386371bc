"""SSH and rsync to real hosts, through the system's OpenSSH client, with host keys verified.

Every connection is `ssh` with BatchMode (never a prompt) and StrictHostKeyChecking=yes against the
inventory's known_hosts file. A host seen for the first time is accepted only with --accept-new
(OpenSSH's own accept-new: record a new key, still refuse a changed one), and a changed key is
refused with the fingerprint the host now presents. Nothing here accepts every key
(StrictHostKeyChecking=no), as Ansible does not by default either.

Pure builders come first (ssh options, remote command lines, rsync argv; ssh's messages are read
in ssh_messages.py);
`SSHHosts`, the run.executor.Nodes for real hosts, runs them. The remote side needs a POSIX shell, the
inventory's Python, and rsync for `hosts sync`; processes are found by /proc, so hosts run Linux.
"""

from __future__ import annotations

import logging
import os
import re
import selectors
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

from labctl import remote
from labctl.core.proc import run
from labctl.errors import CommandError, LabError, StateError
from labctl.hosts.inventory import Host, Inventory
from labctl.hosts.ssh_messages import (  # noqa: F401 (re-exported: SSHHosts' errors)
    Failure,
    SSHError,
    classify,
    explain,
    key_fingerprint,
    scanned_fingerprints,
)
from labctl.run.executor import STOP_GRACE_S
from labctl.run.launch import STOP_SCRIPT, Launch

log = logging.getLogger("labctl.hosts.ssh")

CONNECT_TIMEOUT_S = 10
ALIVE_INTERVAL_S = 5  # a silent host is given up after 3 unanswered keep-alives: 15 s
MARKER = ".ddplab-workspace"  # in every workspace `hosts sync` owns: it mirrors only into those
# Left out of `hosts sync`: outputs, caches and virtual environments (a venv is tied to the machine
# that made it; each host has its own Python, named in the inventory). `.git` without a slash: in a
# git worktree or a submodule it is a file, not a folder.
SYNC_EXCLUDES = (".git", ".lab/", ".venv/", "venv/", "__pycache__/", "*.pyc", ".pytest_cache/", ".mypy_cache/",
                 ".ruff_cache/", ".hypothesis/", ".ipynb_checkpoints/", ".tox/", ".nox/", "*.egg-info/")


# ------------------------------------------------------------------------------------- builders


def _ssh_option_value(text: str) -> str:
    """ssh splits some option values (UserKnownHostsFile) on whitespace; double quotes keep a path whole."""
    if re.search(r"[\s\"'\\]", text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def ssh_options(host: Host, *, accept_new: bool) -> list[str]:
    opts = [
        "-o", "BatchMode=yes",  # a missing key or an unknown host fails; nothing ever waits for a password
        "-o", f"StrictHostKeyChecking={'accept-new' if accept_new else 'yes'}",
        "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o", f"ServerAliveInterval={ALIVE_INTERVAL_S}", "-o", "ServerAliveCountMax=3",
        "-o", "LogLevel=ERROR",  # ssh's errors (a changed key) still show; its chatter does not mix into output
        "-p", str(host.port),
    ]
    if host.known_hosts is not None:
        opts += ["-o", f"UserKnownHostsFile={_ssh_option_value(str(host.known_hosts))}"]
    if host.identity_file is not None:
        opts += ["-i", str(host.identity_file), "-o", "IdentitiesOnly=yes"]
    if host.user:
        opts += ["-l", host.user]
    return opts


def ssh_argv(host: Host, command: str, *, accept_new: bool = False) -> list[str]:
    """`ssh ... -- ADDRESS COMMAND`: COMMAND is one line for the remote user's shell (remote_command)."""
    return ["ssh", *ssh_options(host, accept_new=accept_new), "-T", "--", host.address, command]


def sh_word(text: str) -> str:
    """One word for the remote POSIX shell; a leading ~/ stays the user's home."""
    if text.startswith("~/"):
        return '"$HOME"/' + shlex.quote(text[2:])
    return shlex.quote(text)


def remote_command(argv: list[str], *, workdir: str | None = None, env_file: str | None = None,
                   env: Mapping[str, str] | None = None) -> str:
    """The line the remote shell runs: cd WORKDIR, load ENV_FILE (relative to it), then exec argv with
    `env` on top. SSH carries one string, not argv, so every word is quoted here and only here."""
    steps = []
    if workdir:
        steps.append(f"cd {sh_word(workdir)}")
    if env_file:
        # `. NAME` without a slash would search PATH, not the current directory.
        steps.append(f"set -a && . {sh_word(env_file if '/' in env_file else './' + env_file)} && set +a")
    words = [sh_word(argv[0]), *(shlex.quote(a) for a in argv[1:])]
    if env:
        words = ["env", *(shlex.quote(f"{k}={v}") for k, v in env.items()), *words]
    steps.append("exec " + " ".join(words))
    return " && ".join(steps)


def resolve_argv(host: Host, argv: list[str]) -> list[str]:
    """The host's own Python for "python", and its torchrun as `python -m torch.distributed.run`
    (a venv's torchrun may not be on the PATH of a non-interactive SSH session)."""
    if argv and argv[0] == "python":
        return [host.python, *argv[1:]]
    if argv and argv[0] == "torchrun":
        return [host.python, "-m", "torch.distributed.run", *argv[1:]]
    return list(argv)


def _rsync_remote(host: Host, path: str) -> str:
    return f"{host.bracketed_address}:{path}"


def _rsync_shell(host: Host, accept_new: bool) -> str:
    return shlex.join(["ssh", *ssh_options(host, accept_new=accept_new)])


def rsync_push_argv(host: Host, source: Path, excludes: list[str], *, accept_new: bool = False) -> list[str]:
    """Mirror `source` into the host's workspace: --delete, so a removed file does not linger there
    and shadow a module; excluded paths (and the marker) are never deleted on the host."""
    return ["rsync", "--archive", "--delete", "--stats", *(f"--exclude={p}" for p in excludes),
            f"--exclude=/{MARKER}", "-e", _rsync_shell(host, accept_new), "--", f"{source}/",
            _rsync_remote(host, f"{host.workspace}/")]


def rsync_files_argv(host: Host, files: list[Path], remote_dir: str, *, accept_new: bool = False) -> list[str]:
    """Copy `files` into a folder under the host's workspace (made if missing; its parent must exist)."""
    return ["rsync", "--archive", "-e", _rsync_shell(host, accept_new), "--", *map(str, files),
            _rsync_remote(host, f"{host.workspace}/{remote_dir}/")]


def rsync_pull_argv(host: Host, remote_dir: str, dest: Path) -> list[str]:
    """Copy a folder under the host's workspace back (what the job wrote there: per-rank metrics)."""
    return ["rsync", "--archive", "-e", _rsync_shell(host, False), "--",
            _rsync_remote(host, f"{host.workspace}/{remote_dir}/"), f"{dest}/"]


def sync_excludes(workspace: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """The default exclusions, every virtual environment found in the top two levels of the
    workspace (by its pyvenv.cfg, whatever its name), and the user's own patterns."""
    venvs = sorted({f"/{cfg.parent.relative_to(workspace)}/" for pattern in ("*/pyvenv.cfg", "*/*/pyvenv.cfg")
                    for cfg in workspace.glob(pattern)})
    return [*SYNC_EXCLUDES, *venvs, *extra]


_STATS = {"files": re.compile(r"Number of regular files transferred: ([\d,]+)"),
          "bytes_sent": re.compile(r"Total bytes sent: ([\d,]+)")}


def rsync_stats(output: str) -> dict[str, int]:
    """Files and bytes that went over the wire, from rsync's --stats."""
    out = {}
    for key, pattern in _STATS.items():
        match = pattern.search(output)
        out[key] = int(match.group(1).replace(",", "")) if match else 0
    return out


# The first step on each host before a sync: `sh -c TEXT sh WORKSPACE STATE NAME`, the env file on
# stdin. It refuses a workspace that is not labctl's (DDPLAB_NOT_OURS, exit 3), marks it with MARKER,
# and writes the env file whole or not at all.
PREPARE_SCRIPT = remote.load("prepare-workspace.sh")


# --------------------------------------------------------------------------------- side effects


def require_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise StateError(f"{' and '.join(missing)} not found on this machine: `labctl hosts` needs the OpenSSH client "
                         "and rsync", hint="apt-get install openssh-client rsync (`make venv` does it where it can)")


def scan_host_keys(host: Host) -> list[tuple[str, str]]:
    """The keys the host offers now (ssh-keyscan), for a message; never trusted by themselves."""
    try:
        result = run(["ssh-keyscan", "-T", "5", "-p", str(host.port), host.address], check=False, timeout_s=15)
    except CommandError:
        return []
    return scanned_fingerprints(result.stdout)


def is_known(host: Host) -> bool:
    """Whether known_hosts has a key for the host (ssh-keygen -F reads hashed files too)."""
    argv = ["ssh-keygen", "-F", host.known_hosts_name]
    if host.known_hosts is not None:
        if not host.known_hosts.is_file():
            return False
        argv += ["-f", str(host.known_hosts)]
    return run(argv, check=False, timeout_s=10).returncode == 0


def recorded_fingerprint(host: Host) -> str:
    """The key known_hosts holds for the host, as `TYPE SHA256:...` (what --accept-new just recorded)."""
    argv = ["ssh-keygen", "-l", "-F", host.known_hosts_name]
    if host.known_hosts is not None:
        argv += ["-f", str(host.known_hosts)]
    match = re.search(r"(\S+) (SHA256:[A-Za-z0-9+/]+)", run(argv, check=False, timeout_s=10).stdout)
    return f"{match.group(1)} {match.group(2)}" if match else "?"


class SSHHosts:
    """The inventory's hosts as a run reaches them: one ssh session per launch or command.

    A run.executor.Nodes. Launches run under labctl/remote/stop.py's watch with the session's stdin held open,
    so a vanished labctl (Ctrl-C, kill -9, a dropped link) stops the run on the host.
    """

    def __init__(self, inventory: Inventory, *, accept_new: bool = False, env_files: Mapping[str, str] | None = None,
                 packages: str = ""):
        self.inventory = inventory
        self.accept_new = accept_new
        self.env_files = dict(env_files or {})  # host name -> its env file, relative to the workspace
        self.packages = packages  # the folder of the hosts' packages (labctl.hosts.packages), first on PYTHONPATH
        self.port_hint = f"set another master_port in {inventory.path}"
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()

    def host(self, node: str) -> Host:
        return self.inventory.host(node)

    def address(self, node: str) -> str:
        return self.host(node).destination

    def shell_hint(self, node: str) -> str:
        return self.host(node).ssh_command

    def argv(self, node: str, command: str) -> list[str]:
        return ssh_argv(self.host(node), command, accept_new=self.accept_new)

    def failure(self, node: str, stderr: str) -> SSHError | None:
        """The SSHError for an exit status 255 whose message we recognise (else the command's own 255)."""
        found = classify(stderr)
        if found is None:
            return None
        host = self.host(node)
        return explain(host, node, found, scan_host_keys(host) if found.kind == "unknown" else [])

    def run(self, node: str, argv: list[str], *, input_text: str = "", timeout_s: float = 60) -> tuple[int, str]:
        """Run a short command on the host: (exit status, output). Raises SSHError when SSH itself fails."""
        host = self.host(node)
        command = remote_command(resolve_argv(host, argv))
        try:
            result = run(self.argv(node, command), check=False, timeout_s=timeout_s, input_text=input_text)
        except CommandError as exc:
            raise SSHError(host, f"{node} ({host.destination}): {exc.stderr.splitlines()[0] if exc.stderr else exc}",
                           hint="is the host overloaded or the link down? `labctl hosts check` tells") from None
        if result.returncode == 255:
            error = self.failure(node, result.stderr)
            if error is not None:
                raise error
        return result.returncode, result.stdout + result.stderr

    def execute(self, launch: Launch, on_output: Callable[[bytes], None]) -> int:
        host = self.host(launch.node)
        argv = [*resolve_argv(host, ["python"]), "-c", STOP_SCRIPT, "watch", f"{STOP_GRACE_S:g}",
                *resolve_argv(host, launch.argv)]
        env = {"PYTHONUNBUFFERED": "1", **host.env, **launch.env}
        if self.packages and host.env.get("PYTHONPATH") and "PYTHONPATH" not in launch.env:
            # the inventory's PYTHONPATH would replace the env file's, which puts the packages first
            env["PYTHONPATH"] = f"{self.packages}{os.pathsep}{host.env['PYTHONPATH']}"
        command = remote_command(argv, workdir=launch.workdir or host.workspace,
                                 env_file=self.env_files.get(launch.node), env=env)
        ssh = self.argv(launch.node, command)
        log.debug("$ %s", shlex.join(ssh))
        # A session of its own: Ctrl-C goes to labctl alone, which stops every host in order.
        proc = subprocess.Popen(ssh, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        with self._lock:
            self._procs.append(proc)
        relay(proc, on_output)
        return proc.wait()

    holds_stdin = False  # each launch's stdin is its watchdog's (stop.py watch), never the launch's own

    def release(self, launch: Launch) -> None:
        """Nothing to close: a launch here ends with its run's stop."""

    def node_lost(self, node: str, exit_code: int) -> str | None:
        if exit_code != 255:
            return None
        try:
            self.run(node, ["true"], timeout_s=CONNECT_TIMEOUT_S + 5)
        except LabError as exc:
            return f"lost {node}: {exc.message}"
        return f"the SSH session to {node} ({self.address(node)}) ended with status 255 (the connection dropped)"

    def close(self) -> None:
        """End every session: closing stdin trips each host's watchdog; then wait, and kill what is left."""
        with self._lock:
            procs, self._procs = self._procs, []
        for proc in procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S + 5
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def relay(proc: subprocess.Popen, on_output: Callable[[bytes, int], None]) -> None:
    """Each chunk of the process's stdout and stderr, as it comes, with its stream (1, 2), until both end."""
    with selectors.DefaultSelector() as streams:
        streams.register(proc.stdout, selectors.EVENT_READ, 1)
        streams.register(proc.stderr, selectors.EVENT_READ, 2)
        while streams.get_map():
            for key, _ in streams.select():
                chunk = os.read(key.fd, 65536)
                if chunk:
                    on_output(chunk, key.data)
                else:
                    streams.unregister(key.fileobj)
                    key.fileobj.close()
