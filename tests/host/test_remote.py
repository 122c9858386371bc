"""The run's rendezvous store (labctl/remote/store.py) run here as labctl runs it on node0: `python -c
TEXT PORT`, on this machine's Python and torch, on a free port and on one something holds. The other
programs labctl ships run in tests/unit/test_remote.py, whose helpers these are."""

import socket
import subprocess
import sys
import threading

from test_remote import TIMEOUT_S, alive, free_port, held_port  # noqa: F401 (held_port: a fixture)

from labctl.run import launch


def test_the_store_says_when_it_listens_and_when_it_cannot(held_port):  # noqa: F811 (the fixture)
    """Both at once: each imports torch, which takes seconds."""
    port = free_port()
    stores = [subprocess.Popen([sys.executable, "-c", launch.STORE_SCRIPT, str(p)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for p in (port, held_port)]
    lines = [[], []]
    readers = [threading.Thread(target=lambda i=i: lines[i].append(stores[i].stdout.readline()), daemon=True)
               for i in range(2)]
    try:
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(60)
        assert lines[0] == [f"{launch.STORE_READY} {port}\n"], stores[0].stderr
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        assert alive(stores[0])  # it stays up for the run
        assert lines[1][0].startswith(f"{launch.STORE_FAILED} ") and len(lines[1][0].splitlines()) == 1
        assert stores[1].wait(timeout=TIMEOUT_S) == 3
    finally:
        for store in stores:
            store.kill()
            store.wait()
