"""What a run left: each process's outcome, the run's verdict and why it failed, the trainer's
SUMMARY, and the logs saved under `.lab/<lab>/runs/<run id>/`."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from labctl.run.failures import (
    RankFailure,
    Stream,
    RunVerdict,
    explain,
    judge,
    what_happened,
)
from labctl.run.known import Limit, known_limit
from labctl.run.launch import Launch

RESULT_FILE = "result.json"  # in the run folder, written when the run ends (`labctl logs -f` stops there)
MEMBERS = "members.jsonl"  # in the run folder: a line per worker started under torchrun's contract (worker.py)
SUMMARY_PREFIX = "SUMMARY "  # the trainer's last line on rank 0: SUMMARY {...json...}
# Ways a process dies whose last error line does not say why, and what is going on.
KNOWN_DEATHS = (
    (re.compile(r"terminate called without an active exception"),
     "it aborted while Python was exiting, after its work: a gloo worker thread was still freeing the last "
     "collective's tensors (and the autograd context of one launched in backward), which needs the interpreter "
     "that was shutting down (torch's race at exit, pytorch/pytorch#190489, as in #179291; a few runs in a hundred "
     "on a busy machine). A script avoids it by ending, once it has written and flushed everything and left the "
     "process group, with os._exit(0), as python -m trainer and examples/trace/my_fsdp_script.py do"),
)



@dataclass
class Outcome:
    launch: Launch
    exit_code: int | None = None
    stopped: bool = False  # stopped by labctl, not failed by itself
    lines: list[str] = field(default_factory=list)  # as they came, both streams: the node's log
    streams: dict[int, list[str]] = field(default_factory=dict)  # the same lines by stream (1, 2), each in order
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    ended_at: float | None = None  # the same moment on the wall clock

    @property
    def torchrun(self) -> bool:
        return self.launch.torchrun

    def stream(self) -> Stream:
        rank = self.launch.env.get("RANK")
        # a stream at a time: a line of stdout that came between two of a traceback's is not its end
        lines = [line for fd in sorted(self.streams) for line in self.streams[fd]] if self.streams else self.lines
        return Stream(self.launch.node, lines, self.exit_code, self.stopped,
                      int(rank) if rank and rank.isdigit() else None, self.ended_at, self.torchrun)

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
    timeout_s: float | None = None
    live_ranks: dict[str, list[int]] = field(default_factory=dict)  # still running when labctl stopped them
    oom_kills: dict[str, int | None] = field(default_factory=dict)  # each node's OOM kills, at the end

    @property
    def verdict(self) -> RunVerdict:
        """Which rank failed first, where, saying what, and the exit status that follows (see failures.py)."""
        return judge([o.stream() for o in self.outcomes], ok=self.ok, timed_out=self.timed_out,
                     interrupted=self.interrupted, live_ranks=self.live_ranks, oom_kills=self.oom_kills)

    @property
    def exit_status(self) -> int:
        """0; the root-cause rank's status (128+N for signal N); 124 after --timeout-s; 130 after Ctrl-C."""
        return self.verdict.exit_status

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
        """Processes that failed (for an elastic run that went on without them)."""
        return [o.launch.label for o in self.outcomes if o.exit_code not in (0, None)]

    def members(self) -> list[dict]:
        """Each worker that started under torchrun's contract: where, its rank, restart count, world's node
        count and start time (MEMBERS)."""
        try:
            lines = (self.run_dir / MEMBERS).read_text().splitlines()
        except OSError:
            return []
        members = []
        for line in lines:
            try:
                member = json.loads(line)
            except ValueError:
                continue  # not a worker's line: what the run's own script wrote there, say
            if isinstance(member, dict) and {"host", "group_world_size", "time"} <= member.keys():
                members.append(member)
        return members

    def first_round_note(self) -> str | None:
        """For an elastic run whose first workers started without some of its nodes: which, and when they came."""
        nodes = len(dict.fromkeys(o.launch.node for o in self.outcomes))
        return first_round_note(self.members(), nodes) if self.min_nodes is not None else None

    def explain(self) -> str:
        """The last lines of a failed run: who failed first and how, who after, and where the logs are."""
        verdict = self.verdict
        lines = explain(verdict, self.timeout_s)
        culprit = self._root_outcome(verdict)
        cause = culprit.known_cause() if culprit else None
        if cause:
            lines.append(f"why: {cause}")
        elif limit := self.known_limit(verdict):
            lines += limit.lines()
        where = self.logs.get(verdict.root.node) if verdict.root and not verdict.timed_out else None
        lines.append(f"logs: {_shown(where or self.run_dir)}")
        return "\n".join(lines)

    def known_limit(self, verdict: RunVerdict | None = None) -> Limit | None:
        """The known limit of the nodes' torch that the first failure met (labctl.run.known), if any."""
        verdict = verdict or self.verdict
        culprit = self._root_outcome(verdict)
        if verdict.root is None or culprit is None or verdict.timed_out:
            return None
        return known_limit(verdict.root.error, culprit.lines)

    def _root_outcome(self, verdict: RunVerdict) -> Outcome | None:
        if verdict.root is None:
            return None
        return next((o for o in self.outcomes if o.launch.node == verdict.root.node
                     and (verdict.root.rank is None or o.stream().rank in (None, verdict.root.rank))), None)

    def to_dict(self) -> dict:
        """The run as `labctl run --json` prints it (and result.json keeps it)."""
        verdict = self.verdict
        nodes: dict[str, dict] = {}
        failures = [verdict.root, *verdict.after] if verdict.root else list(verdict.after)
        for o in self.outcomes:
            entry = nodes.setdefault(o.launch.node, {"exit_status": None, "ranks": [], "log": str(self.logs[o.launch.node])})
            if o.exit_code is not None:
                entry["exit_status"] = max(entry["exit_status"] or 0, o.exit_code)
            stream = o.stream()
            if stream.rank is not None:
                entry["ranks"].append(stream.rank)
        for f in failures:
            if f.rank is not None and f.rank not in nodes.get(f.node, {}).get("ranks", [f.rank]):
                nodes[f.node]["ranks"].append(f.rank)
        for entry in nodes.values():
            entry["ranks"].sort()
        return {
            "ok": self.ok, "exit_status": verdict.exit_status, "run_id": self.run_dir.name, "run_dir": str(self.run_dir),
            "timed_out": self.timed_out, "interrupted": self.interrupted, "nodes": nodes,
            "root_cause": _failure_dict(verdict.root, verdict.oom_kills, self.known_limit(verdict)) if verdict.root else None,
            "failed_after": [_failure_dict(f) for f in verdict.after],
            "unfinished": verdict.unfinished, "summary": self.summary,
        }


