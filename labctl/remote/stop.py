"""Stop one run's processes on this node or host. Linux only (/proc), like the hosts a DDP job runs on.

  python -c TEXT stop RUN_ID GRACE_S [REGISTRY_DIR]   stop the run now (labctl.run.executor)
  python -c TEXT watch GRACE_S ARGV...                run ARGV as a child, and stop its run when stdin
                                                      closes (labctl.hosts.ssh: every launch on a real host)

Before stopping anything, `stop` prints one line for labctl's report of the run:
`DDPLAB_STOP ranks=R,... oom_kills=N`: the RANK of each worker of the run still alive (a timeout
names them), and how many processes the out-of-memory killer has killed in this node's memory
cgroup (a worker's SIGKILL is then explained), or `-` where that count cannot be read.

Every process of a run carries DDPLAB_RUN_ID=RUN_ID in its environment, torchrun's workers
included, which torchrun starts in sessions of their own (so a process-group kill would miss
them). Stopping sends SIGTERM first, so torchrun can stop its workers, and SIGKILL to whatever is
left after GRACE_S seconds.

A worker the node's fork server forked (forkserver.py) shows the server's environment in
/proc/PID/environ, not the run's: the server lists each live one in its registry, REGISTRY_DIR/PID
with lines KEY=VALUE (DDPLAB_RUN_ID, RANK, START: its start time, so a reused pid is not taken for
it). Those count as the run's too, and stopping one signals its process group (it has a session of
its own: its children go with it). `stop RUN_ID GRACE_S REGISTRY_DIR` reads another registry.

watch is a dead man's switch. labctl holds the SSH session's stdin open for the whole run and never
writes to it; when this reads end-of-file, labctl or the connection is gone (Ctrl-C, kill -9, a
dropped link), and every process of the run on this host is stopped (the run id is the one in
watch's own environment), so none is left holding the port. watch exits with the child's status
(128+N for a signal N), as a shell would, and never before the stop it began has ended.

watch is also the reaper of what its child leaves: torchrun's workers lead sessions of their own, so
where torchrun dies first (its output gone with the session), they would go on under init. watch
adopts them (PR_SET_CHILD_SUBREAPER) and, once its child has exited, stops every process of its own
left alive: its descendants only, never a sibling rank of the same run on this host (the static
launcher starts one watch per rank). No stop signals a watchdog (is_watchdog): each leaves once its
job has, so two on one host never stop each other halfway through their stops.
"""

import ctypes
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
REGISTRY_DIR = "/tmp/ddplab/workers"  # = forkcommon.py's SOCKET_PATH's folder + REGISTRY
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
WATCHDOG_TEXT = ('"""' + __doc__.partition("\n")[0]).encode()  # how this file's text begins, as a watchdog's argv has it


def is_watchdog(pid):
    """Whether pid is a watchdog (`python -c THIS_FILE watch ...`). A stop never signals one: it leaves
    by itself once its job has, with the job's status. Two on one host (a run's store and its agent,
    or two static ranks) each stopped the other, each by SIGTERM before its own SIGKILL could come,
    and the run's later pids were never signalled: c10d's store and a worker left on the host."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    return len(args) > 3 and args[1] == b"-c" and args[2].startswith(WATCHDOG_TEXT) and args[3] == b"watch"


def environs(run_id):
    """{pid: environment entries} of the run's processes, other than init, this one and watchdogs."""
    marker = (RUN_ID_VAR + "=" + run_id).encode()
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (1, os.getpid()):
            try:
                with open("/proc/%s/environ" % entry, "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if marker in env and not is_watchdog(int(entry)):
                found[int(entry)] = env
    return found


def registered(run_id, registry=REGISTRY_DIR):
    """{pid: entries} of the fork server's live workers of the run, as environs() gives them."""
    marker = (RUN_ID_VAR + "=" + run_id).encode()
    found = {}
    try:
        names = os.listdir(registry)
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(registry, name), "rb") as f:
                entries = f.read().splitlines()
            with open("/proc/%s/stat" % name, "rb") as f:
                state = f.read().rpartition(b")")[2].split()
        except OSError:
            continue  # gone, or a half-written entry (name.new)
        start = [e[6:] for e in entries if e.startswith(b"START=")]
        if marker in entries and state[0] != b"Z" and start in ([], [state[19]]):
            found[int(name)] = entries
    return found


