"""Is the rendezvous port still free on node0? `python -c TEXT PORT` (labctl.run.executor).

Something may already listen there: a run left over from a Ctrl-C elsewhere, or a user's own
torchrun. Exits 0, silent, when the port can be bound; otherwise prints why (the OS's strerror,
e.g. "Address already in use") and exits 3. Cheap: no torch import.
"""

import socket
import sys


def check(port):
    """Bind 0.0.0.0:port with SO_REUSEADDR, as the store will: the exit status, 0 or 3."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
    except OSError as exc:
        print(exc.strerror)
        return 3
    finally:
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(check(int(sys.argv[1])))
