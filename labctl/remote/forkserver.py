"""A node's fork server: one process that has imported torch, forking a run's workers. Linux only.

  python -c TEXT serve SOCKET_PATH WORKER_TEXT CHILD_TEXT [PRELOAD...] [-- LATER...]    (`labctl up`)
  python -c TEXT request SOCKET_PATH [WORKER_TEXT] -- [-m MODULE | SCRIPT] ARGS...    (each worker)

Why: a cold `python` spends seconds importing torch, twice per node under torchrun, on every run.
serve imports it once (the PRELOAD modules: labctl.run.warm.PRELOAD), prints `READY pid=N threads=T
preloaded=A,B missing=C|-`, and then forks each request's worker: copy-on-write pages, no import.
The LATER modules it imports once it is idle (no request waiting, no worker running), one at a time:
what only some scripts need (torch._dynamo, for an optimizer) does not hold up the first run, which
imports it itself if it must, and the runs after it find it imported. The first of them waits until
LATER_AFTER_S after READY, and again after the first worker has ended: a run that comes at once after
`up` is forked before it and ends (labctl gathering its outcome) with the cores to itself.
WORKER_TEXT is worker.py's text: the child runs a script with it, as `python -c WORKER_TEXT SCRIPT`
would, once CHILD_TEXT (forkchild.py) has given it the request's world. One request at a time in
one loop: no threads. A request (forkrequest.py: the protocol, and the cold start) is answered with
the worker's pid, then its exit status or signal, or an error and nothing started.
If the request goes (SIGKILL, `docker exec` gone), the server SIGKILLs the worker's process group:
a dead man's switch, so nothing is left holding a port. So it does when the worker itself has ended:
what it left running in its session (a stray child) goes with it, so a run that ended leaves nothing.

Forking is only safe from a quiet parent: before each fork the server counts its threads and refuses
if there is more than one (or a process group is initialised); the preload must leave it so. A few
settings are read once, when a library or the interpreter starts (forkchild.py's LOAD_TIME): a request
whose value differs from the server's is refused rather than run in a world it did not ask for.

A forked worker's /proc/PID/environ shows the server's environment, so `stop` (stop.py) finds it
in the registry: REGISTRY under SOCKET_PATH's folder, one file per live worker named by its pid,
lines KEY=VALUE: the request's DDPLAB_RUN_ID, RANK and LOCAL_RANK where set, and START (the
worker's start time, field 22 of /proc/PID/stat), removed when the worker is reaped.

The program's text is forkcommon.py's (the constants and steps both sides share), forkrequest.py's,
then this file's (labctl.remote.load): forkcommon.py says how.
"""

import json
import os
import select
import signal
import socket
import sys
import time

if __name__ != "__main__":  # imported as a module; in the shipped text, the parts before this one define them
    from labctl.remote.forkcommon import (COLD_START, IMPORTED_LATER, LATER_AFTER_S, LOST_STATUS, READY, REGISTRY,
                                          RUN_ID_VAR, RUNNING, ignored_signals, kill_group, open_stdio, send)
    from labctl.remote.forkrequest import request


