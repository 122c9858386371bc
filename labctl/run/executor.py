"""Run one job on every node at once: stream prefixed output, save per-node logs, stop cleanly.

Each Launch is started on its node through a `Nodes` (a `docker exec` into a lab container, or an
SSH session on a real host) and read by a thread of its own. The main thread watches: the first
node to fail starts a short grace period after which the others are stopped, Ctrl-C and
--timeout-s stop everyone at once, and every process of the run is found for stopping by the
DDPLAB_RUN_ID in its environment (see labctl/remote/stop.py).
"""

from __future__ import annotations

import codecs
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from labctl.core.ui import node_colour, stdout_console
from labctl.errors import RunFailed, StateError
from labctl.run.launch import (
    PORT_CHECK_SCRIPT,
    RUN_DIR_VAR,
    STOP_SCRIPT,
    STORE_FAILED,
    STORE_READY,
    Launch,
    store_launch,
)
from labctl.run.plan import RunPlan
from labctl.run.output import STDERR, STDOUT, Echo, NodeLogs, OutputStream
from labctl.run.result import RESULT_FILE, Outcome, RunResult

FAIL_GRACE_S = 10.0  # after one node fails, how long the others get to notice and exit on their own
STOP_GRACE_S = 3.0  # SIGTERM -> SIGKILL
STORE_START_TIMEOUT_S = 60.0
STOP_REPORT = "DDPLAB_STOP"  # stop.py's first line: the ranks still alive, the node's OOM kills


class Nodes(Protocol):
    """Where a run's processes go: `engine.docker.DockerNodes` (containers) or `hosts.ssh.SSHHosts` (real hosts).

    argv[0] "python" and "torchrun" mean the node's own Python and its torchrun.
    """

    port_hint: str  # how to move the rendezvous port when it is taken
    holds_stdin: bool  # a launch with hold_stdin gets a stdin labctl can close (release)

    def address(self, node: str) -> str: ...  # for people: a container name, user@host:port

    def shell_hint(self, node: str) -> str: ...  # a command prefix that runs something on the node

    def run(self, node: str, argv: list[str]) -> tuple[int, str]: ...  # short command: (status, output)

    def execute(self, launch: Launch, on_output: Callable[[bytes, int], None]) -> int: ...  # (chunk, 1|2); status

    def node_lost(self, node: str, exit_code: int) -> str | None: ...  # "the node itself is gone", or None

    def release(self, launch: Launch) -> None: ...  # close a hold_stdin launch's stdin

    def close(self) -> None: ...


def execute(nodes: Nodes, plan: RunPlan, *, echo: bool | str = True, check: bool = True) -> RunResult:
    """Run the plan on `nodes`: check the first node's rendezvous port, start every launch at once,
    stream and save their output (to stdout, or with echo="stderr" there), stop the rest when one
    fails, stop everything after the plan's `timeout_s`. With `check` (the default), raise RunFailed (the result attached, its exit status the
    root cause's) unless the run succeeded (for an elastic run: enough nodes finished cleanly);
    without, return the result whatever happened."""
    store = None
    if plan.store:  # the run's rendezvous store on the first node, forked by its fork server too
        first, env = next(iter(plan.node_env.items()))
        store = store_launch(first, env["MASTER_PORT"], plan.run_id, plan.launches[0].env[RUN_DIR_VAR], warm=True,
                             until_eof=plan.launcher == "warm" and nodes.holds_stdin)
    else:  # rank 0 binds the port itself: say what holds it before anything starts (the store says so itself)
        check_master_port(nodes, plan.node_env)
    result = run_all(nodes, plan.launches, plan.run_dir, plan.run_id, store=store, timeout_s=plan.timeout_s,
                     echo=echo, min_nodes=plan.min_nodes)
    return conclude(result, echo, check)


def conclude(result: RunResult, echo: bool | str, check: bool) -> RunResult:
    """How every run ends, whatever launched it: an elastic run whose first round formed without some
    of its nodes, or that went on without a node, says so; with `check`, a failed run raises RunFailed
    with the root cause's exit status."""
    lost = result.lost_nodes()
    if echo and (note := result.first_round_note()):
        Echo(echo).console.print(f"[yellow]labctl: {note}[/yellow]", markup=True)
    if result.ok and lost and echo:
        Echo(echo).console.print(f"[yellow]labctl: the run completed without {', '.join(lost)} (lost during the "
                                  f"run; elastic range allowed it)[/yellow]", markup=True)
    if check and not result.ok:
        raise RunFailed(result.explain(), exit_code=result.exit_status, result=result)
    return result


def check_master_port(nodes: Nodes, node_env: dict[str, dict[str, str]]) -> None:
    """Fail before launching when the rendezvous port on node0 is already taken."""
    first = next(iter(node_env))
    port = node_env[first]["MASTER_PORT"]
    code, output = nodes.run(first, ["python", "-c", PORT_CHECK_SCRIPT, port])
    if code != 0:
        raise port_taken(nodes, first, port, output.strip())


