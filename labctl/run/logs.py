"""A run's saved logs read back (`labctl logs`): each node's output under .lab/<lab>/runs/<run id>/,
all of it or its last N lines, and followed as the run writes it (`logs -f`) until the run's result
file appears.

The executor writes each node's log a whole line at a time (labctl.run.executor), and RESULT_FILE
once the run has ended, after the last line: so a follower that sees the result file, reads once
more and stops has read everything.
"""

from __future__ import annotations

import re
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterator

from labctl.core.workspace import is_folder
from labctl.errors import ConfigError, LabError
from labctl.run.result import RESULT_FILE

POLL_S = 0.25  # how often `logs -f` looks for new lines: fast enough to read as live, cheap enough to idle
LOG_GLOB = "node*.log"


def check_tail(tail: int | None) -> None:
    if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
        raise ConfigError("--tail", tail, "must be a whole number of lines, 0 or more",
                          hint="--tail 20 prints each node's last 20 lines")


def tail_lines(data: bytes, lines: int | None) -> bytes:
    """The last `lines` lines of `data` (None: all of it). Lines end at b"\\n" only (a progress bar's
    b"\\r" is part of its line); an unterminated last line counts as a line."""
    if lines is None:
        return data
    if lines == 0:
        return b""
    return b"".join(deque(re.findall(rb"[^\n]*\n|[^\n]+$", data), maxlen=lines))


def runs_hint(runs: Path) -> str:
    """The hint for a run that is not under `runs`: the latest 5 run ids there (ids sort by start
    time), or how to make one."""
    known = sorted(p.name for p in runs.iterdir() if p.is_dir() and p.name != "latest") if runs.is_dir() else []
    return f"runs here: {', '.join(known[-5:])}" if known else "`labctl run -- -m trainer` makes one"


def run_dir(lab_directory: Path, run_id: str | None) -> Path:
    """The folder of run `run_id` (default: the latest), resolved: a run started meanwhile does not
    move a follower over to it."""
    runs = lab_directory / "runs"
    path = runs / (run_id or "latest")
    if not is_folder(path):
        raise LabError(f"no run {run_id or 'yet'} in {runs}", hint=runs_hint(runs))
    return path.resolve()


def log_files(run: Path, node: str | None = None) -> list[Path]:
    """The run's node logs in node-rank order (node2 before node10), or `node`'s alone."""
    files = sorted(run.glob(LOG_GLOB), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    return [p for p in files if p.stem == node] if node else files


def _no_log(node: str, run: Path) -> LabError:
    return LabError(f"no log for {node!r} in {run}",
                    hint=f"nodes with logs: {', '.join(p.stem for p in log_files(run)) or 'none yet'}")


def run_logs(lab_directory: Path, run_id: str | None, node: str | None,
             tail: int | None = None) -> list[tuple[str, str]]:
    """(node, saved output) of a run, every node or `node`; with `tail`, each node's last `tail` lines."""
    check_tail(tail)
    run = run_dir(lab_directory, run_id)
    files = log_files(run, node)
    if node and not files:
        raise _no_log(node, run)
    return [(p.stem, tail_lines(p.read_bytes(), tail).decode(errors="replace")) for p in files]


class LogFollower:
    """Reads what the node logs of one run folder gained since the last look, in whole lines."""

    def __init__(self, run: Path, node: str | None = None):
        self.run = run
        self.node = node
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}  # a line not yet ended by its newline

    def ended(self) -> bool:
        return (self.run / RESULT_FILE).exists()

    def read(self, tail: int | None = None) -> list[tuple[str, str]]:
        """(node, the whole lines each log gained), node by node; `tail` keeps each node's last lines."""
        out = []
        for path in log_files(self.run, self.node):
            start = self.offsets.get(path.stem, 0)
            with open(path, "rb") as f:
                if f.seek(0, 2) < start:  # cut short under us: start again from its beginning
                    start = 0
                f.seek(start)
                data = f.read()
            self.offsets[path.stem] = start + len(data)
            *complete, self.partial[path.stem] = (self.partial.get(path.stem, b"") + data).split(b"\n")
            text = tail_lines(b"".join(line + b"\n" for line in complete), tail)
            if text:
                out.append((path.stem, text.decode(errors="replace")))
        return out

    def rest(self) -> list[tuple[str, str]]:
        """The unterminated last lines, once the run has ended."""
        rest = [(node, data.decode(errors="replace") + "\n") for node, data in self.partial.items() if data]
        self.partial.clear()
        return rest


def follow_run_logs(lab_directory: Path, run_id: str | None, node: str | None, tail: int | None = None, *,
                    poll_s: float = POLL_S, sleep: Callable[[float], None] = time.sleep) -> Iterator[tuple[str, str]]:
    """(node, new lines) of a run as its logs grow: what is there (each node's last `tail` lines),
    then every line written after, until the run has ended (its RESULT_FILE exists); then the rest.

    `node` may have no log yet when the run has just started; it must then be a node of the lab
    (one with an env file), or the run must not have ended.
    """
    check_tail(tail)
    run = run_dir(lab_directory, run_id)
    follower = LogFollower(run, node)
    if node and not log_files(run, node) and (follower.ended() or not (lab_directory / f"{node}.env").is_file()):
        raise _no_log(node, run)
    ended = follower.ended()  # looked at before reading: whatever was written before the result file is read
    yield from follower.read(tail)
    while not ended:
        sleep(poll_s)
        ended = follower.ended()
        yield from follower.read()
    yield from follower.rest()
