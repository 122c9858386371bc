"""`labctl fault crash`: `python -c TEXT` in a node (labctl.net.faults). Linux only (/proc).

SIGKILLs every process of a labctl run that torchrun started as a worker: DDPLAB_RUN_ID and
LOCAL_RANK both in its environment. The agent, which has no LOCAL_RANK, sees its workers die and
restarts them or fails; the rendezvous store, which has no LOCAL_RANK either, stays up. Prints how
many processes it killed.
"""

import os
import signal

RUN_ID_VAR = "DDPLAB_RUN_ID"  # = labctl.run.launch.RUN_ID_VAR


def is_worker(env):
    """env: the NUL-separated entries of /proc/PID/environ."""
    run_id, rank = (RUN_ID_VAR + "=").encode(), b"LOCAL_RANK="
    return any(v.startswith(run_id) for v in env) and any(v.startswith(rank) for v in env)


def crash():
    """SIGKILL the workers; their pids."""
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (1, os.getpid()):
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if is_worker(env):
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
            except OSError:
                pass
    return killed


if __name__ == "__main__":
    print(len(crash()))