def port_taken(nodes: Nodes, first: str, port: str, why: str) -> StateError:
    """The rendezvous port on the first node is taken: by what, and what to do."""
    _, listeners = nodes.run(first, ["ss", "-Hltnp", f"sport = :{port}"])
    held_by = listeners.strip() or "another process"
    return StateError(f"MASTER_PORT {port} is already in use on {first} ({why}): {held_by}",
                     hint=f"a run may still be running there; wait for it or `{nodes.shell_hint(first)} pkill -f "
                          f"torchrun`, or {nodes.port_hint}")


def stop_on_nodes(nodes: Nodes, names: list[str], run_id: str,
                  report_first: bool = False) -> dict[str, tuple[list[int], int | None]]:
    """Stop the run on every node; what each said first: (the ranks it still ran, its OOM kills).
    `report_first`: every node reports before any is stopped, so a rank that dies because a peer on
    another node was stopped first still counts as running (a timed-out run names them all)."""
    def call(node: str, args: list[str]) -> tuple[str, tuple[list[int], int | None] | None]:
        try:
            _, output = nodes.run(node, ["python", "-c", STOP_SCRIPT, *args])
        except Exception:  # a node that is gone has nothing left to stop
            return node, None
        return node, parse_stop_report(output)

    with ThreadPoolExecutor(max_workers=8) as pool:
        first = dict(pool.map(lambda node: call(node, ["report", run_id]), names)) if report_first else {}
        stopped = dict(pool.map(lambda node: call(node, ["stop", run_id, str(STOP_GRACE_S)]), names))
    return {node: report for node, report in {**stopped, **first}.items() if report is not None}


def parse_stop_report(output: str) -> tuple[list[int], int | None] | None:
    """`DDPLAB_STOP ranks=0,2 oom_kills=1` -> ([0, 2], 1); `oom_kills=-`: unknown."""
    for line in output.splitlines():
        if line.startswith(STOP_REPORT + " "):
            fields = dict(part.partition("=")[::2] for part in line.split()[1:])
            ranks = [int(r) for r in fields.get("ranks", "").split(",") if r.isdigit()]
            kills = fields.get("oom_kills", "-")
            return ranks, int(kills) if kills.isdigit() else None
    return None


def _stream(nodes: Nodes, outcome: Outcome, logs: NodeLogs, colour: str, echo: Echo | None, on_line=None) -> None:
    launch = outcome.launch
    out = OutputStream(outcome, logs, colour, echo, on_line)
    # Lines are made per stream: the engine relays stdout and stderr as they come, so a line of one
    # may arrive between two of the other's (even between two chunks of one line).
    decoders = {fd: codecs.getincrementaldecoder("utf-8")(errors="replace") for fd in (STDOUT, STDERR)}
    pending = {STDOUT: "", STDERR: ""}

    def on_output(chunk: bytes, fd: int) -> None:
        pending[fd] += decoders[fd].decode(chunk)  # a character may span two chunks
        *complete, pending[fd] = pending[fd].split("\n")
        for line in complete:
            out.line(line, fd)

    exit_code = None
    try:
        exit_code = nodes.execute(launch, on_output)
        for fd in (STDOUT, STDERR):
            pending[fd] += decoders[fd].decode(b"", final=True)
            if pending[fd]:
                out.line(pending[fd], fd)
        outcome.exit_code = exit_code
        if exit_code != 0:
            lost = nodes.node_lost(launch.node, exit_code)
            if lost:
                out.line(f"labctl: {lost}")
    except Exception as exc:  # the node vanished under us (docker kill, down)
        out.line(f"labctl: lost the node: {exc}")
        exit_code = outcome.exit_code if outcome.exit_code is not None else 255
    finally:
        out.end(exit_code)


