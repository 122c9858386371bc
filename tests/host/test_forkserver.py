"""labctl/remote/worker.py and forkserver.py, run here as a node runs them: `python -c TEXT ...` on
this machine's Python and torch, a real server process on a socket under tmp_path, real workers.

What a worker sees is checked against plain `python SCRIPT` with the same environment and working
directory, key by key. The server preloads what `up` has a node's server preload
(labctl.run.warm.PRELOAD) once for the module (a few seconds); a few tests also need a cold `python`
that imports torch (the reference for ATEN_CPU_CAPABILITY, MKL_CBWR and thread counts), and one runs
a gloo script 50 times: those take seconds, the rest well under one.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from labctl import remote
from labctl.remote import stop
from labctl.run.warm import PRELOAD

FORKSERVER, WORKER, CHILD = remote.load("forkserver.py"), remote.load("worker.py"), remote.load("forkchild.py")
# Only a stuck test waits this long. `make test` runs these at idle priority beside the `alone` lab tests,
# where a cold import of torch and torch._dynamo once took more than 60 s (2026-12-02, a 2-core EPYC);
# two such waits in a row stay inside pytest's 300 s per test.
TIMEOUT_S = 150
READY = re.compile(r"DDPLAB_FORKSERVER_READY pid=(\d+) threads=(\d+) preloaded=(\S+) missing=(\S+)\n")

PROBE = """
import json, os, signal, sys
names = ("SIGINT", "SIGTERM", "SIGHUP", "SIGPIPE", "SIGQUIT", "SIGCHLD", "SIGUSR1")
mask = os.umask(0)
os.umask(mask)
spec = globals().get("__spec__")
print(json.dumps({
    "argv": sys.argv, "file": __file__, "name": __name__, "path": sys.path, "cwd": os.getcwd(),
    "env": dict(os.environ), "globals": sorted(globals()), "orig_argv": sys.orig_argv[1:],
    "main": sys.modules["__main__"].__dict__ is globals(), "spec": spec and spec.name,
    "package": __package__, "loader": type(__loader__).__name__, "bytecode": sys.dont_write_bytecode,
    "stdio": [(s.name, s.encoding, s.errors, s.line_buffering, s.write_through, s.mode, type(s.buffer).__name__)
              for s in (sys.stdin, sys.stdout, sys.stderr)],
    "signals": {n: repr(signal.getsignal(getattr(signal, n))) for n in names},
    "blocked": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])), "umask": mask, "warnoptions": sys.warnoptions,
}))
"""

# The server's preload, then what torch and OpenBLAS were told by the environment.
HEAVY_PROBE = """
import ctypes, hashlib, importlib, json, pkgutil, warnings
import torch, torch.distributed, torch._dynamo, numpy, trainer
for sub in sorted(m.name for m in pkgutil.iter_modules(trainer.__path__)):
    if sub != "__main__":
        importlib.import_module("trainer." + sub)
lib = [l.split()[-1] for l in open("/proc/self/maps") if "openblas" in l.rsplit("/", 1)[-1]][0]
get = [getattr(ctypes.CDLL(lib), n) for n in ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_")
       if hasattr(ctypes.CDLL(lib), n)][0]
g = torch.Generator().manual_seed(0)
a, b = torch.randn(257, 1031, generator=g), torch.randn(1031, 263, generator=g)
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
                  "matmul": hashlib.sha1((a @ b).numpy().tobytes()).hexdigest(),
                  "blas": get(), "filters": [repr(f) for f in warnings.filters]}))
