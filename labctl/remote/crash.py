"""`labctl fault crash`: `python -c TEXT` in a node (labctl.net.faults). Linux only (/proc).

SIGKILLs every process of a labctl run that torchrun started as a worker: DDPLAB_RUN_ID and
LOCAL_RANK both in its environment. The agent, which has no LOCAL_RANK, sees its workers die and
restarts them or fails; the rendezvous store, which has no LOCAL_RANK either, stays up. A worker the
node's fork server forked shows the server's environment, so the server's registry names it
(REGISTRY_DIR/PID, with the run's LOCAL_RANK): it is killed too, with its request. Prints how many
processes it killed.
"""

import os
import signal

RUN_ID_VAR = "DDPLAB_RUN_ID"  # = labctl.run.launch.RUN_ID_VAR
REGISTRY_DIR = "/tmp/ddplab/workers"  # = stop.py's: the fork server's live workers


def is_worker(env):
    """env: the NUL-separated entries of /proc/PID/environ."""
    run_id, rank = (RUN_ID_VAR + "=").encode(), b"LOCAL_RANK="
    return any(v.startswith(run_id) for v in env) and any(v.startswith(rank) for v in env)


def registered_workers():
    """Pids of the fork server's live workers that are a run's workers (LOCAL_RANK in their entry)."""
    try:
        names = os.listdir(REGISTRY_DIR)
    except OSError:
        return []
    pids = []
    for name in names:
        try:
            with open(os.path.join(REGISTRY_DIR, name), "rb") as f:
                entries = f.read().split(b"\n")
        except OSError:
            continue
        if name.isdigit() and is_worker(entries) and os.path.exists("/proc/%s" % name):
            pids.append(int(name))
    return pids


def crash():
    """SIGKILL the workers; their pids."""
    killed = []
    for pid in registered_workers():
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
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