def run_all(nodes: Nodes, launches: list[Launch], run_dir: Path, run_id: str, *, store: Launch | None,
            timeout_s: float | None = None, echo: bool | str = True, min_nodes: int | None = None) -> RunResult:
    """Start every launch at once (with `store`, the run's own rendezvous store, on the first node)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    link_latest(run_dir)
    logs = NodeLogs(run_dir)
    names = list(dict.fromkeys(launch.node for launch in launches))
    colours = {node: node_colour(i) for i, node in enumerate(names)}
    outcomes = [Outcome(launch) for launch in launches]
    printer = Echo(echo)
    threads = []
    store_thread = None
    result = None
    try:
        if store is not None:
            store_thread, store_ready = _start_store(nodes, store, run_dir, logs)
        for outcome in outcomes:
            thread = threading.Thread(target=_stream, args=(nodes, outcome, logs, colours[outcome.launch.node], printer),
                                      daemon=True)
            thread.start()
            threads.append(thread)
        if store_thread:
            # The agents or workers start alongside the store: their store clients retry the
            # connection until it listens, so nobody waits for it in turn.
            store_ready()
        result = _watch(RunInFlight(nodes, names, run_id, outcomes, threads), run_dir, timeout_s, printer, min_nodes)
        return result
    finally:
        # Whatever happened, leave no process of this run on any node (the store included). After a
        # warm run that ended cleanly, the store ends when its stdin closes, and the fork servers have
        # ended what each worker left: no node needs a `stop`.
        reports = None
        if store_thread and store.hold_stdin and result is not None and result.ok and not result.lost_nodes():
            nodes.release(store)
            store_thread.join(timeout=STOP_GRACE_S)
            reports = {} if not store_thread.is_alive() else None
        if reports is None:
            reports = stop_on_nodes(nodes, names, run_id)
        if store_thread:
            store_thread.join(timeout=5)
        nodes.close()
        logs.close()
        if result is not None:
            result.oom_kills = {node: kills for node, (_, kills) in reports.items()}
            save_result(result)


def save_result(result: RunResult) -> None:
    """result.json in the run folder: what `--json` prints; its presence says the run is over."""
    try:
        (result.run_dir / RESULT_FILE).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    except OSError:
        pass


def _start_store(nodes: Nodes, launch: Launch, run_dir: Path, logs: NodeLogs):
    node, master_port = launch.node, next(a for a in reversed(launch.argv) if a.isdigit())
    outcome = Outcome(launch)
    ready = threading.Event()

    def on_line(line: str) -> None:  # not on any line: one saying there is no fork server comes first
        if line.startswith((STORE_READY, STORE_FAILED)):
            ready.set()

    def stream() -> None:
        try:
            _stream(nodes, outcome, logs, "dim", None, on_line)
        finally:
            ready.set()  # it ended without a word

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()

    def wait_store() -> None:
        if not ready.wait(STORE_START_TIMEOUT_S) or not any(line.startswith(STORE_READY) for line in outcome.lines):
            detail = next((line for line in outcome.lines if line.startswith(STORE_FAILED)), "no answer")
            if "in use" in detail:  # the port is taken: by what, as before a run without a store
                raise port_taken(nodes, node, master_port, detail.removeprefix(STORE_FAILED).strip())
            raise StateError(f"could not start the rendezvous store on {node}:{master_port}: {detail}",
                             hint=f"see {run_dir}/{node}.log")

    return thread, wait_store


@dataclass(frozen=True)
class RunInFlight:
    """A run whose processes have started: what watching and stopping it needs (see run_all)."""

    nodes: Nodes  # where its processes run
    names: list[str]  # its nodes, in node-rank order
    run_id: str  # the DDPLAB_RUN_ID its processes carry, by which stop.py finds them
    outcomes: list[Outcome]  # one per launch, filled in as each process ends
    threads: list[threading.Thread]  # one per launch, streaming its output


def _watch(run: RunInFlight, run_dir: Path, timeout_s: float | None, echo: Echo,
           min_nodes: int | None = None) -> RunResult:
    """Wait for `run`'s processes, stopping them after a failure's grace, at `timeout_s` or on Ctrl-C."""
    started = time.monotonic()
    outcomes, threads = run.outcomes, run.threads
    first_failure: Outcome | None = None
    stop_at: float | None = None
    interrupted = timed_out = False
    live_ranks: dict[str, list[int]] = {}
    try:
        while any(t.is_alive() for t in threads):
            for thread in threads:
                thread.join(timeout=0.1)
            now = time.monotonic()
            if first_failure is None and not timed_out:  # after a timeout's stop, failures are its doing
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
                live_ranks = _stop_remaining(run, report_first=True)
            if stop_at is not None and now > stop_at:
                stop_at = None
                echo.mute()
                _stop_remaining(run)
    except KeyboardInterrupt:
        interrupted = True
        stdout_console().print("[bold yellow]labctl: Ctrl-C, stopping the run on every node[/bold yellow]", markup=True)
        echo.mute()
        _stop_remaining(run)
        for thread in threads:
            thread.join(timeout=STOP_GRACE_S + 5)
    return RunResult(run_dir, outcomes, first_failure, interrupted, timed_out, min_nodes, timeout_s, live_ranks)


def _stop_remaining(run: RunInFlight, report_first: bool = False) -> dict[str, list[int]]:
    """Stop what still runs; the ranks each node still ran."""
    for outcome in run.outcomes:
        if outcome.exit_code is None:
            outcome.stopped = True
    reports = stop_on_nodes(run.nodes, run.names, run.run_id, report_first)
    return {node: ranks for node, (ranks, _) in reports.items() if ranks}


def link_latest(run_dir: Path) -> None:
    """runs/latest -> this run's folder (`labctl logs` reads the latest by default)."""
    latest = run_dir.parent / "latest"
    try:
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(run_dir.name)
    except OSError:
        pass