"""


def start_server(path, preload=(), env=None, ignore=(), later=()):
    """A server as `up` would start one, here as a background job of a shell (SIGINT, SIGQUIT ignored)."""
    def pre():
        for sig in ignore:
            signal.signal(sig, signal.SIG_IGN)
    modules = [*preload, "--", *later] if later else list(preload)
    proc = subprocess.Popen([sys.executable, "-c", FORKSERVER, "serve", str(path), WORKER, CHILD, *modules],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=env, preexec_fn=pre)
    proc.ready = proc.stdout.readline()
    return proc


def end(proc):
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sock = tmp_path_factory.mktemp("fs") / "ddplab" / "fork.sock"
    proc = start_server(sock, preload=PRELOAD, ignore=(signal.SIGINT, signal.SIGQUIT))
    proc.sock, proc.registry = str(sock), str(sock.parent / "workers")
    yield proc
    end(proc)


def request(server, args, **kw):
    return [sys.executable, "-c", FORKSERVER, "request", server.sock if hasattr(server, "sock") else str(server),
            "--", *args]


def both(server, args, *, env=None, cwd=None, direct=True, **kw):
    """(cold `python ARGS`, the fork server's worker, `python -c WORKER ARGS` if direct): finished processes."""
    kw = dict(capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=cwd, stdin=subprocess.DEVNULL, **kw)
    return (subprocess.run([sys.executable, *args], **kw), subprocess.run(request(server, args), **kw),
            subprocess.run([sys.executable, "-c", WORKER, *args], **kw) if direct else None)


def write(path, text):
    path.write_text(text)
    return path


# -------------------------------------------------------------------------------------- server


def test_the_server_says_ready_after_the_preload_with_one_thread(server):
    pid, threads, preloaded, missing = READY.fullmatch(server.ready).groups()
    assert (threads, preloaded, missing) == ("1", ",".join(PRELOAD), "-")
    assert os.listdir(f"/proc/{pid}/task") == [pid]  # and still one: no OpenMP or OpenBLAS pool
    assert oct(os.stat(os.path.dirname(server.sock)).st_mode & 0o777) == "0o700"


def test_a_later_module_is_imported_once_the_server_is_idle_and_workers_find_it(tmp_path):
    """LATER (torch._dynamo in a node) is not in the READY line's preload; forked workers have it once
    the server, idle, has imported it. Here with two of the standard library's, for speed."""
    sock = tmp_path / "ddplab" / "fork.sock"
    proc = start_server(sock, preload=["json"], later=["decimal", "fractions"])
    try:
        assert READY.fullmatch(proc.ready).group(3) == "json"
        script = write(tmp_path / "has.py", "import sys; print(all(m in sys.modules for m in ('decimal', 'fractions')))")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            found = subprocess.run(request(sock, [str(script)]), capture_output=True, text=True, timeout=TIMEOUT_S)
            assert found.returncode == 0, found.stderr
            if found.stdout.strip() == "True" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert found.stdout.strip() == "True"
    finally:
        end(proc)


def test_a_second_server_on_the_socket_refuses(server):
    second = start_server(server.sock, preload=["json"])
    assert second.wait(timeout=TIMEOUT_S) == 3 and second.ready.startswith("DDPLAB_FORKSERVER_RUNNING ")


def test_with_no_server_the_request_says_so_and_asks_for_a_cold_start(tmp_path):
    result = subprocess.run(request(tmp_path / "none.sock", ["x.py"]), capture_output=True, text=True,
                            timeout=TIMEOUT_S)
    assert result.returncode == 75 and result.stderr.startswith("DDPLAB_FORKSERVER_ABSENT ")


@pytest.mark.parametrize("why", ["absent", "refused"])
def test_given_the_worker_text_the_request_starts_the_script_cold_itself(server, tmp_path, why):
    """What labctl's warm launch does: `request SOCKET WORKER_TEXT -- ARGS`, one process either way."""
    script = write(tmp_path / "s.py", "import os, sys\nprint(sys.argv[1:], os.environ.get('PYTHONHASHSEED'))\n"
                   "sys.exit(5)\n")
    sock = tmp_path / "none.sock" if why == "absent" else server.sock
    env = {**os.environ, "PYTHONHASHSEED": "7"} if why == "refused" else None
    result = subprocess.run([sys.executable, "-c", FORKSERVER, "request", str(sock), WORKER, "--", str(script), "a"],
                            capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    assert (result.returncode, result.stdout) == (5, "['a'] %s\n" % ("7" if env else None))
    # No server at all (warm off, a real host) is the cold path itself, not worth a line; a refusal is.
    assert result.stderr == "" if why == "absent" else result.stderr.startswith("DDPLAB_FORKSERVER_REFUSED ")


def test_a_server_with_a_second_thread_refuses_to_fork(tmp_path):
    write(tmp_path / "busy.py", "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    noisy = start_server(tmp_path / "s" / "fork.sock", preload=["busy"], env={**os.environ, "PYTHONPATH": str(tmp_path)})
    try:
        assert READY.fullmatch(noisy.ready).group(2) == "2"
        result = subprocess.run(request(tmp_path / "s" / "fork.sock", [str(write(tmp_path / "a.py", "print(1)"))]),
                                capture_output=True, text=True, timeout=TIMEOUT_S)
        assert (result.returncode, result.stdout) == (75, "")
        assert re.fullmatch(r"DDPLAB_FORKSERVER_REFUSED the fork server has 2 threads.*\n", result.stderr)
    finally:
        end(noisy)


def test_a_setting_read_at_start_up_that_differs_is_refused(server, tmp_path):
    script = write(tmp_path / "a.py", "print(1)")
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    result = subprocess.run(request(server, [str(script)]), capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    assert result.returncode == 75 and result.stderr.startswith("DDPLAB_FORKSERVER_REFUSED PYTHONHASHSEED='123'")


def test_the_locale_is_compared_as_the_interpreter_takes_it(tmp_path):
    """An SSH session often has no LANG where `docker exec` had C.UTF-8: Python coerces the C locale
    to C.UTF-8 (PEP 538), so both start the same and the worker is forked; LC_ALL=C is not coerced."""
    script = write(tmp_path / "a.py", "import locale\nprint(locale.setlocale(locale.LC_CTYPE))")
    base = {k: v for k, v in os.environ.items() if k not in ("LANG", "LC_ALL", "LC_CTYPE", "PYTHONCOERCECLOCALE")}
    node = start_server(tmp_path / "s" / "fork.sock", preload=["json"], env={**base, "LANG": "C.UTF-8"})
    try:
        bare = subprocess.run(request(tmp_path / "s" / "fork.sock", [str(script)]), capture_output=True, text=True,
                              env=base, timeout=TIMEOUT_S)
        assert (bare.returncode, bare.stderr, bare.stdout) == (0, "", "C.UTF-8\n")
        strict = subprocess.run(request(tmp_path / "s" / "fork.sock", [str(script)]), capture_output=True,
                                text=True, env={**base, "LC_ALL": "C"}, timeout=TIMEOUT_S)
        assert strict.returncode == 75
        assert strict.stderr.startswith("DDPLAB_FORKSERVER_REFUSED the locale is C, and the fork server started in "
                                        "C.UTF-8")
    finally:
        end(node)


DESTROY = """
import gc, os, sys
import torch.distributed as dist
def gloo_threads():
    return sum(open("/proc/self/task/%s/comm" % t).read().strip() == "pt_gloo_runloop" for t in os.listdir("/proc/self/task"))
store = os.path.join(os.path.dirname(os.path.abspath(__file__)), "store-%d" % os.getpid())  # beside the script
dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
dist.barrier()
dist.destroy_process_group()
gc.collect()
print(gloo_threads(), dist.is_initialized(), dist.destroy_process_group.__name__, flush=True)
os._exit(0)
"""


def test_a_destroyed_process_group_is_kept_until_the_worker_leaves(server, tmp_path):
    """Its destructor, which can deadlock on the GIL when a DDP model's Reducer drops the last
    reference (worker.py), never runs in a worker: gloo's threads stay, idle, until os._exit. A plain
    `python` destroys the group at once: the test sees the difference, not a lucky run."""
    script = write(tmp_path / "destroy.py", DESTROY)
    cold, forked, direct = both(server, [str(script)])
    assert cold.stdout.split() == ["0", "False", "destroy_process_group"], cold.stderr
    for worker in (forked, direct):
        kept, *rest = worker.stdout.split()
        assert int(kept) >= 1 and rest == ["False", "destroy_process_group"], worker.stderr


# --------------------------------------------------------------------------- what a script sees


@pytest.mark.parametrize("extra", [{}, {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
                                        "PYTHONWARNINGS": "error::UserWarning,ignore"}])
def test_a_script_sees_what_plain_python_shows_it(server, tmp_path, extra):
    (tmp_path / "sub").mkdir()
    probe = write(tmp_path / "sub" / "probe.py", PROBE)
    os.symlink(probe, tmp_path / "link.py")  # sys.path[0] is the real script's folder
    env = {**os.environ, **extra, "PYTHONPATH": f"lib:{tmp_path}::/nonexistent", "DDPLAB_X": "y z"}
    for args in (["sub/probe.py", "a", "--b"], ["link.py"], [str(probe), "-m", "x"]):
        cold, forked, direct = [json.loads(r.stdout) for r in both(server, args, env=env, cwd=tmp_path)]
        for key in cold:
            assert forked[key] == cold[key], key
            assert direct[key] == cold[key] or key == "orig_argv", key  # direct: `python -c TEXT` shows


def test_a_module_runs_as_under_python_m(server, tmp_path):
    write(tmp_path / "probemod.py", PROBE)
    cold, forked, direct = [json.loads(r.stdout) for r in both(server, ["-m", "probemod", "1"], cwd=tmp_path)]
    assert cold["argv"] == [str(tmp_path / "probemod.py"), "1"] and cold["path"][0] == str(tmp_path)
    for key in cold:
        assert forked[key] == cold[key], key
        assert direct[key] == cold[key] or key == "orig_argv", key


def test_a_worker_inherits_what_the_request_ignores_and_not_what_the_server_did(server, tmp_path):
    """The server runs with SIGINT and SIGQUIT ignored; this request ignores SIGHUP and blocks SIGUSR2."""
    probe = write(tmp_path / "probe.py", PROBE)

    def pre():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
        os.umask(0o027)
    cold, forked, _ = [json.loads(r.stdout) for r in both(server, [str(probe)], preexec_fn=pre)]
    assert forked["signals"] == cold["signals"] and forked["blocked"] == cold["blocked"] == [signal.SIGUSR2]
    assert cold["signals"]["SIGHUP"] == repr(signal.SIG_IGN) and forked["umask"] == 0o027


def test_each_worker_draws_its_own_random_numbers(server, tmp_path):
    """A new process seeds random, numpy's and torch's generators from the OS: so does each worker."""
    script = write(tmp_path / "r.py", "import random, numpy, torch\n"
                   "print(random.random(), numpy.random.rand(), torch.rand(1).item(), torch.initial_seed())\n")
    draws = [subprocess.run(request(server, [str(script)]), capture_output=True, text=True, timeout=TIMEOUT_S).stdout
             for _ in range(2)]
    assert all(len(d.split()) == 4 for d in draws), draws
    assert all(a != b for a, b in zip(*(d.split() for d in draws))), draws


# ------------------------------------------------------------------------------ exit statuses

STATUS = {"return": ("print('out')", 0), "exit3": ("import sys; sys.exit(3)", 3),
          "message": ("import sys; sys.exit('gave up')", 1), "raise": ("def f():\n    raise ValueError('bad')\nf()", 1),
          "interrupt": ("raise KeyboardInterrupt", -signal.SIGINT), "abort": ("import os; os.abort()", -signal.SIGABRT),
          "syntax": ("x = (", 1), "missing": (None, 2)}


@pytest.mark.parametrize("case", STATUS)
def test_the_status_and_the_output_are_plain_pythons(server, tmp_path, case):
    text, status = STATUS[case]
    script = tmp_path / "s.py"
    if text is not None:
        write(script, text + "\n")
    cold, forked, direct = both(server, [str(script)], cwd=tmp_path)
    for result in (cold, forked, direct):
        assert (result.returncode, result.stdout) == (status, "out\n" if case == "return" else "")
    assert forked.stderr == direct.stderr == cold.stderr  # the traceback, the message: word for word


def test_threads_are_joined_and_atexit_runs_before_the_exit(server, tmp_path):
    script = write(tmp_path / "s.py", "import atexit, sys, threading, time\n"
                   "atexit.register(lambda: print('atexit', flush=True))\n"
                   "threading.Thread(target=lambda: (time.sleep(0.2), print('thread', flush=True))).start()\n"
                   "sys.exit(4)\n")
    for result in both(server, [str(script)]):
        assert (result.returncode, result.stdout) == (4, "thread\natexit\n")


def test_a_gloo_group_left_alive_still_exits_with_the_scripts_status(server, tmp_path):
    """The teardown race (exit 134 for a sys.exit(3)) is skipped on every run, not most."""
    script = write(tmp_path / "g.py", "import sys, torch, torch.distributed as dist\n"
                   "dist.init_process_group('gloo', store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)\n"
                   "dist.all_reduce(torch.ones(4))\nsys.exit(3)\n")
    codes = [subprocess.run(request(server, [str(script), str(tmp_path / f"store{i}")]), stdin=subprocess.DEVNULL,
                            timeout=TIMEOUT_S).returncode for i in range(50)]
    assert codes == [3] * 50


# ---------------------------------------------------------------------- signals and stopping


def started(tmp_path, server, text, env=None):
    """A request whose worker has started (it wrote its pid): (request, worker pid)."""
    pidfile = tmp_path / f"{uuid.uuid4().hex}.pid"
    # Short sleeps: a signal that lands between print() and a long sleep() waits for the sleep to end
    # (CPython checks for signals between bytecodes), more often right after a fork (copy-on-write faults).
    script = write(tmp_path / "w.py", "import os, sys, time\n" + text + "\nopen(sys.argv[1] + '.new', 'w').write("
                   "str(os.getpid()))\nos.rename(sys.argv[1] + '.new', sys.argv[1])\nprint('up', flush=True)\n"
                   "for _ in range(1200):\n    time.sleep(0.05)\n")
    proc = subprocess.Popen(request(server, [str(script), str(pidfile)]), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline() == "up\n"
    return proc, int(pidfile.read_text())


def gone(pid):
    deadline = time.monotonic() + TIMEOUT_S
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)
    return not os.path.exists(f"/proc/{pid}")


def test_sigterm_to_the_request_reaches_the_worker(server, tmp_path):
    proc, worker = started(tmp_path, server, "import signal\n"
                           "signal.signal(signal.SIGTERM, lambda *a: (print('got', a[0], flush=True), sys.exit(7)))")
    assert os.getpgid(worker) == worker  # its own process group
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=TIMEOUT_S) == 7 and proc.stdout.read() == "got 15\n"


def test_a_worker_killed_by_a_signal_kills_its_request_with_it(server, tmp_path):
    proc, worker = started(tmp_path, server, "")
    os.kill(worker, signal.SIGTERM)
    assert proc.wait(timeout=TIMEOUT_S) == -signal.SIGTERM


def test_a_request_killed_takes_its_worker_with_it(server, tmp_path):
    proc, worker = started(tmp_path, server, "")
    proc.kill()
    proc.wait()
    assert gone(worker)


def test_stop_finds_and_stops_forked_workers_by_run_id(server, tmp_path):
    run_id = f"test-{uuid.uuid4().hex[:12]}"
    proc, worker = started(tmp_path, server, "", env={**os.environ, stop.RUN_ID_VAR: run_id, "RANK": "3"})
    assert worker not in stop.environs(run_id)  # /proc/PID/environ shows the server's environment
    assert worker in stop.members(run_id, server.registry) and stop.live_ranks(run_id, server.registry) == [3]
    assert stop.registered(f"{run_id}x", server.registry) == {}
    result = subprocess.run([sys.executable, "-c", remote.load("stop.py"), "stop", run_id, "20", server.registry],
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.stdout.startswith("DDPLAB_STOP ranks=3 ") and proc.wait(timeout=TIMEOUT_S) == -signal.SIGTERM
    assert gone(worker) and not os.path.exists(os.path.join(server.registry, str(worker)))


# ------------------------------------------------------------- what torch read from the environment


@pytest.mark.parametrize("extra", [{"PYTHONWARNINGS": "error::UserWarning,ignore::FutureWarning"},
                                   {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}])
def test_torch_in_a_worker_follows_the_runs_environment(server, tmp_path, extra):
    probe = write(tmp_path / "heavy.py", HEAVY_PROBE)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    cold, forked, _ = both(server, [str(probe)], env={**env, **extra}, direct=False)
    assert cold.returncode == forked.returncode == 0, forked.stderr
    assert json.loads(forked.stdout) == json.loads(cold.stdout)
    if "ATEN_CPU_CAPABILITY" in extra:
        assert json.loads(forked.stdout)["capability"] == "DEFAULT" and json.loads(forked.stdout)["threads"] == 1
