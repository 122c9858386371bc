"""Run one job on every node at once: stream prefixed output, save per-node logs, stop cleanly.

Each Launch is started on its node through a `Nodes` (a `docker exec` into a lab container, or an
SSH session on a real host) and read by a thread of its own. The main thread watches: the first
node to fail starts a short grace period after which the others are stopped, Ctrl-C and
--timeout-s stop everyone at once, and every process of the run is found for stopping by the
DDPLAB_RUN_ID in its environment (see labctl/remote/stop.py).
"""

from __future__ import annotations

import codecs
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Protocol

from rich.markup import escape

from labctl.errors import LabError, RunFailed
from labctl.run.launch import PORT_CHECK_SCRIPT, STOP_SCRIPT, STORE_FAILED, STORE_READY, Launch, store_launch
from labctl.run.plan import RunPlan
from labctl.run.result import Outcome, RunResult
from labctl.ui import console, node_colour

FAIL_GRACE_S = 10.0  # after one node fails, how long the others get to notice and exit on their own
STOP_GRACE_S = 3.0  # SIGTERM -> SIGKILL
STORE_START_TIMEOUT_S = 60.0
_PRINT_LOCK = threading.Lock()


class Nodes(Protocol):
    """Where a run's processes go: `lab.docker.DockerNodes` (containers) or `hosts.ssh.SSHHosts` (real hosts).

    argv[0] "python" and "torchrun" mean the node's own Python and its torchrun.
    """

    port_hint: str  # how to move the rendezvous port when it is taken

    def address(self, node: str) -> str: ...  # for people: a container name, user@host:port

    def shell_hint(self, node: str) -> str: ...  # a command prefix that runs something on the node

    def run(self, node: str, argv: list[str]) -> tuple[int, str]: ...  # short command: (status, output)

    def execute(self, launch: Launch, on_output: Callable[[bytes], None]) -> int: ...  # streams; status

    def node_lost(self, node: str, exit_code: int) -> str | None: ...  # "the node itself is gone", or None

    def close(self) -> None: ...


def execute(nodes: Nodes, plan: RunPlan, *, timeout_s: float | None = None, echo: bool = True,
            check: bool = True) -> RunResult:
    """Run the plan on `nodes`: check the first node's rendezvous port, start every launch at once,
    stream and save their output, stop the rest when one fails. With `check` (the default), raise
    RunFailed (the result attached) unless the run succeeded (for an elastic run: enough nodes
    finished cleanly); without, return the result whatever happened."""
    check_master_port(nodes, plan.node_env)
    master_port = next(iter(plan.node_env.values()))["MASTER_PORT"] if plan.torchrun else None
    result = run_all(nodes, plan.launches, plan.run_dir, plan.run_id, master_port=master_port, timeout_s=timeout_s,
                     echo=echo, min_nodes=plan.min_nodes)
    lost = result.lost_nodes()
    if result.ok and lost:
        console.print(f"[yellow]labctl: the run completed without {', '.join(lost)} (lost during the run; "
                      f"elastic range allowed it)[/yellow]", markup=True)
    if check and not result.ok:
        raise RunFailed(result.explain(), exit_code=130 if result.interrupted else 1, result=result)
    return result


def check_master_port(nodes: Nodes, node_env: dict[str, dict[str, str]]) -> None:
    """Fail before launching when the rendezvous port on node0 is already taken."""
    first = next(iter(node_env))
    port = node_env[first]["MASTER_PORT"]
    code, output = nodes.run(first, ["python", "-c", PORT_CHECK_SCRIPT, port])
    if code == 0:
        return
    _, listeners = nodes.run(first, ["ss", "-Hltnp", f"sport = :{port}"])
    held_by = listeners.strip() or "another process"
    raise LabError(f"MASTER_PORT {port} is already in use on {first} ({output.strip()}): {held_by}",
                   hint=f"a run may still be running there; wait for it or `{nodes.shell_hint(first)} pkill -f torchrun`, "
                        f"or {nodes.port_hint}")


def stop_run(nodes: Nodes, names: list[str], run_id: str) -> None:
    def stop(node: str) -> None:
        try:
            nodes.run(node, ["python", "-c", STOP_SCRIPT, "stop", run_id, str(STOP_GRACE_S)])
        except Exception:  # a node that is gone has nothing left to stop
            pass

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(stop, names))


class _Echo:
    """Whether node output still goes to the terminal: once labctl stops a run, the nodes' shutdown
    chatter (torchrun's SignalException stacks) goes to the logs only."""

    def __init__(self, on: bool = True):
        self.on = on

    def mute(self) -> None:
        if self.on:
            self.on = False
            console.print("[dim]labctl: further output of this run is in its logs[/dim]", markup=True)


