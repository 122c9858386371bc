"""Why a run failed: which rank failed first, on which node, saying what; which failed after it
only because it did; the exit status labctl passes on. Pure: reads the lines a run printed.

Decided from the workers themselves, never from which node's torchrun agent exited first:
- each worker's own traceback (torch.distributed prefixes a rank's uncaught exception `[rankN]:`),
- torchrun's report of each failed worker (its global rank, exit status or signal, the time), and
  the agent's `failed (exitcode: N) local_rank: L` log line, whose time has milliseconds,
- for the static launcher, each process is one rank, with its own exit status,
- a node the run lost (labctl's `node lost` line, when its container or SSH link went away).
A rank whose error says its peer went away (gloo's "Connection closed by peer", a collective timed
out, the store gone, a C++ abort in a collective) failed as a consequence: the root cause is the
earliest failure that is not one, by the time the node recorded it.

tests/unit/test_failures.py holds this to recorded outputs of real failures.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Sequence

RANK_LINE = re.compile(r"^\[rank(\d+)\]:\s?(.*)$")
AGENT_FAILED = re.compile(r"^[EW](\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+) +\d+ \S+\] failed \(exitcode: (-?\d+)\) "
                          r"local_rank: (\d+)")
REPORT_ENTRY = re.compile(r"^\[\d+\]:\s*$")
REPORT_FIELD = re.compile(r"^\s+(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*?)\s*$")
LOST_LINE = re.compile(r"^labctl: (.*(node lost|lost \S+:|connection dropped).*)$")
# What a rank says when it failed only because another one did, and that in a word.
CONSEQUENCES = (
    (re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|Socket closed|"
                r"Connection was likely closed|NCCL communicator was aborted|ProcessGroupNCCL.*abort", re.I),
     "peer gone"),
    (re.compile(r"Timed out waiting \d+ms for (recv|send)|timed out in (recv|send)|Watchdog caught collective "
                r"operation timeout", re.I), "peer silent"),
    (re.compile(r"DistStoreError|Failed to recv, got 0 bytes|store.*(Socket Timeout|closed)|wait timeout", re.I),
     "store gone"),
)
# torchrun's own tracebacks that only repeat a worker's failure or its own shutdown (another of its
# errors, a rendezvous that failed, is the cause and is kept).
AGENT_REPORTS = ("ChildFailedError", "SignalException")
BARE_ERROR = re.compile(r"^\s*([A-Za-z_][\w.]*(Error|Exception)|error)\b.*")


@dataclass
class RankFailure:
    """One failed rank (or, rank None, a node whose ranks are unknown), as its node recorded it."""

    node: str
    rank: int | None = None
    local_rank: int | None = None
    status: int | None = None  # the process's own: N, or -S for signal S (torchrun's convention)
    error: str | None = None  # its exception, `Type: message`
    time: datetime | None = None  # on the node's clock
    lost: str | None = None  # the node itself went away: labctl's line saying how
    stopped: bool = False  # labctl stopped it (after another failure, a timeout, Ctrl-C)
    consequence: str | None = field(default=None, compare=False)  # "peer gone", ...: failed because another did

    @property
    def who(self) -> str:
        return f"rank {self.rank} on {self.node}" if self.rank is not None else self.node

    @property
    def signal(self) -> str | None:
        if self.status is not None and self.status < 0:
            return signal_name(-self.status)
        return None

    @property
    def exit_status(self) -> int:
        """As a shell reports it: N, or 128+S for a signal."""
        if self.status is None:
            return 137 if self.lost else 1
        return 128 - self.status if self.status < 0 else self.status


@dataclass
class RunVerdict:
    """What a run came to: `exit_status` (0, the root cause's, 124 timeout, 130 Ctrl-C) and why."""

    exit_status: int
    root: RankFailure | None = None
    after: list[RankFailure] = field(default_factory=list)  # failed later, in order
    unfinished: list[str] = field(default_factory=list)  # timeout: who was still running
    timed_out: bool = False
    interrupted: bool = False
    oom_kills: int | None = None  # in the root cause's node's memory cgroup, when known


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def consequence_of(text: str | None) -> str | None:
    """The word for a failure caused by another rank's, or None."""
    if text:
        for pattern, word in CONSEQUENCES:
            if pattern.search(text):
                return word
    return None


def strip_rank(line: str) -> tuple[int | None, str]:
    match = RANK_LINE.match(line)
    return (int(match.group(1)), match.group(2)) if match else (None, line)


def exception_blocks(lines: Iterable[str]) -> list[tuple[list[str], str]]:
    """Each Python traceback in `lines` (one stream, prefixes removed): (its frame lines, its
    exception line). A chained exception is a block of its own."""
    blocks: list[tuple[list[str], str]] = []
    frames: list[str] | None = None
    for line in lines:
        if line.startswith("Traceback (most recent call last)"):
            frames = []
        elif frames is not None:
            if line.startswith((" ", "\t")) or not line.strip():
                frames.append(line)
            else:
                blocks.append((frames, line.strip()))
                frames = None
    return blocks


def is_agent_report(exception: str) -> bool:
    """torchrun's traceback that reports a worker's failure (ChildFailedError) or its own shutdown."""
    return any(name in exception for name in AGENT_REPORTS)


def worker_errors(lines: Sequence[str]) -> dict[int | None, list[str]]:
    """The exception lines of the tracebacks in `lines`, by rank (None: printed without a rank
    prefix: raised before init_process_group, or torchrun's own), torchrun's reports left out."""
    streams: dict[int | None, list[str]] = {}
    for line in lines:
        rank, text = strip_rank(line)
        streams.setdefault(rank, []).append(text)
    errors: dict[int | None, list[str]] = {}
    for rank, texts in streams.items():
        for _, exception in exception_blocks(texts):
            if not is_agent_report(exception):
                errors.setdefault(rank, []).append(exception)
    return errors


def parse_agent_time(month: str, day: str, clock: str, year: int) -> datetime:
    return datetime.strptime(f"{year}-{month}-{day} {clock}", "%Y-%m-%d %H:%M:%S.%f")


def torchrun_reports(lines: Sequence[str]) -> list[dict[str, str]]:
    """The entries of torchrun's failure reports (`[0]:` then `time/host/rank/exitcode/...`)."""
    entries: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for line in lines:
        if REPORT_ENTRY.match(line):
            current = {}
            entries.append(current)
        elif current is not None:
            field_match = REPORT_FIELD.match(line)
            if field_match:
                current[field_match.group(1)] = field_match.group(2)
            else:
                current = None
    return [e for e in entries if "rank" in e and "exitcode" in e]


def _leading_int(text: str) -> int | None:
    match = re.match(r"\s*(-?\d+)", text)
    return int(match.group(1)) if match else None


def torchrun_failures(node: str, lines: Sequence[str], year: int) -> list[RankFailure]:
    """The failed workers of one node's torchrun agent, from its report and its log lines."""
    failures: dict[int, RankFailure] = {}  # by local rank
    for entry in torchrun_reports(lines):
        local = re.search(r"local_rank:\s*(\d+)", entry["rank"])
        local_rank = int(local.group(1)) if local else 0
        when = None
        if "time" in entry:
            try:
                when = datetime.strptime(entry["time"], "%Y-%m-%d_%H:%M:%S")
            except ValueError:
                pass
        failures[local_rank] = RankFailure(node, _leading_int(entry["rank"]), local_rank,
                                           _leading_int(entry["exitcode"]), time=when)
    for line in lines:
        match = AGENT_FAILED.match(line)
        if match:
            month, day, clock, status, local_rank = match.groups()
            failure = failures.setdefault(int(local_rank), RankFailure(node, None, int(local_rank), int(status)))
            report_year = failure.time.year if failure.time else year
            failure.time = parse_agent_time(month, day, clock, report_year)  # milliseconds: better
    return list(failures.values())


@dataclass
class Stream:
    """What the analysis needs of one launch's output (a labctl.run.result.Outcome has it all)."""

    node: str
    lines: Sequence[str]
    exit_code: int | None
    stopped: bool = False
    rank: int | None = None  # the static launcher's RANK; torchrun's agents run several
    ended_at: float | None = None  # wall clock, seconds since the epoch
    torchrun: bool = True


def stream_failures(stream: Stream, year: int) -> list[RankFailure]:
    """The failed ranks of one stream, each with its error line and whether it is a consequence."""
    errors = worker_errors(stream.lines)
    lost = next((m.group(1) for line in stream.lines for m in [LOST_LINE.match(line)] if m), None)
    ended = datetime.fromtimestamp(stream.ended_at, timezone.utc).replace(tzinfo=None) if stream.ended_at else None
    if stream.torchrun:
        failures = torchrun_failures(stream.node, stream.lines, year)
    elif stream.exit_code not in (0, None):
        code = stream.exit_code
        failures = [RankFailure(stream.node, stream.rank, status=-(code - 128) if 128 < code < 160 else code)]
    else:
        failures = []
    unprefixed = errors.pop(None, [])
    for failure in failures:
        said = errors.get(failure.rank) if failure.rank is not None else None
        if not said and unprefixed and (len(failures) == 1 or not stream.torchrun):
            said = unprefixed
        if not said and not stream.torchrun:  # no traceback: a process that said `error: ...` and left
            said = [line.strip() for line in stream.lines if BARE_ERROR.match(line)]
        if said:
            failure.error = said[-1]
        failure.time = failure.time or ended
    if not failures and stream.stopped and not lost:  # still running when labctl stopped the run
        failures = [RankFailure(stream.node, stream.rank, time=ended)]
    elif not failures and (lost or (stream.exit_code not in (0, None) and not stream.stopped)):
        # The node went away (or its agent failed without a report): the node is what failed.
        failures = [RankFailure(stream.node, stream.rank, time=ended)]
        said = [e for errs in errors.values() for e in errs] or unprefixed or [
            line.strip() for line in stream.lines if BARE_ERROR.match(line) and not is_agent_report(line)]
        failures[0].error = said[-1] if said else None
    text = "\n".join(stream.lines)
    for failure in failures:
        failure.lost = lost
        # Stopped by labctl: SIGTERM, or nothing of its own to say in a launch labctl stopped.
        failure.stopped = failure.status == -signal.SIGTERM or (
            stream.stopped and failure.error is None and failure.status in (None, 1))
        if failure.lost:
            failure.status = failure.status if failure.status is not None else _lost_status(stream.exit_code)
        elif failure.stopped:
            failure.consequence = "stopped by labctl"
        else:
            failure.consequence = consequence_of(failure.error) or (
                consequence_of(text) if failure.signal == "SIGABRT" else None)
    return failures


def _lost_status(exit_code: int | None) -> int | None:
    """A lost node's launch ended with its exec's status: 137 when its container was killed."""
    if exit_code is not None and 128 < exit_code < 160:
        return -(exit_code - 128)
    return None


def _order(failure: RankFailure) -> tuple:
    return (failure.time or datetime.max, failure.rank if failure.rank is not None else 1 << 30)


def judge(streams: Sequence[Stream], *, ok: bool, timed_out: bool = False, interrupted: bool = False,
          live_ranks: dict[str, list[int]] | None = None, oom_kills: dict[str, int | None] | None = None,
          year: int | None = None) -> RunVerdict:
    """The verdict on a run from its streams. `ok`: whether it succeeded (an elastic run may, with
    failures); `live_ranks`: the ranks each node still ran when labctl stopped it; `oom_kills`: each
    node's memory cgroup's OOM kills at the end of the run."""
    year = year or datetime.now().year
    parsed = [(s, stream_failures(s, year)) for s in streams]
    failures = sorted((f for _, found in parsed for f in found), key=_order)
    if interrupted:
        return RunVerdict(130, None, failures, interrupted=True)
    if timed_out:
        live = live_ranks or {}
        unfinished = [f"rank {r} on {node}" for node, ranks in live.items() for r in ranks] or sorted(
            {s.node for s in streams if s.exit_code is None or s.stopped})
        # A launch still running at the timeout was stopped by it: what it then said (a peer gone) is
        # the stop's doing, not a failure from before it.
        own = sorted((f for s, found in parsed if not s.stopped for f in found if not f.stopped), key=_order)
        return RunVerdict(124, own[0] if own else None, own[1:], unfinished, timed_out=True)
    if ok:
        return RunVerdict(0, None, failures)
    causes = [f for f in failures if f.consequence is None] or [f for f in failures if not f.stopped] or failures
    if not causes:  # failed, yet nothing says how: the first stream that did not end cleanly
        bad = next((s for s in streams if s.exit_code not in (0, None)), streams[0] if streams else None)
        node = bad.node if bad else "?"
        return RunVerdict(1, RankFailure(node, status=bad.exit_code if bad and bad.exit_code else 1))
    root = causes[0]
    after = [f for f in failures if f is not root]
    kills = (oom_kills or {}).get(root.node)
    return RunVerdict(root.exit_status, root, after, oom_kills=kills)


SIGNAL_NOTES = {"SIGSEGV": "segmentation fault", "SIGABRT": "aborted", "SIGBUS": "bus error",
                "SIGFPE": "floating-point exception", "SIGILL": "illegal instruction"}


def what_happened(failure: RankFailure, oom_kills: int | None = None) -> str:
    """`ValueError: ...`, `exited with status 3`, `killed by SIGKILL (...)`, or how its node was lost."""
    if failure.lost:
        return failure.lost
    name = failure.signal
    if name == "SIGKILL":
        if oom_kills:
            why = (f"out of memory: the OOM killer has killed {oom_kills} process{'es' if oom_kills > 1 else ''} "
                   f"in {failure.node}'s memory cgroup; give nodes more (`labctl up --memory`) or the job less")
        else:
            why = f"out of memory? the OOM killer or a `kill -9`; {failure.node}'s memory limit was not hit"
        return f"killed by SIGKILL ({why})"
    if name:
        note = SIGNAL_NOTES.get(name)
        text = f"killed by {name}" + (f" ({note})" if note else "")
        return f"{text}: {failure.error}" if failure.error else text
    if failure.error:
        return failure.error
    return f"exited with status {failure.exit_status}"


def _names(failures: list[RankFailure]) -> str:
    who = [f.who for f in failures]
    return who[0] if len(who) == 1 else ", ".join(who[:-1]) + " and " + who[-1]


def explain(verdict: RunVerdict, timeout_s: float | None = None) -> list[str]:
    """The last lines of a failed run, before its log path: the root cause first, then the rest."""
    if verdict.interrupted:
        return ["interrupted (Ctrl-C); labctl stopped the run on every node"]
    lines = []
    if verdict.timed_out:
        limit = f"--timeout-s {timeout_s:g}" if timeout_s is not None else "--timeout-s"
        who = ", ".join(verdict.unfinished) or "no rank"
        lines.append(f"{limit} reached: {who} had not finished; labctl stopped the run on every node")
        if verdict.root:
            lines.append(f"before that, {verdict.root.who} failed: {what_happened(verdict.root)}")
        return lines
    root = verdict.root
    if root is None:
        return lines
    when = f" ({root.time:%H:%M:%S})" if root.time else ""
    if root.lost:
        lines.append(f"{root.who} was lost first{when}: {root.lost}")
    else:
        lines.append(f"{root.who} failed first{when}: {what_happened(root, verdict.oom_kills)}")
    groups: dict[str, list[RankFailure]] = {}
    for failure in verdict.after:
        groups.setdefault(failure.consequence or "", []).append(failure)
    for word, failures in groups.items():
        if word == "stopped by labctl":
            lines.append(f"then labctl stopped {_names(failures)}")
        elif word:
            lines.append(f"then {_names(failures)} failed ({word})")
        else:  # failures of their own: those that said what the root cause said, in one line
            same = [f for f in failures if f.error and f.error == root.error and not root.lost]
            if same:
                lines.append(f"then {_names(same)} failed the same way")
            lines += [f"then {f.who} failed too: {what_happened(f)}" for f in failures if f not in same]
    return lines
