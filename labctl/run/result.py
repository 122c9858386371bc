"""What a run left: each process's outcome, the run's verdict and why it failed, the trainer's
SUMMARY, and the logs saved under .lab/<lab>/runs/<run id>/."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from labctl.run.launch import Launch

RESULT_FILE = "result.json"  # in the run folder, written when the run ends (`labctl logs -f` stops there)
SUMMARY_PREFIX = "SUMMARY "  # the trainer's last line on rank 0: SUMMARY {...json...}
ERROR_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(Error|Exception|Interrupt)|error)\b.*")
# Ways a process dies whose last error line does not say why, and what is going on.
KNOWN_DEATHS = (
    (re.compile(r"terminate called without an active exception"),
     "it aborted while Python was exiting, after its work: a gloo worker thread was still freeing the last "
     "collective's tensors, which needs the interpreter that was shutting down (torch's race at exit, as in "
     "pytorch/pytorch#179291; a few runs in a hundred on a busy machine). A script avoids it by ending, once it "
     "has written and flushed everything and left the process group, with os._exit(0), as python -m trainer does"),
)



@dataclass
class Outcome:
    launch: Launch
    exit_code: int | None = None
    stopped: bool = False  # stopped by labctl, not failed by itself
    lines: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None

    def reason(self) -> str:
        for line in reversed(self.lines):
            if ERROR_LINE.match(line) and "ChildFailedError" not in line:
                return line.strip()
        for line in reversed(self.lines):
            if "exitcode" in line:
                return line.strip()
        return next((line.strip() for line in reversed(self.lines) if line.strip()), "no output")

    def known_cause(self) -> str | None:
        return next((why for pattern, why in KNOWN_DEATHS if any(pattern.search(line) for line in self.lines)), None)


@dataclass
class RunResult:
    run_dir: Path
    outcomes: list[Outcome]
    first_failure: Outcome | None
    interrupted: bool = False
    timed_out: bool = False
    min_nodes: int | None = None  # elastic: enough nodes finishing cleanly is success

    @property
    def ok(self) -> bool:
        if self.interrupted or self.timed_out:
            return False
        if self.min_nodes is not None:
            return sum(o.exit_code == 0 for o in self.outcomes) >= self.min_nodes
        return all(o.exit_code == 0 for o in self.outcomes)

    @property
    def exit_codes(self) -> dict[str, int | None]:
        """Each process's exit status by its label (node0, or node0/r1 for several on a node); None: never ended."""
        return {o.launch.label: o.exit_code for o in self.outcomes}

    @property
    def logs(self) -> dict[str, Path]:
        """Each node's saved output."""
        return {node: self.run_dir / f"{node}.log" for node in dict.fromkeys(o.launch.node for o in self.outcomes)}

    @property
    def summary(self) -> dict | None:
        """The trainer's SUMMARY (rank 0's last line `SUMMARY {...}`), parsed; None when no process printed one."""
        return find_summary(line for o in self.outcomes for line in reversed(o.lines))

    def lost_nodes(self) -> list[str]:
        return [o.launch.label for o in self.outcomes if o.exit_code not in (0, None)]

    def explain(self) -> str:
        if self.interrupted:
            return f"interrupted; every node was stopped. Logs: {self.run_dir}"
        if self.timed_out:
            return f"--timeout-s reached; every node was stopped. Logs: {self.run_dir}"
        culprit = self.first_failure or next(o for o in self.outcomes if o.exit_code != 0)
        parts = [f"{culprit.launch.label} exited with status {culprit.exit_code}: {culprit.reason()}"]
        cause = culprit.known_cause()
        if cause:
            parts.append(f"why: {cause}")
        stopped = [o.launch.label for o in self.outcomes if o.stopped]
        if stopped:
            parts.append(f"labctl then stopped {', '.join(stopped)}")
        parts.append(f"logs: {self.run_dir}/{culprit.launch.node}.log")
        return "; ".join(parts)


def find_summary(lines) -> dict | None:
    """The first `SUMMARY {...}` among `lines`, parsed."""
    for line in lines:
        if SUMMARY_PREFIX + "{" in line:
            return json.loads(line.split(SUMMARY_PREFIX, 1)[1])
    return None