def _failure_dict(f: RankFailure, oom_kills: int | None = None, limit: Limit | None = None) -> dict:
    return {"node": f.node, "rank": f.rank, "exit_status": f.exit_status, "signal": f.signal,
            "error": f.error, "what": what_happened(f, oom_kills), "lost": f.lost,
            "time": f.time.isoformat(timespec="milliseconds") if f.time else None, "consequence": f.consequence,
            "known": limit.to_dict() if limit else None}


def _shown(path: Path) -> str:
    """A path as short as it can be said from here: relative to the current folder when it is in it
    or a folder or two above (labctl run from a subdirectory of the workspace), else absolute."""
    here = Path.cwd()
    if os.path.commonpath([here, path]) in ("/", ""):
        return str(path)
    relative = os.path.relpath(path, here)
    return str(path) if relative.startswith("../../../") else relative


def first_round_note(members: list[dict], nodes: int) -> str | None:
    """What `labctl run` says when an elastic run's first workers started in a world of fewer than
    the run's `nodes` (MEMBERS, in the order they started): the nodes they were on, those that joined
    later and when, and how many never did. None when the first world had them all."""
    if not members:
        return None
    members = sorted(members, key=lambda m: m["time"])
    start, size = members[0]["time"], members[0]["group_world_size"]
    if size >= nodes:
        return None
    world = next((i for i, m in enumerate(members) if m["group_world_size"] != size), len(members))
    first = {m["host"] for m in members[:world]}
    joined: dict[str, float] = {}
    for m in members[world:]:
        if m["host"] not in first:
            joined.setdefault(m["host"], m["time"] - start)
    note = f"the run's first workers started on {size} of {nodes} nodes ({', '.join(sorted(first))})"
    if joined:
        note += ("; " + ", ".join(f"{host} joined {later:.1f} s later" for host, later in joined.items())
                 + ", and every node restarted its workers to let it in")
    if size + len(joined) < nodes:  # the world's size, not the lines: a host's lines may not have come back
        note += f"; {nodes - size - len(joined)} never joined"
    return note + " (an agent that comes after the rendezvous's last call waits for the next round)"


def find_summary(lines) -> dict | None:
    """The first `SUMMARY {...}` among `lines` that parses as a JSON object. A line that does not (a
    script's own "SUMMARY {", a line cut short) is passed over: the run's result still stands."""
    for line in lines:
        if SUMMARY_PREFIX + "{" in line:
            try:
                found = json.loads(line.split(SUMMARY_PREFIX, 1)[1])
            except json.JSONDecodeError:
                continue
            if isinstance(found, dict):
                return found
    return None