class Server:
    """The server of one node: listens at `path`, imports `preload`, and forks each request's worker."""

    def __init__(self, path, worker_text, child_text, preload, later=()):
        """Listen first (requests wait in the backlog), then import what it preloads: `up` need not wait."""
        open_stdio()
        self.path, self.env = path, dict(os.environ)
        self.ignored = ignored_signals()  # e.g. SIGINT and SIGQUIT under `sh -c 'serve &'`
        import types
        self.worker, self.forkchild = types.ModuleType("ddplab_worker"), types.ModuleType("ddplab_forkchild")
        exec(compile(worker_text, "worker.py", "exec"), self.worker.__dict__)  # one implementation, both ways
        exec(compile(child_text, "forkchild.py", "exec"), self.forkchild.__dict__)
        self.start = self.forkchild.snapshot()  # before the preload adds to sys.path or the filters
        self.workers = {}  # pid -> its request's connection, or None once the request has gone
        self.registry = os.path.join(os.path.dirname(os.path.abspath(path)), REGISTRY)
        self.listen()
        self.preloaded, self.missing = self.preload(preload)
        self.later = [name for name in later if name not in sys.modules]
        self.later_at, self.rearm, self.forked = 0.0, True, False  # later_wait's
        torch = sys.modules.get("torch")  # its thread count, as at import with no *_NUM_THREADS: no kernel
        self.start["torch_threads"] = torch.get_num_threads() if torch else None
        freeze()

    def listen(self):
        """Bind the socket, unless a live server answers there already (then say so and exit 3); the
        registry's entries of workers long gone are cleared."""
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(os.path.join(folder, REGISTRY), mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.path)
            print("%s a fork server already answers at %s" % (RUNNING, self.path), flush=True)
            sys.exit(3)
        except OSError:
            pass  # none: a stale socket of one that died, or nothing
        finally:
            probe.close()
        if os.path.exists(self.path):
            os.unlink(self.path)
        for name in os.listdir(os.path.join(folder, REGISTRY)):  # entries of workers long gone
            if not alive(os.path.join(folder, REGISTRY, name)):
                os.unlink(os.path.join(folder, REGISTRY, name))
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)  # requests wait in the backlog while we preload
        self.listener.listen(64)

    def preload(self, names):
        """Import them here, in the main thread, starting no thread pool: numpy's OpenBLAS would start one
        at import, and libgomp and MKL read their thread counts now (a worker is given the run's)."""
        import importlib
        held = {var: os.environ.pop(var, None) for var in self.forkchild.THREAD_VARS}
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        done, missing = [], []
        try:
            for name in names:
                try:
                    importlib.import_module(name)
                    done.append(name)
                except Exception as exc:
                    missing.append(name)
                    log("no %s (%s: %s)" % (name, type(exc).__name__, exc))
        finally:
            del os.environ["OPENBLAS_NUM_THREADS"]
            os.environ.update({var: value for var, value in held.items() if value is not None})
        return done, missing

    def import_later(self):
        """The next LATER module, imported as the preload's were, and frozen with them."""
        name, started = self.later.pop(0), time.monotonic()
        done, _ = self.preload([name])
        if done:
            log((IMPORTED_LATER + " (%.2f s)") % (name, time.monotonic() - started))
        freeze()

    def serve(self):
        """Say READY, then forever: reap ended workers, kill those whose request went, accept requests."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)  # SIGCHLD wakes the select
        signal.signal(signal.SIGCHLD, lambda sig, frame: None)
        self.own_fds = [wake_r, wake_w]
        self.later_at = time.monotonic() + LATER_AFTER_S
        print("%s pid=%d threads=%d preloaded=%s missing=%s" % (
            READY, os.getpid(), threads(), ",".join(self.preloaded) or "-", ",".join(self.missing) or "-"), flush=True)
        while True:
            self.reap()
            conns = [c for c in self.workers.values() if c is not None]
            idle = self.later_wait()
            readable = select.select([self.listener, wake_r] + conns, [], [], idle)[0]
            if not readable and self.later:
                self.import_later()
                continue
            if wake_r in readable:
                os.read(wake_r, 4096)
            for pid, conn in list(self.workers.items()):
                if conn in readable and not recv_some(conn):  # the request went: kill its worker
                    kill_group(pid)
                    conn.close()
                    self.workers[pid] = None
            if self.listener in readable:
                self.accept()

    def later_wait(self):
        """Seconds to wait for a request before the next LATER import; None: none to import now."""
        if not self.later or self.workers:
            return None
        now = time.monotonic()
        if self.rearm and self.forked:  # idle for the first time since a worker: it waits again
            self.later_at, self.rearm = max(self.later_at, now + LATER_AFTER_S), False
        return max(0.0, self.later_at - now)

    def reap(self):
        """Every ended worker: its group killed (what it left running), its registry entry removed, its
        status told to its request."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.workers.pop(pid, None)
            kill_group(pid)  # what the worker left running in its session ends with it: a run leaves nothing
            try:
                os.unlink(os.path.join(self.registry, str(pid)))
            except OSError:
                pass
            if conn is not None:
                code = os.waitstatus_to_exitcode(status)
                try:
                    send(conn, {"exit": code} if code >= 0 else {"signal": -code})
                except OSError:
                    pass
                conn.close()

    def accept(self):
        """One request: refused (with why), or its worker forked, registered and told its pid."""
        conn = self.listener.accept()[0]
        fds = []
        try:
            req, fds = receive(conn)
            why = self.refusal(req, fds)
            if why:
                log("refused: %s" % why)
                send(conn, {"error": why})
                conn.close()
                return
            pid = self.fork(conn, req, fds)
        except Exception as exc:  # a bad request must not end the server
            log("request failed: %s: %s" % (type(exc).__name__, exc))
            conn.close()
            return
        finally:
            for fd in fds:
                os.close(fd)
        self.workers[pid] = conn
        try:
            self.register(pid, req["env"])
            send(conn, {"pid": pid})
        except OSError as exc:  # the request went already, or no registry: no worker stop cannot find
            log("worker %d killed: %s" % (pid, exc))
            kill_group(pid)

    def fork(self, conn, req, fds):
        """Fork the request's worker (the child never returns from here); its pid."""
        for stream in (sys.stdout, sys.stderr):  # nothing of ours to be written twice
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        pid = os.fork()
        if pid == 0:
            self.child(conn, req, fds)
        self.forked = True
        return pid

    def refusal(self, req, fds):
        """Why this request must not be forked now, or None."""
        if not isinstance(req, dict) or not req.get("argv") or not isinstance(req.get("env"), dict) \
                or not isinstance(req.get("cwd"), str) or len(fds) != 3:
            return "a request is one JSON line with argv, env and cwd, sent with fds 0, 1 and 2"
        if threads() != 1:
            return ("the fork server has %d threads, and a child forked now could hang on a lock one of them "
                    "held; restart it" % threads())
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return "the fork server has a torch process group; restart it"
        changed = self.forkchild.load_time_change(req["env"], self.env)
        if changed:
            return changed
        if not os.path.isdir(req["cwd"]):
            return "no directory %s" % req["cwd"]
        return None

    def register(self, pid, env):
        """The registry's entry for worker `pid` (its run id, ranks and start time), written whole."""
        lines = ["%s=%s" % (k, env[k]) for k in (RUN_ID_VAR, "RANK", "LOCAL_RANK") if k in env]
        try:
            with open("/proc/%d/stat" % pid) as f:
                lines.append("START=" + f.read().rpartition(")")[2].split()[19])
        except OSError:
            pass
        entry = os.path.join(self.registry, str(pid))
        with open(entry + ".new", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.rename(entry + ".new", entry)  # stop never reads half an entry

    def child(self, conn, req, fds):
        """In the forked worker: become what `python` started by the request would be, and run."""
        try:
            signal.set_wakeup_fd(-1)
            for sock in [self.listener, conn] + [c for c in self.workers.values() if c is not None]:
                sock.close()
            for fd in self.own_fds:
                os.close(fd)
            self.forkchild.become(req, fds, self.ignored, self.start)
            self.worker.run_and_exit(req["argv"])
        except BaseException:
            import traceback
            traceback.print_exc()
        os._exit(LOST_STATUS)


def receive(conn):
    """(the request, its fds) from a new connection: one JSON line, sent at once with fds 0, 1, 2;
    None for what is not one line."""
    conn.settimeout(10)
    data, fds = socket.recv_fds(conn, 1 << 16, 3)[:2]
    while data and not data.endswith(b"\n"):
        more = conn.recv(1 << 16)
        data += more
        if not more:
            break
    return (json.loads(data) if data.endswith(b"\n") else None), fds


def freeze():
    """Collect, then freeze what is left: a worker's collections skip the preload's objects, so their
    pages stay shared."""
    import gc
    gc.collect()
    gc.freeze()


def threads():
    """This process's threads: forking is safe only from a process with one."""
    return len(os.listdir("/proc/self/task"))


def log(text):
    """The server's own notes, on its stderr; one that nobody reads any more must not end it."""
    try:
        sys.stderr.write("fork server: %s\n" % text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def recv_some(conn):
    """What the request sent (b"" once it has gone): a request's only word after its line is leaving."""
    try:
        return conn.recv(4096)
    except OSError:
        return b""


def alive(entry):
    """Is the worker of this registry entry still running (the same process, not a reused pid)?"""
    try:
        with open(entry) as f:
            start = dict(line.split("=", 1) for line in f.read().splitlines() if "=" in line).get("START")
        with open("/proc/%s/stat" % os.path.basename(entry)) as f:
            fields = f.read().rpartition(")")[2].split()
        return fields[0] != "Z" and start in (None, fields[19])
    except (OSError, ValueError):
        return False


USAGE = ("usage: serve SOCKET_PATH WORKER_TEXT CHILD_TEXT [PRELOAD...] [-- LATER...]\n"
         "       request SOCKET_PATH [WORKER_TEXT] -- [-m MODULE | SCRIPT] ARGS...")


def parse(args):
    """The command line by name: {"verb", "socket", "worker", "child", "preload", "later"} for serve, {"verb",
    "socket", "worker" (None: no cold start here), "argv"} for request; None where it is neither."""
    if len(args) >= 4 and args[0] == "serve":
        modules = args[4:]
        cut = modules.index("--") if "--" in modules else len(modules)
        return {"verb": "serve", "socket": args[1], "worker": args[2], "child": args[3],
                "preload": modules[:cut], "later": modules[cut + 1:]}
    if len(args) >= 4 and args[0] == "request" and "--" in args[2:4] and args.index("--", 2) < len(args) - 1:
        dashes = args.index("--", 2)
        return {"verb": "request", "socket": args[1], "worker": args[2] if dashes == 3 else None,
                "argv": args[dashes + 1:]}
    return None


def main(args):
    """serve, or request and leave as its worker did (started cold here where the server could not)."""
    command = parse(args)
    if command is None:
        sys.exit(USAGE)
    if command["verb"] == "serve":
        Server(command["socket"], command["worker"], command["child"], command["preload"], command["later"]).serve()
        return
    status = request(command["socket"], command["argv"], quiet_absent=command["worker"] is not None)
    sys.stderr.flush()
    if status == COLD_START and command["worker"] is not None:  # nothing started: start it cold, in this process
        os.execv(sys.executable, [getattr(sys, "orig_argv", [sys.executable])[0], "-c", command["worker"]]
                 + command["argv"])
    os._exit(status)


if __name__ == "__main__":
    main(sys.argv[1:])
