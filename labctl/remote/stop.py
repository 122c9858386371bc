"""Stop one run's processes on this node or host. Linux only (/proc), like the hosts a DDP job runs on.

  python -c TEXT stop RUN_ID GRACE_S        stop the run now (labctl.run.executor)
  python -c TEXT watch GRACE_S ARGV...      run ARGV as a child, and stop its run when stdin closes
                                            (labctl.hosts.ssh: every launch on a real host)

Before stopping anything, `stop` prints one line for labctl's report of the run:
`DDPLAB_STOP ranks=R,... oom_kills=N`: the RANK of each worker of the run still alive (a timeout
names them), and how many processes the out-of-memory killer has killed in this node's memory
cgroup (a worker's SIGKILL is then explained), or `-` where that count cannot be read.

Every process of a run carries DDPLAB_RUN_ID=RUN_ID in its environment, torchrun's workers
included, which torchrun starts in sessions of their own (so a process-group kill would miss
them). Stopping sends SIGTERM first, so torchrun can stop its workers, and SIGKILL to whatever is
left after GRACE_S seconds.

watch is a dead man's switch. labctl holds the SSH session's stdin open for the whole run and never
writes to it; when this reads end-of-file, labctl or the connection is gone (Ctrl-C, kill -9, a
dropped link), and every process of the run on this host is stopped (the run id is the one in
watch's own environment), so none is left holding the port. watch exits with the child's status
(128+N for a signal N), as a shell would.
"""

import os
import signal
import subprocess
import sys
import threading
import time

RUN_ID_VAR = "DDPLAB_RUN_ID"  # = labctl.run.launch.RUN_ID_VAR
REPORT = "DDPLAB_STOP"  # = labctl.run.executor.STOP_REPORT
# Where the memory cgroup counts its OOM kills: cgroup v2 (memory.events), v1 (memory.oom_control).
OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def environs(run_id):
    """{pid: environment entries} of the run's processes, other than init and this one."""
    marker = (RUN_ID_VAR + "=" + run_id).encode()
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (1, os.getpid()):
            try:
                with open("/proc/%s/environ" % entry, "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if marker in env:
                found[int(entry)] = env
    return found


def members(run_id):
    """Pids of the run's processes, other than init and this one."""
    return list(environs(run_id))


def live_ranks(run_id):
    """The RANK of each of the run's processes that has one (torchrun's workers, static ranks)."""
    ranks = set()
    for env in environs(run_id).values():
        for entry in env:
            if entry.startswith(b"RANK=") and entry[5:].isdigit():
                ranks.add(int(entry[5:]))
    return sorted(ranks)


def oom_kills():
    """Processes the OOM killer has killed in this node's memory cgroup, or None where unknown."""
    for path in OOM_COUNTERS:
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
    return None


def report(run_id):
    kills = oom_kills()
    return "%s ranks=%s oom_kills=%s" % (REPORT, ",".join(map(str, live_ranks(run_id))),
                                          "-" if kills is None else kills)


def signal_all(run_id, sig):
    for pid in members(run_id):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def stop_run(run_id, grace_s):
    signal_all(run_id, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while members(run_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    signal_all(run_id, signal.SIGKILL)


def watch(grace_s, argv):
    """Run argv under the dead man's switch on stdin; the exit status to leave with."""
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)  # the session's stdin is the watchdog's alone

    def on_close():
        # Raw reads of fd 0: a thread blocked in sys.stdin's buffered reader holds its lock, and the
        # interpreter aborts at exit (SIGABRT) when it finds it held.
        while os.read(0, 4096):
            pass
        if child.poll() is None:
            print("labctl: the SSH session closed; stopping this host's part of the run", flush=True)
            stop_run(os.environ[RUN_ID_VAR], grace_s)

    threading.Thread(target=on_close, daemon=True).start()
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "stop":
        print(report(sys.argv[2]), flush=True)
        stop_run(sys.argv[2], float(sys.argv[3]))
    elif mode == "watch":
        status = watch(float(sys.argv[2]), sys.argv[3:])
        sys.stdout.flush()
        os._exit(status)  # not sys.exit: the watcher may still be blocked in its read
    else:
        sys.exit("usage: stop RUN_ID GRACE_S | watch GRACE_S ARGV...")
