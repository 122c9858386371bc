"""The programs labctl ships into nodes and hosts (labctl/remote/), run here as labctl runs them there:
`python -c TEXT ARGS...` and `sh -c TEXT sh ARGS...`, on this machine's Python and sh, against real
local processes, files and sockets. No Docker.

Some go through `LocalHost`, an SSHHosts whose "ssh" is a local `sh -c`: the very command line
labctl sends a host (quoting, cd, env, the Python it names), run by a real shell here.

The run's store, which needs torch (seconds to import), listens in tests/host/test_remote.py.
"""

import ast
import contextlib
import importlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from importlib.metadata import version

import pytest

from labctl import remote
from labctl.diagnose import doctor
from labctl.errors import LabError
from labctl.hosts import ssh
from labctl.hosts.inventory import Host, Inventory
from labctl.net import faults
from labctl.run import executor, launch, warm
from labctl.run.launch import RUN_ID_VAR, Launch

SCRIPTS = sorted(p for p in remote.HERE.iterdir() if p.suffix in (".py", ".sh") and p.name != "__init__.py")
TIMEOUT_S = 30  # for anything that should take well under a second; only a stuck test waits this long


# ------------------------------------------------------------------------------------ helpers


def run_py(name: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", remote.load(name), *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, **kw)


def new_run_id() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def spawn():
    """Start `sleep 600` with extra environment; every one left is killed after the test."""
    procs = []

    def start(env: dict[str, str], ignore_term: bool = False) -> subprocess.Popen:
        # An ignored signal stays ignored across exec: the child ignores SIGTERM from its first instruction.
        pre = (lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN)) if ignore_term else None
        proc = subprocess.Popen(["sleep", "600"], env={**os.environ, **env}, preexec_fn=pre)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


class LocalHost(ssh.SSHHosts):
    """An SSH host that is this machine: the remote command line runs in a local `sh -c`."""

    def argv(self, node: str, command: str) -> list[str]:
        return ["sh", "-c", command]


@pytest.fixture
def host(tmp_path):
    me = Host(name="node0", address="127.0.0.1", iface="lo", python=sys.executable, workspace=str(tmp_path / "ws"))
    (tmp_path / "ws").mkdir()
    hosts = LocalHost(Inventory(path=tmp_path / "hosts.toml", name="t", master_port=29500, hosts=(me,)))
    yield hosts
    hosts.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def held_port():
    """A port something listens on, on every address (as a leftover store would)."""
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen(8)
    yield s.getsockname()[1]
    s.close()


