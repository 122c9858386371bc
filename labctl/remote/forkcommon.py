"""The fork server's (forkserver.py) pieces that both its sides use: its words, exit statuses and
places, the JSON line of a reply, and what the server and a request both do first (stdio, signals)
and last (a worker's process group killed).

The fork server is one program, shipped as one text: this file's, forkrequest.py's (the request
side) and forkserver.py's (the server side, and the command line of both), one after another
(labctl.remote.PARTS; `python -c TEXT serve ...` and `python -c TEXT request ...`). So these names
are defined once, here, and the files after it use them as their own. Each of those files also
imports them from here under `if __name__ != "__main__":`: that runs where the file is imported as a
module (the tests), and never in the shipped text, where `__name__` is "__main__". The standard
library only, like every program here (labctl/remote/__init__.py).
"""

import json
import os
import signal

READY = "DDPLAB_FORKSERVER_READY"
ABSENT = "DDPLAB_FORKSERVER_ABSENT"  # request: no server answers at SOCKET_PATH
REFUSED = "DDPLAB_FORKSERVER_REFUSED"  # request: the server would not fork this one; why follows
LOST = "DDPLAB_FORKSERVER_LOST"  # request: the server went away while the worker ran
RUNNING = "DDPLAB_FORKSERVER_RUNNING"  # serve: another server answers at SOCKET_PATH
COLD_START = 75  # EX_TEMPFAIL: nothing of the run started here; start it the cold way
LOST_STATUS = 70  # EX_SOFTWARE: the worker was killed with its server connection
RUN_ID_VAR = "DDPLAB_RUN_ID"  # = labctl.run.launch.RUN_ID_VAR
IMPORTED_LATER = "imported %s while idle"  # its log line for each LATER module: = labctl.run.warm.IMPORTED_LATER
SOCKET_PATH = "/tmp/ddplab/fork.sock"  # in a node
REGISTRY = "workers"  # next to the socket: /tmp/ddplab/workers = stop.py's REGISTRY_DIR
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
LATER_AFTER_S = 1.0  # forkserver.py: the first LATER import waits this long after READY and after the first run


def ignored_signals():
    """Signals this process was started with ignored (Python itself ignores SIGPIPE and SIGXFSZ)."""
    return [int(s) for s in signal.valid_signals() if s not in (signal.SIGPIPE, signal.SIGXFSZ)
            and signal.getsignal(s) == signal.SIG_IGN]


def open_stdio():
    """A closed fd 0, 1 or 2 becomes /dev/null, so no socket or received fd takes its number."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)


def send(conn, message):
    """One JSON line to the other end."""
    conn.sendall((json.dumps(message) + "\n").encode())


def kill_group(pid):
    """SIGKILL to the process group of `pid` (a worker leads its own), whatever is left of it."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
