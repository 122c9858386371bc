"""Which lines of a run go to the terminal. Every line goes to the node's log; the terminal is
spared what repeats or follows from the failure that matters:
- torchrun's traceback with its ChildFailedError report (one per node, each blaming nothing) or
  its shutdown on a signal, and its `failed (exitcode: N)` log line: the last lines say it better;
- the traceback of a rank that failed only because another did (its peer gone, a collective timed
  out, the store gone), with what follows its exception line (an error raised in a callback, such
  as DDP's all-reduce hook, goes on with blank lines and `At:` stacks), and a C++ abort's
  `terminate called ... what(): Connection closed by peer`;
- torch's warnings that a compile-cache entry could not be used (a corrupt or foreign entry on
  the shared cache: inductor compiles afresh and warns, traceback and all, at every entry it
  tries): one line of labctl's per rank says so instead, the warnings go to the log.
A rank's traceback is held back until its exception line arrives, then printed whole or dropped;
a log line that another thread of the process writes meanwhile (torch's `W1207 20:25:26...` or its
C++ `[W1207 ...]`: a rendezvous keep-alive, a store client) is printed as it comes and the traceback
stays held (before, such a line could end the hold, and torchrun's whole report reached the terminal).
So is a line of Slurm's own (`slurmstepd-node0: error: *** STEP 5.0 ON node0 CANCELLED ...`), which srun
relays among a task's. Where the traceback cannot be finished (its step cancelled as it printed, so
sys.stderr is gone), CPython dumps the exception object instead of its line (`object type name:
ChildFailedError`, ..., `lost sys.stderr`): the dump is held with the traceback and judged by it.
Pure: fed lines, it returns the lines to print.
"""

from __future__ import annotations

import re

from labctl.run.failures import (
    AGENT_FAILED,
    consequence_of,
    is_agent_report,
    strip_rank,
)

REPORT_RULE = re.compile(r"^=+\s*$")
CALLBACK_STACK = "At:"  # torch's line before the Python stack of a callback that raised
# torch's logging prefix (W, date, time, thread, file:line]) on the caches' warnings, then the message
CACHE_WARNING = re.compile(r"^W\d{4} \S+ +\d+ torch/(_inductor/codecache|_functorch/_aot_autograd/autograd_cache)"
                           r"\.py:\d+\] (?:\[[^\]]*\] )?(.*)$")
# a log record of torch's (Python's logging, its C++'s): the level, the date, the time; never an exception line
LOG_RECORD = re.compile(r"^\[?[DIWEFC]\d{4} \d\d:\d\d:\d\d")
# an agent report's exception line that arrives with no traceback held (one broke off, or none came)
AGENT_REPORT_LINE = re.compile(r"^[\w.]*\b(ChildFailedError|SignalException)(:|$)")
# Slurm's daemons and commands, in a task's output: never a line of its process's traceback
SLURM_LINE = re.compile(r"^(slurmstepd|srun|salloc|sbatch)(-[\w.-]+)?: ")
# CPython's dump of an exception it could not print (_PyErr_Display: _PyObject_Dump, then LOST_STDERR)
OBJECT_DUMP = re.compile(r"^object (address|refcount|type|type name|repr) *: ?(.*)$")
LOST_STDERR = "lost sys.stderr"
MAX_HELD = 400  # lines of one traceback held back at most; a longer one is printed as it comes


class TerminalFilter:
    """One stream's filter: `feed(line)` returns what to print now, `flush()` what is still held."""

    def __init__(self) -> None:
        self.held: dict[int | None, list[str]] = {}  # by rank (None: no rank prefix)
        self.in_report = False
        self.report_root_seen = False
        self.dropping = False  # in the tail of a dropped consequence's exception line
        self.dropping_rank: int | None = None  # and whose (None: no rank prefix)
        self.cache_noted: set[int | None] = set()  # ranks told that a compile-cache entry was not used

    def feed(self, line: str) -> list[str]:
        rank, text = strip_rank(line)
        if self.in_report:
            return self._in_report(text)
        if self.dropping:
            if self._in_dropped_tail(rank, text):
                return []
            self.dropping = False
        if AGENT_FAILED.match(text):
            return []
        cache = CACHE_WARNING.match(text)
        if cache:
            return self._cache_warning(rank, cache.group(2))
        held = self.held.get(rank)
        if held is not None and (LOG_RECORD.match(text) or SLURM_LINE.match(text)):
            return [line]
        if held is not None:
            if (not text.strip() or text.startswith((" ", "\t", "Traceback (most recent call last)"))
                    or OBJECT_DUMP.match(text)):
                held.append(line)
                return self.held.pop(rank) if len(held) > MAX_HELD else []
            if text.strip() == LOST_STDERR:
                return self._dumped(rank, line)
            return self._exception(rank, line, text)
        if text.startswith(("Traceback (most recent call last)", "object address")):
            self.held[rank] = [line]
            return []
        if AGENT_REPORT_LINE.match(text):
            return self._agent_report(text)
        if (text.startswith("terminate called") or "what():" in text) and consequence_of(text):
            return []
        return [line]

    def flush(self) -> list[str]:
        lines = [line for held in self.held.values() for line in held]
        self.held.clear()
        return lines

    def _exception(self, rank: int | None, line: str, text: str) -> list[str]:
        held = self.held.pop(rank)
        if is_agent_report(text):
            return self._agent_report(text)
        if consequence_of(text):
            self.dropping, self.dropping_rank = True, rank
            return []
        return held + [line]

    def _dumped(self, rank: int | None, line: str) -> list[str]:
        """The end of CPython's dump of an exception it could not print, held with its traceback:
        dropped where the dumped object is torchrun's report or a consequence, else printed whole."""
        held = self.held.pop(rank)
        dump = dict(m.groups() for m in (OBJECT_DUMP.match(strip_rank(h)[1]) for h in held) if m)
        told = f"{dump.get('type name', '')}: {dump.get('repr', '')}"
        return [] if is_agent_report(told) or consequence_of(told) else held + [line]

    def _agent_report(self, text: str) -> list[str]:
        """torchrun's exception line of a report: dropped, and a ChildFailedError's report under it too."""
        self.in_report = "ChildFailedError" in text
        self.report_root_seen = False
        return []

    def _cache_warning(self, rank: int | None, message: str) -> list[str]:
        if rank in self.cache_noted:
            return []
        self.cache_noted.add(rank)
        prefix = f"[rank{rank}]: " if rank is not None else ""
        return [f"{prefix}labctl: an entry of the compile cache could not be used ({message.strip()}); this rank "
                "compiles afresh (torch's warnings about it are in the node's log)"]

    def _in_dropped_tail(self, rank: int | None, text: str) -> bool:
        """A line of what follows a dropped consequence's exception line: a blank line (torch writes
        those without the rank's prefix), `At:` and the indented stack under it."""
        if not text.strip():
            return rank in (None, self.dropping_rank)
        return rank == self.dropping_rank and (text == CALLBACK_STACK or text.startswith((" ", "\t")))

    def _in_report(self, text: str) -> list[str]:
        if text.startswith("Root Cause"):
            self.report_root_seen = True
        elif self.report_root_seen and REPORT_RULE.match(text):
            self.in_report = False
        return []
