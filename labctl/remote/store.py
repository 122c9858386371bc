"""The run's rendezvous store: `python -c TEXT PORT`, on node0 for the whole run (labctl.run.launch).

Why not torchrun's is_host=true on node0: that agent owns the store and exits as soon as its own
workers finish; agents still shutting down on other nodes then cannot reach the store and print
"failed to shutdown the rendezvous ... RendezvousConnectionError" with a C++ stack, after a run
that succeeded. A store that outlives every agent closes the rendezvous cleanly.

Prints `DDPLAB_STORE_READY PORT` once it listens, then sleeps until it is stopped with the rest of
the run (it carries the run's DDPLAB_RUN_ID). Prints `DDPLAB_STORE_FAILED WHY` and exits 3 when it
cannot listen. Needs the node's torch.

`python -c TEXT PORT --until-eof`: it also ends, status 0, when its stdin reaches end-of-file. labctl
holds the stdin of the warm path's store and closes it when a run has ended cleanly: the store goes
with no `stop` to run on the node; and if labctl itself goes (kill -9), the store goes with it.
"""

import datetime
import sys
import time

STORE_READY = "DDPLAB_STORE_READY"  # = labctl.run.launch.STORE_READY
STORE_FAILED = "DDPLAB_STORE_FAILED"  # = labctl.run.launch.STORE_FAILED

if __name__ == "__main__":
    from torch.distributed import TCPStore

    port = int(sys.argv[1])
    try:
        store = TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=60))
    except Exception as exc:
        print(STORE_FAILED, str(exc).splitlines()[0], flush=True)
        sys.exit(3)
    print(STORE_READY, port, flush=True)
    if "--until-eof" in sys.argv[2:]:
        while sys.stdin.buffer.read(4096):
            pass
        sys.exit(0)
    while True:
        time.sleep(3600)
