"""The fork server's request side (forkserver.py): what each worker's `python -c TEXT request ...` does.

  python -c TEXT request SOCKET_PATH [WORKER_TEXT] -- [-m MODULE | SCRIPT] ARGS...    (each worker)

request sends {"argv", "env", "cwd", "umask", "ignored", "blocked"} as one JSON line with its own
fds 0, 1, 2 (SCM_RIGHTS): the worker writes straight to the request's stdout and stderr (the
`docker exec` stream labctl reads). The server answers {"pid": N}, then {"exit": S} or {"signal": N},
or {"error": WHY} and nothing started. request exits with S, or dies by signal N (a shell says
128+N); SIGTERM, SIGINT and SIGHUP it forwards to the worker's process group. Exits COLD_START,
with ABSENT or REFUSED and why on stderr, when nothing of the run started: labctl starts it cold;
given WORKER_TEXT, request does so itself (forkserver.py's main), becoming `python -c WORKER_TEXT
ARGS` (exec, same pid), and then a node with no server at all (warm off, a real host) is not worth a
line: it says nothing. If the server goes while the worker runs, request kills the worker's process
group and exits LOST_STATUS, with LOST on stderr.

A part of the fork server's text, after forkcommon.py's (which says how the parts make one program).
"""

import json
import os
import signal
import socket
import sys

if __name__ != "__main__":  # imported as a module; in the shipped text, forkcommon.py's text defines them
    from labctl.remote.forkcommon import (ABSENT, COLD_START, FORWARDED, LOST, LOST_STATUS, REFUSED,
                                          ignored_signals, kill_group, open_stdio)


def request(path, argv, quiet_absent=False):
    """The client: the worker's exit status to leave with (or die by its signal). `quiet_absent`: no
    word where no server answers (the caller starts the run cold itself)."""
    open_stdio()
    ignored = ignored_signals()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        if not quiet_absent:
            sys.stderr.write("%s no fork server at %s (%s)\n" % (ABSENT, path, exc.strerror))
        return COLD_START
    client = Requester(path)
    for sig in FORWARDED:
        if sig not in ignored:
            signal.signal(sig, client.forward)
    send_world(sock, argv, ignored)
    return client.outcome(sock)


def send_world(sock, argv, ignored):
    """The request, one JSON line, with our fds 0, 1 and 2 (SCM_RIGHTS): what a worker needs of this
    process to be the one `python ARGV` would have been here, and the streams it writes to."""
    umask = os.umask(0o22)
    os.umask(umask)
    data = (json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "umask": umask,
                        "ignored": ignored, "blocked": [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])]})
            + "\n").encode()
    try:
        sent = socket.send_fds(sock, [data], [0, 1, 2])
        if sent < len(data):
            sock.sendall(data[sent:])
    except OSError:
        pass  # the server hung up: its reply, if any, says why


class Requester:
    """One request's client side: the worker's pid once the server names it, and the signals that
    came before it, forwarded then."""

    def __init__(self, path):
        self.path, self.pid, self.pending = path, None, []

    def forward(self, sig, frame=None):
        """A signal of ours (FORWARDED) to the worker's process group, or kept until there is one."""
        if self.pid is None:
            self.pending.append(sig)
            return
        try:
            os.killpg(self.pid, sig)
        except OSError:
            pass

    def outcome(self, sock):
        """Read the server's replies until the worker has ended: its status (or die by its signal)."""
        for line in sock.makefile("rb"):
            reply = json.loads(line)
            if "pid" in reply:
                self.pid = reply["pid"]
                for sig in self.pending:
                    self.forward(sig)
            elif "exit" in reply:
                return reply["exit"]
            elif "signal" in reply:
                die_by(reply["signal"])
            elif "error" in reply:
                sys.stderr.write("%s %s\n" % (REFUSED, reply["error"]))
                return COLD_START
        if self.pid is None:
            sys.stderr.write("%s the fork server at %s closed before starting anything\n" % (ABSENT, self.path))
            return COLD_START
        kill_group(self.pid)
        sys.stderr.write("%s the fork server went away while pid %d ran; it was killed\n" % (LOST, self.pid))
        return LOST_STATUS


def die_by(sig):
    """End as the worker did: by its signal, default action, no core dump of our own."""
    import resource
    sys.stderr.flush()
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default is to be ignored (SIGCHLD, SIGWINCH)
