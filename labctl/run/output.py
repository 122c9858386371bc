"""A run's output as labctl shows and keeps it: each process's lines kept in its Outcome, written to
its node's log (<run dir>/<node>.log), and shown on the terminal behind its node's label in the
node's colour, filtered (labctl.run.terminal). Every launcher's runs write through this: the lab's
(labctl.run.executor), real hosts', Slurm's (labctl.slurm.jobs)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from labctl.core.ui import stderr_console, stdout_console
from labctl.run.result import Outcome
from labctl.run.terminal import TerminalFilter

_PRINT_LOCK = threading.Lock()
STDOUT, STDERR = 1, 2  # a process's two streams, as Docker's frames number them


class Echo:
    """Whether node output still goes to the terminal (stdout, or stderr for `--json`): once labctl
    stops a run, the nodes' shutdown chatter (torchrun's SignalException stacks) goes to the logs only."""

    def __init__(self, on: bool | str = True):
        self.on = bool(on)
        self.console = stderr_console() if on == "stderr" else stdout_console()

    def note(self, line: str) -> None:
        """A line of the launcher's own (salloc's, srun's), dimmed, on stderr."""
        from rich.markup import escape

        with _PRINT_LOCK:
            stderr_console().print(f"[dim]{escape(line)}[/dim]", markup=True, soft_wrap=True)

    def mute(self) -> None:
        if self.on:
            self.on = False
            self.console.print("[dim]labctl: further output of this run is in its logs[/dim]", markup=True)


class NodeLogs:
    """The run's log files, one per node (static launches may put several processes on one node):
    <run dir>/<node>.log."""

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


class OutputStream:
    """One process's output, line by line: kept in its Outcome (the verdict reads it), written to its
    node's log, and shown on the terminal behind its label in the node's colour, filtered
    (labctl.run.terminal). Every launcher's runs write through this: the lab's, real hosts', Slurm's."""

    def __init__(self, outcome: Outcome, logs: NodeLogs, colour: str, echo: Echo | None, on_line=None):
        self.outcome, self.logs, self.echo, self.on_line = outcome, logs, echo, on_line
        self.prefix = f"[{colour}]{outcome.launch.label:>8} |[/{colour}] "
        self.shown = {STDOUT: TerminalFilter(), STDERR: TerminalFilter()}  # a traceback is held within its stream

    def line(self, line: str, stream: int = STDOUT) -> None:
        """One line of the process's stdout (or stderr: `stream` 2)."""
        line = line.rstrip("\r")
        outcome = self.outcome
        outcome.lines.append(line)
        outcome.streams.setdefault(stream, []).append(line)
        label = "" if outcome.launch.label == outcome.launch.node else f"{outcome.launch.label} "
        self.logs.write(outcome.launch.node, f"{label}{line}\n")
        if self.on_line:
            self.on_line(line)
        if self.echo and self.echo.on:
            _print(self.echo, self.prefix, self.shown[stream].feed(line))

    def end(self, exit_code: int | None) -> None:
        """The process has ended: its status and when, and whatever the filter still held."""
        outcome = self.outcome
        if exit_code is not None:
            outcome.exit_code = exit_code
        outcome.ended, outcome.ended_at = time.monotonic(), time.time()
        if self.echo and self.echo.on:
            for shown in self.shown.values():
                _print(self.echo, self.prefix, shown.flush())


def _print(echo: Echo, prefix: str, lines: list[str]) -> None:
    from rich.markup import escape  # markup in the nodes' lines ([file:line] tags) is printed as it is

    with _PRINT_LOCK:  # whole lines at a time, whichever node's thread prints
        for line in lines:
            echo.console.print(prefix + escape(line), markup=True, soft_wrap=True)