# ------------------------------------------------------------------------ the files themselves


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_script_parses_as_what_runs_it(path):
    """Python for the node's 3.9 or newer (the grammar of 3.9), sh for any POSIX shell's parser."""
    text = path.read_text()
    if path.suffix == ".py":
        compile(text, str(path), "exec")
        ast.parse(text, str(path), feature_version=(3, 9))
    else:
        result = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def imported_as_a_module(tree: ast.Module) -> tuple[ast.Module, set[str]]:
    """(the tree less its `if __name__ != "__main__":` blocks, what those import): the imports a part
    of a program (remote.PARTS) makes only where it is imported as a module, never in the shipped text."""
    guard = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ != '__main__'"]
    parts = {node.module if isinstance(node, ast.ImportFrom) else alias.name for block in guard
             for node in ast.walk(block) if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    return ast.Module(body=[node for node in tree.body if node not in guard], type_ignores=[]), parts


@pytest.mark.parametrize("path", [p for p in SCRIPTS if p.suffix == ".py"], ids=lambda p: p.name)
def test_python_scripts_need_only_the_standard_library(path):
    """No labctl import: the node has none, but for a part of a program (remote.PARTS) importing, as a
    module, the parts before it, whose text comes before its own where it is shipped. Only the store and
    the jobs of two scenarios (package-drift, mtu-blackhole) need the node's torch."""
    tree, parts = imported_as_a_module(ast.parse(path.read_text()))
    before = {f"labctl.remote.{p[:-3]}" for files in remote.PARTS.values() if path.name in files
              for p in files[:files.index(path.name)]}
    assert parts <= before, parts - before
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    allowed = set(sys.stdlib_module_names) | ({"torch"} if path.name in ("store.py", "package_versions.py", "allreduce_sizes.py") else set())
    assert imported <= allowed, imported - allowed


@pytest.mark.parametrize("name", ["store", "port_check", "stop", "crash", "node_info", "probe", "mtu_probe", "worker",
                                  "forkcommon", "forkrequest", "forkserver"])
def test_a_script_imported_as_a_module_runs_nothing(name, capsys):
    importlib.import_module(f"labctl.remote.{name}")
    assert capsys.readouterr() == ("", "")


def test_the_constants_the_scripts_write_out_are_labctls():
    from labctl.remote import crash, forkcommon, stop, store

    assert stop.RUN_ID_VAR == crash.RUN_ID_VAR == forkcommon.RUN_ID_VAR == launch.RUN_ID_VAR
    # stop finds forked workers in the registry the fork server keeps next to its socket.
    assert stop.REGISTRY_DIR == crash.REGISTRY_DIR == os.path.join(os.path.dirname(forkcommon.SOCKET_PATH),
                                                                 forkcommon.REGISTRY)
    assert stop.REPORT == executor.STOP_REPORT
    assert (store.STORE_READY, store.STORE_FAILED) == (launch.STORE_READY, launch.STORE_FAILED)
    assert re.findall(r"^marker=(\S+)", remote.load("prepare-workspace.sh"), re.M) == [ssh.MARKER]
    assert re.findall(r"^log=(\S+)", remote.load("start-forkserver.sh"), re.M) == [warm.SERVER_LOG]
    assert forkcommon.IMPORTED_LATER == warm.IMPORTED_LATER  # `bench start` waits for it in that log


def test_labctl_ships_the_files_text():
    assert remote.load("stop.py") is remote.load("stop.py")  # read once
    shipped = {launch.STORE_SCRIPT: "store.py", launch.PORT_CHECK_SCRIPT: "port_check.py",
               launch.STOP_SCRIPT: "stop.py", faults.CRASH_SCRIPT: "crash.py", ssh.PREPARE_SCRIPT: "prepare-workspace.sh",
               doctor.INFO_SCRIPT: "node_info.py", doctor.PROBE_SCRIPT: "probe.py",
               warm.START_SCRIPT: "start-forkserver.sh"}
    for text, name in shipped.items():
        assert text == (remote.HERE / name).read_text()


# --------------------------------------------------------------------------------------- stop


def test_stop_ends_the_runs_processes_and_no_others(spawn):
    run_id = new_run_id()
    ours = [spawn({RUN_ID_VAR: run_id}), spawn({RUN_ID_VAR: run_id, "LOCAL_RANK": "0", "RANK": "2"})]
    others = [spawn({RUN_ID_VAR: new_run_id()}), spawn({RUN_ID_VAR: run_id + "0", "RANK": "5"}), spawn({"X": run_id})]
    started = time.monotonic()
    result = run_py("stop.py", "stop", run_id, "20")
    # First the report: the ranks still alive (only ours that has a RANK), and the OOM killer's count.
    assert result.returncode == 0 and result.stderr == ""
    assert re.fullmatch(r"DDPLAB_STOP ranks=2 oom_kills=(\d+|-)\n", result.stdout), result.stdout
    assert time.monotonic() - started < 15  # did not sit out the grace: everyone left on SIGTERM
    assert [p.wait(timeout=TIMEOUT_S) for p in ours] == [-signal.SIGTERM] * 2
    assert all(alive(p) for p in others)


def test_stop_kills_what_ignores_sigterm_once_the_grace_is_over(spawn):
    run_id = new_run_id()
    stubborn, polite = spawn({RUN_ID_VAR: run_id}, ignore_term=True), spawn({RUN_ID_VAR: run_id})
    started = time.monotonic()
    assert run_py("stop.py", "stop", run_id, "0.5").returncode == 0
    assert time.monotonic() - started >= 0.5
    assert stubborn.wait(timeout=TIMEOUT_S) == -signal.SIGKILL
    assert polite.wait(timeout=TIMEOUT_S) == -signal.SIGTERM


def test_the_executor_stops_a_run_on_a_host(spawn, host):
    run_id = new_run_id()
    member, bystander = spawn({RUN_ID_VAR: run_id}), spawn({RUN_ID_VAR: new_run_id()})
    executor.stop_on_nodes(host, ["node0"], run_id)
    assert member.wait(timeout=TIMEOUT_S) == -signal.SIGTERM and alive(bystander)


# ----------------------------------------------------------------------------------- watchdog


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_the_watchdog_stops_the_run_when_its_stdin_closes():
    """labctl (or the SSH link) gone: the host's part of the run must not outlive it."""
    env = {**os.environ, RUN_ID_VAR: new_run_id()}
    watchdog = subprocess.Popen([sys.executable, "-c", launch.STOP_SCRIPT, "watch", "1", sys.executable, "-c",
                                 "import time; print('child up', flush=True); time.sleep(60)"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert watchdog.stdout.readline().strip() == "child up"
        [child] = _children(watchdog.pid)
        started = time.monotonic()
        watchdog.stdin.close()
        assert watchdog.wait(timeout=TIMEOUT_S) == 128 + signal.SIGTERM
        assert time.monotonic() - started < 15
        assert "SSH session closed" in watchdog.stdout.read()
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)
    finally:
        watchdog.kill()
        watchdog.wait()


def test_the_watchdog_stops_the_run_when_the_whole_session_is_gone():
    """labctl killed with -9: its ssh client dies too (SIGPIPE on the output labctl no longer reads),
    so the session's stdout is gone when stdin closes. The watchdog's note then cannot be written;
    it must stop the run all the same (it once died on that write, leaving the run on the host)."""
    env = {**os.environ, RUN_ID_VAR: new_run_id()}
    out_r, out_w = os.pipe()
    watchdog = subprocess.Popen([sys.executable, "-c", launch.STOP_SCRIPT, "watch", "1", sys.executable, "-c",
                                 "import os, time; os.write(1, b'up'); time.sleep(60)"],
                                stdin=subprocess.PIPE, stdout=out_w, stderr=subprocess.DEVNULL, env=env)
    os.close(out_w)
    try:
        assert os.read(out_r, 2) == b"up"
        [child] = _children(watchdog.pid)
        os.close(out_r)  # the session's output: nobody reads it any more
        watchdog.stdin.close()
        assert watchdog.wait(timeout=TIMEOUT_S) == 128 + signal.SIGTERM
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)
    finally:
        watchdog.kill()
        watchdog.wait()


# A job that starts a worker in a session of its own, as torchrun does, prints the worker's pid and then
# dies at once (torchrun killed by its lost output) or stays (torchrun leaving at the SIGTERM). The
# worker ignores SIGTERM where asked: only the SIGKILL after the grace then stops it.
WORKER_JOB = """import os, signal, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                           + ("signal.SIG_IGN" if sys.argv[2] == "stubborn" else "signal.SIG_DFL")
                           + "); print('ready', flush=True); time.sleep(120)"],
                          start_new_session=True, stdout=subprocess.PIPE, text=True)
worker.stdout.readline()
print(worker.pid, flush=True)
if sys.argv[1] == "dies":
    os._exit(1)
time.sleep(120)
"""


@contextlib.contextmanager
def _watch_a_job_with_a_worker(*how: str):
    """(the watchdog, its job's worker's pid), both killed afterwards whatever the test found."""
    env = {**os.environ, RUN_ID_VAR: new_run_id()}
    watchdog = subprocess.Popen([sys.executable, "-c", launch.STOP_SCRIPT, "watch", "1", sys.executable, "-c",
                                 WORKER_JOB, *how], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    worker = int(watchdog.stdout.readline())
    try:
        yield watchdog, worker
    finally:
        watchdog.kill()
        watchdog.wait()
        if not _gone(worker):
            os.kill(worker, signal.SIGKILL)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_watchdog_stops_the_workers_its_job_leaves_when_it_dies_first():
    """c3 of 2026-12-06: torchrun died before the watchdog read the session's end, and its worker (a
    session of its own) lived on under init. The watchdog adopts such orphans and stops them."""
    with _watch_a_job_with_a_worker("dies", "polite") as (watchdog, worker):
        assert watchdog.wait(timeout=TIMEOUT_S) == 1  # the job's own status, still
        assert _gone(worker)


def test_the_watchdog_finishes_its_stop_when_the_job_leaves_at_the_sigterm():
    """The session closes; the job leaves at the SIGTERM, its worker does not: the watchdog must not
    exit before the SIGKILL that the grace ends with (it once did, leaving the worker on the host)."""
    with _watch_a_job_with_a_worker("stays", "stubborn") as (watchdog, worker):
        watchdog.stdin.close()
        assert watchdog.wait(timeout=TIMEOUT_S) == 128 + signal.SIGTERM
        assert _gone(worker)


def test_two_watchdogs_of_one_run_stop_it_together_and_neither_stops_the_other():
    """A run's store and its agent on node0, each under a watchdog of its own; labctl killed with -9
    closes both sessions at once. Each watchdog's stop once sent SIGTERM to the other, before either
    reached the run's later pids: both died, and the store and a worker stayed on the host."""
    env = {**os.environ, RUN_ID_VAR: new_run_id()}
    job = "import time; print('up', flush=True); time.sleep(60)"
    watchdogs = [subprocess.Popen([sys.executable, "-c", launch.STOP_SCRIPT, "watch", "1", sys.executable, "-c", job],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        assert [w.stdout.readline().strip() for w in watchdogs] == ["up", "up"]
        jobs = [child for w in watchdogs for child in _children(w.pid)]
        for w in watchdogs:
            w.stdin.close()
        # each left by itself, with its job's status (the job's death by SIGTERM), not by the other's signal
        assert [w.wait(timeout=TIMEOUT_S) for w in watchdogs] == [128 + signal.SIGTERM] * 2
        assert len(jobs) == 2 and all(_gone(pid) for pid in jobs)
    finally:
        for w in watchdogs:
            w.kill()
            w.wait()


def test_the_watchdog_passes_the_jobs_exit_status_through():
    env = {**os.environ, RUN_ID_VAR: new_run_id()}
    held = subprocess.Popen([sys.executable, "-c", launch.STOP_SCRIPT, "watch", "1", sys.executable, "-c",
                             "raise SystemExit(7)"], stdin=subprocess.PIPE, env=env)
    assert held.wait(timeout=TIMEOUT_S) == 7
    held.stdin.close()


def test_a_launch_on_a_host_runs_under_the_watchdog_until_labctl_lets_go(host):
    """SSHHosts.execute's own command line; close() is what labctl does on Ctrl-C."""
    job = Launch("node0", "node0", ["python", "-c", "import time; print('up', flush=True); time.sleep(60)"],
                 {RUN_ID_VAR: new_run_id()})
    output, status = [], []
    thread = threading.Thread(target=lambda: status.append(host.execute(job, lambda chunk, _fd: output.append(chunk))),
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT_S
    while b"up" not in b"".join(output) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b"up" in b"".join(output), output
    host.close()
    thread.join(TIMEOUT_S)
    assert status == [128 + signal.SIGTERM]
    assert b"the SSH session closed; stopping this host's part of the run" in b"".join(output)


def test_a_launch_on_a_host_returns_the_jobs_status(host):
    job = Launch("node0", "node0", ["python", "-c", "import sys; print('done'); sys.stderr.write('said\\n'); raise SystemExit(5)"],
                 {RUN_ID_VAR: new_run_id()})
    output = []
    assert host.execute(job, lambda chunk, fd: output.append((fd, chunk))) == 5
    streams = {fd: b"".join(chunk for f, chunk in output if f == fd) for fd in (1, 2)}
    assert streams == {1: b"done\n", 2: b"said\n"}  # each stream's own (print's two writes may come apart)


# --------------------------------------------------------------------------------- port check


def test_the_port_check_fails_on_a_port_in_use_with_the_reason(held_port):
    result = run_py("port_check.py", str(held_port))
    assert (result.returncode, result.stdout) == (3, os.strerror(98) + "\n")  # EADDRINUSE: Address already in use


def test_the_port_check_passes_a_free_port_silently():
    result = run_py("port_check.py", str(free_port()))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_the_executor_refuses_a_taken_rendezvous_port(host, held_port):
    executor.check_master_port(host, {"node0": {"MASTER_PORT": str(free_port())}})
    with pytest.raises(LabError, match=f"MASTER_PORT {held_port} is already in use on node0 \\(Address already in use\\)"):
        executor.check_master_port(host, {"node0": {"MASTER_PORT": str(held_port)}})


# -------------------------------------------------------------------------------------- crash

# `fault crash` kills the workers of every labctl run this machine can see, and this machine may run a
# lab while the tests run: here the shipped text runs with os.kill fenced to the test's own children.
FENCE = """
import os, sys
ours = {int(pid) for pid in sys.argv[1:]}
kill = os.kill
def fenced(pid, sig):
    if pid not in ours:
        raise PermissionError(pid)
    kill(pid, sig)
os.kill = fenced
exec(compile(TEXT, "crash.py", "exec"))
"""


def test_crash_kills_the_workers_of_a_run_and_spares_its_agent(spawn):
    run_id = new_run_id()
    worker = spawn({RUN_ID_VAR: run_id, "LOCAL_RANK": "1"})
    agent, stranger = spawn({RUN_ID_VAR: run_id}), spawn({"LOCAL_RANK": "0"})
    fenced = FENCE.replace("TEXT", repr(faults.CRASH_SCRIPT))
    result = subprocess.run([sys.executable, "-c", fenced, *(str(p.pid) for p in (worker, agent, stranger))],
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert (result.returncode, result.stdout, result.stderr) == (0, "1\n", "")
    assert worker.wait(timeout=TIMEOUT_S) == -signal.SIGKILL
    assert alive(agent) and alive(stranger)


# ------------------------------------------------------------------------------------- doctor


def test_the_probe_reports_what_it_reached_and_what_it_could_not_bind(held_port):
    listen, closed = free_port(), free_port()
    cfg = {"listen": [listen, held_port], "targets": [["self", "127.0.0.1", listen], ["shut", "127.0.0.1", closed]],
           "connect_s": 0.3, "window_s": 5, "expect": 1}
    result = run_py("probe.py", json.dumps(cfg))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["bind_errors"] == {str(held_port): os.strerror(98)}
    got = {name: (ip, port, status) for name, ip, port, status, ms in report["results"]}
    assert got == {"self": ("127.0.0.1", listen, "ok"), "shut": ("127.0.0.1", closed, "refused")}


def test_node_info_describes_this_machine(host):
    info = doctor.node_info(host, "node0")
    assert {"hostname", "python", "torch", "cuda", "nccl", "rsync", "ifaces"} <= set(info)
    assert info["hostname"] == socket.gethostname() and info["python"] == platform.python_version()
    assert info["torch"]  # tests/conftest.py requires torch in this Python
    assert isinstance(info["rsync"], bool) and isinstance(info["ifaces"], dict)
    if shutil.which("ip"):
        assert "127.0.0.1/8" in info["ifaces"]["lo"]
    assert info["packages"]["pytest"] == version("pytest") and info["packages"]["torch"] == info["torch"]
    assert info["packages"]["typing-extensions"]  # names as PEP 503 normalises them (typing_extensions)


# ---------------------------------------------------------------------------- prepare-workspace


@pytest.mark.parametrize("state, expect_code", [("absent", 0), ("empty", 0), ("ours", 0), ("someone else's", 3)])
def test_prepare_refuses_to_mirror_into_a_folder_labctl_did_not_make(tmp_path, state, expect_code):
    ws = tmp_path / "ws"
    if state != "absent":
        ws.mkdir()
    if state == "ours":
        (ws / ssh.MARKER).write_text("")
        (ws / "old.py").write_text("")
    if state == "someone else's":
        (ws / "thesis.tex").write_text("years of work")
    result = subprocess.run(["sh", "-c", ssh.PREPARE_SCRIPT, "sh", str(ws), ".lab/demo", "node0.env"], input="A=1\n",
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == expect_code, result.stderr
    if expect_code == 0:
        assert (ws / ".lab/demo/node0.env").read_text() == "A=1\n" and (ws / ssh.MARKER).exists()
    else:
        assert "DDPLAB_NOT_OURS" in result.stdout and sorted(p.name for p in ws.iterdir()) == ["thesis.tex"]


def test_prepare_replaces_the_env_file_whole(host, tmp_path):
    """A new file renamed over the old one: whoever reads the old one never sees half of the new."""
    state = tmp_path / "ws" / ".lab" / "demo"
    state.mkdir(parents=True)
    (tmp_path / "ws" / ssh.MARKER).write_text("")
    (state / "node0.env").write_text("OLD=1\n")
    with open(state / "node0.env") as old:
        code, output = host.run("node0", ["sh", "-c", ssh.PREPARE_SCRIPT, "sh", str(tmp_path / "ws"), ".lab/demo",
                                          "node0.env"], input_text="A=1\nB='x y'\n")
        assert (code, output) == (0, "")
        assert old.read() == "OLD=1\n"
    assert (state / "node0.env").read_text() == "A=1\nB='x y'\n"
    assert sorted(p.name for p in state.iterdir()) == ["node0.env"]  # no temporary file left