def members(run_id, registry=REGISTRY_DIR):
    """Pids of the run's processes, other than init and this one; forked workers included."""
    return list(environs(run_id)) + [pid for pid in registered(run_id, registry) if pid != os.getpid()]


def live_ranks(run_id, registry=REGISTRY_DIR):
    """The RANK of each of the run's processes that has one (torchrun's workers, static ranks)."""
    ranks = set()
    for env in list(environs(run_id).values()) + list(registered(run_id, registry).values()):
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


def report(run_id, registry=REGISTRY_DIR):
    kills = oom_kills()
    return "%s ranks=%s oom_kills=%s" % (REPORT, ",".join(map(str, live_ranks(run_id, registry))),
                                          "-" if kills is None else kills)


def signal_all(run_id, sig, registry=REGISTRY_DIR):
    for pid in environs(run_id):
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    for pid in registered(run_id, registry):
        try:
            os.killpg(pid, sig)  # the forked worker leads its own process group
        except OSError:
            pass


def terminate(send, alive, grace_s):
    """send(SIGTERM), then send(SIGKILL) once nothing is alive() or grace_s has passed."""
    send(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    send(signal.SIGKILL)


def stop_run(run_id, grace_s, registry=REGISTRY_DIR):
    terminate(lambda sig: signal_all(run_id, sig, registry), lambda: members(run_id, registry), grace_s)


def say(line):
    """Print a line, if anyone can still read it."""
    try:
        print(line, flush=True)
    except OSError:
        pass


def adopt_orphans():
    """Become the subreaper of this process's descendants: an orphan among them is reparented here."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no prctl: orphans go to init, as before


def own_children():
    """Pids of this process's live children (orphans it adopted included); the dead are reaped."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % entry, "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != b"Z":
            found.append(int(entry))
    return found


def signal_children(sig):
    for pid in own_children():
        for kill in (os.killpg, os.kill):  # a worker leads its own group; anything else, alone
            try:
                kill(pid, sig)
                break
            except OSError:
                pass


def stop_children(grace_s):
    """Stop what the child left behind: SIGTERM to each one's process group, SIGKILL after grace_s."""
    terminate(signal_children, own_children, grace_s)


def watch(grace_s, argv):
    """Run argv under the dead man's switch on stdin; the exit status to leave with."""
    adopt_orphans()
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)  # the session's stdin is the watchdog's alone
    stopping, stopped = threading.Event(), threading.Event()

    def on_close():
        # Raw reads of fd 0: a thread blocked in sys.stdin's buffered reader holds its lock, and the
        # interpreter aborts at exit (SIGABRT) when it finds it held. An error reads as the end too.
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        stopping.set()
        if child.poll() is None:
            # Where labctl was killed, its ssh client may have died too, and the session's output with
            # it: the note then cannot be written (EPIPE), and the run must be stopped all the same.
            say("labctl: the SSH session closed; stopping this host's part of the run")
            stop_run(os.environ[RUN_ID_VAR], grace_s)
        stopped.set()

    threading.Thread(target=on_close, daemon=True).start()
    code = child.wait()
    if stopping.is_set():
        stopped.wait()  # torchrun leaves at the SIGTERM; a worker that outlasts it gets the SIGKILL
    stop_children(grace_s)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "stop":
        registry = sys.argv[4] if len(sys.argv) > 4 else REGISTRY_DIR
        print(report(sys.argv[2], registry), flush=True)
        stop_run(sys.argv[2], float(sys.argv[3]), registry)
    elif mode == "report":  # the ranks alive now, before any node is stopped (a timed-out run)
        print(report(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else REGISTRY_DIR), flush=True)
    elif mode == "watch":
        status = watch(float(sys.argv[2]), sys.argv[3:])
        try:
            sys.stdout.flush()
        except OSError:  # the session's output is gone (see on_close)
            pass
        os._exit(status)  # not sys.exit: the watcher may still be blocked in its read
    else:
        sys.exit("usage: stop RUN_ID GRACE_S [REGISTRY_DIR] | report RUN_ID [REGISTRY_DIR] | watch GRACE_S ARGV...")