class _NodeLogs:
    """One log file per node (static launches may put several processes on one node)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.files: dict[str, object] = {}
        self.lock = threading.Lock()

    def write(self, node: str, text: str) -> None:
        with self.lock:
            if node not in self.files:
                self.files[node] = open(self.run_dir / f"{node}.log", "a", buffering=1)
            self.files[node].write(text)

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def _stream(nodes: Nodes, outcome: Outcome, logs: _NodeLogs, colour: str, echo: _Echo | None, on_line=None) -> None:
    launch = outcome.launch
    prefix = f"[{colour}]{launch.label:>8} |[/{colour}] "
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span two chunks
    pending = ""

    def on_output(chunk: bytes) -> None:
        nonlocal pending
        pending += decoder.decode(chunk)
        *complete, pending = pending.split("\n")
        for line in complete:
            _emit(outcome, logs, prefix, line, echo, on_line)

    try:
        exit_code = nodes.execute(launch, on_output)
        pending += decoder.decode(b"", final=True)
        if pending:
            _emit(outcome, logs, prefix, pending, echo, on_line)
        outcome.exit_code = exit_code
        if exit_code != 0:
            lost = nodes.node_lost(launch.node, exit_code)
            if lost:
                _emit(outcome, logs, prefix, f"labctl: {lost}", echo, on_line)
    except Exception as exc:  # the node vanished under us (docker kill, down)
        _emit(outcome, logs, prefix, f"labctl: lost the node: {exc}", echo, on_line)
        outcome.exit_code = outcome.exit_code if outcome.exit_code is not None else 255
    finally:
        outcome.ended = time.monotonic()


def _emit(outcome: Outcome, logs: _NodeLogs, prefix: str, line: str, echo: _Echo | None, on_line) -> None:
    line = line.rstrip("\r")
    outcome.lines.append(line)
    label = "" if outcome.launch.label == outcome.launch.node else f"{outcome.launch.label} "
    logs.write(outcome.launch.node, f"{label}{line}\n")
    if on_line:
        on_line(line)
    if echo and echo.on:
        with _PRINT_LOCK:  # one whole line at a time, whichever node's thread prints
            console.print(prefix + escape(line), markup=True, soft_wrap=True)


def run_all(nodes: Nodes, launches: list[Launch], run_dir: Path, run_id: str, *, master_port: str | None,
            timeout_s: float | None = None, echo: bool = True, min_nodes: int | None = None) -> RunResult:
    """Start every launch at once (with the run's own rendezvous store on the first node, for torchrun)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    _link_latest(run_dir)
    logs = _NodeLogs(run_dir)
    names = list(dict.fromkeys(launch.node for launch in launches))
    colours = {node: node_colour(i) for i, node in enumerate(names)}
    outcomes = [Outcome(launch) for launch in launches]
    printer = _Echo(on=echo)
    threads = []
    store_thread = None
    try:
        if master_port is not None:
            store_thread, store_ready = _start_store(nodes, names[0], master_port, run_id, run_dir, logs)
        for outcome in outcomes:
            thread = threading.Thread(target=_stream, args=(nodes, outcome, logs, colours[outcome.launch.node], printer),
                                      daemon=True)
            thread.start()
            threads.append(thread)
        if store_thread:
            # The agents start alongside the store (it imports torch too, ~2 s): their store
            # clients retry the connection until it listens, so nobody waits for it in turn.
            store_ready()
        return _watch(nodes, names, run_id, run_dir, outcomes, threads, timeout_s, printer, min_nodes)
    finally:
        # Whatever happened, leave no process of this run on any node (the store included).
        stop_run(nodes, names, run_id)
        if store_thread:
            store_thread.join(timeout=5)
        nodes.close()
        logs.close()


def _start_store(nodes: Nodes, node: str, master_port: str, run_id: str, run_dir: Path, logs: _NodeLogs):
    launch = store_launch(node, master_port, run_id, run_dir)
    outcome = Outcome(launch)
    ready = threading.Event()
    thread = threading.Thread(target=_stream, args=(nodes, outcome, logs, "dim", None, lambda _line: ready.set()),
                              daemon=True)
    thread.start()

    def wait_ready() -> None:
        if not ready.wait(STORE_START_TIMEOUT_S) or not any(line.startswith(STORE_READY) for line in outcome.lines):
            detail = next((line for line in outcome.lines if line.startswith(STORE_FAILED)), "no answer")
            raise LabError(f"could not start the rendezvous store on {node}:{master_port}: {detail}",
                           hint=f"see {run_dir}/{node}.log")

    return thread, wait_ready


def _watch(nodes: Nodes, names, run_id, run_dir, outcomes, threads, timeout_s, echo: _Echo,
           min_nodes: int | None = None) -> RunResult:
    started = time.monotonic()
    first_failure: Outcome | None = None
    stop_at: float | None = None
    interrupted = timed_out = False
    try:
        while any(t.is_alive() for t in threads):
            for thread in threads:
                thread.join(timeout=0.1)
            now = time.monotonic()
            if first_failure is None:
                failed = [o for o in outcomes if o.exit_code not in (None, 0)]
                # An elastic run carries on while enough nodes are left to reach its minimum.
                if failed and min_nodes is not None and len(outcomes) - len(failed) >= min_nodes:
                    failed = []
                if failed:
                    first_failure = min(failed, key=lambda o: o.ended or now)
                    stop_at = now + FAIL_GRACE_S
            if timeout_s is not None and now - started > timeout_s and not timed_out:
                timed_out = True
                echo.mute()
                _stop_remaining(nodes, names, run_id, outcomes)
            if stop_at is not None and now > stop_at:
                stop_at = None
                echo.mute()
                _stop_remaining(nodes, names, run_id, outcomes)
    except KeyboardInterrupt:
        interrupted = True
        console.print("[bold yellow]labctl: Ctrl-C, stopping the run on every node[/bold yellow]", markup=True)
        echo.mute()
        _stop_remaining(nodes, names, run_id, outcomes)
        for thread in threads:
            thread.join(timeout=STOP_GRACE_S + 5)
    return RunResult(run_dir, outcomes, first_failure, interrupted, timed_out, min_nodes)


def _stop_remaining(nodes: Nodes, names, run_id, outcomes) -> None:
    for outcome in outcomes:
        if outcome.exit_code is None:
            outcome.stopped = True
    stop_run(nodes, names, run_id)


def _link_latest(run_dir: Path) -> None:
    latest = run_dir.parent / "latest"
    try:
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(run_dir.name)
    except OSError:
        pass
