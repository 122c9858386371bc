"""The fork server's plan, in this process: the modules `up` has a node's server preload and import
later (labctl.run.warm), and when the server, idle, imports a later one (labctl/remote/forkserver.py).
And the text labctl ships, its three files joined, run once here as a program with nothing to preload.
The server preloading torch and its workers run as real processes in tests/host/test_forkserver.py."""

import subprocess
import sys

import pytest

from labctl import remote
from labctl.run.warm import PRELOAD

CHILD, WORKER = remote.load("forkchild.py"), remote.load("worker.py")
TIMEOUT_S = 30  # for what takes well under a second; only a stuck test waits this long


def test_up_names_the_later_modules_after_the_preload_and_a_preloaded_one_is_not_later():
    from labctl.remote.forkserver import parse
    from labctl.run.warm import LATER, server_argv

    argv = server_argv(("lightning",))
    assert argv[argv.index(CHILD) + 1:] == [*PRELOAD, "lightning", "--", *LATER]
    served = parse(["serve", *argv[argv.index(CHILD) - 2:]])  # what the start script hands the server
    assert (served["preload"], served["later"]) == ([*PRELOAD, "lightning"], list(LATER))
    argv = server_argv(("torch._dynamo",))
    assert argv[argv.index(CHILD) + 1:] == [*PRELOAD, "torch._dynamo", "--"]


def test_a_lab_with_idle_imports_off_starts_servers_that_import_nothing_once_idle():
    from labctl.remote.forkserver import parse
    from labctl.run.warm import later_modules, server_argv

    argv = server_argv(("lightning",), idle_imports=False)
    assert argv[argv.index(CHILD) + 1:] == [*PRELOAD, "lightning", "--"]
    served = parse(["serve", *argv[argv.index(CHILD) - 2:]])
    assert (served["preload"], served["later"]) == ([*PRELOAD, "lightning"], [])
    assert later_modules((), idle_imports=False) == [] and later_modules(()) == ["torch._dynamo"]
    assert server_argv(idle_imports=False) != server_argv()  # another command line: `up` replaces the server


def test_the_first_later_import_waits_after_ready_and_once_more_after_the_first_worker(monkeypatch):
    """later_wait: a LATER import waits LATER_AFTER_S after READY, and again once the first worker has
    ended, so that a run right after `up` ends with the cores to itself; after that, idle means now."""
    from types import SimpleNamespace

    from labctl.remote import forkserver
    from labctl.remote.forkcommon import LATER_AFTER_S

    clock = [100.0]
    monkeypatch.setattr(forkserver, "time", SimpleNamespace(monotonic=lambda: clock[0]))  # the server's clock only
    server = forkserver.Server.__new__(forkserver.Server)  # its state, without a socket or a preload
    server.later, server.workers = ["torch._dynamo"], {}
    server.later_at, server.rearm, server.forked = clock[0] + LATER_AFTER_S, True, False
    assert server.later_wait() == pytest.approx(1.0)  # just READY, nothing forked yet
    server.workers, server.forked = {4242: None}, True  # a run came: nothing to import while it runs
    clock[0] += 0.4
    assert server.later_wait() is None
    server.workers = {}  # it ended at 100.4: the wait starts again from there
    assert server.later_wait() == pytest.approx(1.0)
    clock[0] += 0.6
    assert server.later_wait() == pytest.approx(0.4)
    clock[0] += 0.5
    assert server.later_wait() == 0.0
    server.workers = {4343: None}  # more runs: idle at once after them, no wait again
    clock[0] += 0.3
    server.workers = {}
    assert server.later_wait() == 0.0
    server.later = []
    assert server.later_wait() is None


def test_the_shipped_text_is_its_three_files_and_runs_with_no_labctl(tmp_path):
    """remote.load joins forkcommon.py, forkrequest.py and forkserver.py into the one program a node
    runs; run with no labctl to import (-I -S), both verbs work: no server, then a server that preloads
    nothing forking a request's worker, whose status the request leaves with."""
    from labctl.remote.forkcommon import ABSENT, COLD_START, READY

    text = remote.load("forkserver.py")
    assert text == "".join((remote.HERE / name).read_text() for name in remote.PARTS["forkserver.py"])
    assert remote.PARTS["forkserver.py"] == ("forkcommon.py", "forkrequest.py", "forkserver.py")
    python, sock = [sys.executable, "-I", "-S", "-c", text], str(tmp_path / "ddplab" / "fork.sock")
    run = dict(capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    absent = subprocess.run([*python, "request", sock, "--", "-c", "pass"], **run)
    assert absent.returncode == COLD_START and absent.stderr.startswith(ABSENT + " no fork server at " + sock)
    server = subprocess.Popen([*python, "serve", sock, WORKER, CHILD], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout.readline() == "%s pid=%d threads=1 preloaded=- missing=-\n" % (READY, server.pid)
        script = "import sys; print('forked'); sys.exit(7)"
        forked = subprocess.run([*python, "request", sock, "--", "-c", script], **run)
        assert (forked.returncode, forked.stdout, forked.stderr) == (7, "forked\n", "")
    finally:
        server.kill()
        server.wait()
