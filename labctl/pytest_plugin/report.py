"""What a failed test's report says about the runs it made: which node failed first and its error
line, every node's log, the properties a JUnit file carries, the GitHub annotation, and the
plugin's summary line.

Pure but for reading the run's saved logs: everything here takes a RunResult (or what doctor
found) and returns text, so the tests build real results from recorded output and compare text.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from labctl.diagnose.findings import Diagnosis
from labctl.run.failures import what_happened
from labctl.run.result import RunResult

LOG_TAIL_LINES = 80  # of each node's log in the report: the end of a run is where it failed
ROOT_TAIL_LINES = 25  # of the failing rank's own output, under the failure itself (and in JUnit's <failure>)
SECTION_PREFIX = "Captured stdout call"  # pytest's own: JUnit's <system-out> takes sections named so
PROPERTY_PREFIX = "ddplab_"


@dataclass
class RunRecord:
    """One run a test made through the fixture's lab."""

    result: RunResult | None
    call_site: tuple[str, int] | None = None  # (file, line) in the test where the run was made
    doctor: str | None = None  # doctor's findings, asked after a run that timed out
    lab: str = ""

    @property
    def failed(self) -> bool:
        return self.result is not None and not self.result.ok


@dataclass
class FailureReport:
    """What the plugin adds to a failed test's report."""

    headline: str  # `ddplab: rank 1 on node1 failed first: ValueError: ...`
    detail: str  # the run's own explanation, doctor's findings, the failing node's last lines
    sections: list[tuple[str, str]] = field(default_factory=list)  # (title, each node's log)
    properties: list[tuple[str, str]] = field(default_factory=list)  # for JUnit's <properties>


def headline(result: RunResult) -> str:
    """One line: who failed first and how (the run's verdict), or that it timed out."""
    verdict = result.verdict
    if verdict.timed_out:
        limit = f" after {result.timeout_s:g} s" if result.timeout_s is not None else ""
        who = ", ".join(verdict.unfinished) or "no rank"
        return f"ddplab: the run timed out{limit} ({who} had not finished)"
    return "ddplab: " + (result.explain().splitlines() or ["the run failed"])[0]


def root_fields(result: RunResult) -> dict[str, str]:
    """The root cause as JUnit properties: node, rank, error (what is known of them)."""
    root = result.verdict.root
    if root is None:
        return {}
    fields = {"root_node": root.node, "root_error": what_happened(root, result.verdict.oom_kills)}
    if root.rank is not None:
        fields["root_rank"] = str(root.rank)
    return fields


def tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a log, or a sentence saying why there is none."""
    try:
        with open(path, errors="replace") as handle:
            kept = deque(handle, maxlen=lines)
    except OSError as exc:
        return f"(no log: {exc.strerror or exc})"
    return "".join(kept).rstrip("\n") or "(empty)"


def excerpt(path: Path, error: str | None, lines: int) -> str:
    """The `lines` lines of a log that end with the last line saying `error` (the failing rank's
    own traceback, rather than the launcher's report after it), else the log's last lines."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc.strerror or exc})"
    ends = [i for i, line in enumerate(text) if error and error in line]
    end = ends[-1] + 1 if ends else len(text)
    return "\n".join(text[max(0, end - lines):end]) or "(empty)"


def ordered_logs(result: RunResult) -> list[tuple[str, Path]]:
    """Each node's log, the root cause's node first."""
    logs = list(result.logs.items())
    root = result.verdict.root
    return sorted(logs, key=lambda item: root is None or item[0] != root.node)


def failure_report(record: RunRecord, *, kept_hint: str | None = None, explained: bool = False) -> FailureReport:
    """The report of a failed run: its verdict (unless the test's error, `explained`, already
    says it), every node's log and where it lies."""
    result = record.result
    assert result is not None
    lines = [] if explained else [result.explain(), ""]
    if record.doctor and not explained:
        lines += [record.doctor, ""]
    logs = ordered_logs(result)
    root = result.verdict.root
    if root is not None and logs:
        error = root.error.splitlines()[0] if root.error else None
        lines += [f"{root.who}, from {_shown(logs[0][1])}:", excerpt(logs[0][1], error, ROOT_TAIL_LINES), ""]
    if kept_hint:
        lines += [kept_hint]
    sections = [(f"{SECTION_PREFIX}: ddplab {node} log, last {LOG_TAIL_LINES} lines ({_shown(path)})",
                 tail(path, LOG_TAIL_LINES)) for node, path in logs]
    props = [("lab", record.lab), ("root_cause", headline(result).removeprefix("ddplab: "))]
    props += list(root_fields(result).items())
    if record.call_site:
        props.append(("call_site", f"{record.call_site[0]}:{record.call_site[1]}"))
    props += [("run_dir", str(result.run_dir))] + [(f"log_{node}", str(path)) for node, path in logs]
    return FailureReport(headline(result), "\n".join(lines).rstrip("\n"), sections,
                         [(PROPERTY_PREFIX + name, value) for name, value in props if value])


def logs_report(record: RunRecord) -> list[tuple[str, str]]:
    """Each node's log of a run that succeeded, for a test that failed after it (an assertion on
    what the run printed): the evidence, without a verdict."""
    if record.result is None:
        return []
    return [(f"{SECTION_PREFIX}: ddplab {node} log, last {LOG_TAIL_LINES} lines ({_shown(path)})",
             tail(path, LOG_TAIL_LINES)) for node, path in ordered_logs(record.result)]


def _shown(path: Path) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if relative.startswith("../../") else relative


# --------------------------------------------------------------------------------------- doctor

def doctor_summary(diagnosis: Diagnosis) -> str:
    """doctor's findings in a few lines: the problems, or that every check passed."""
    problems = diagnosis.problems
    if not problems:
        return (f"doctor, asked after the timeout ({diagnosis.seconds:.1f} s): every check passed; the nodes reach "
                "each other, so the hang is in the job (a rank waiting on a collective the others never make?)")
    lines = [f"doctor, asked after the timeout ({diagnosis.seconds:.1f} s), found {len(problems)} "
             f"problem{'s' * (len(problems) != 1)}:"]
    for finding in problems:
        fix = f" (fix: {finding.fix})" if finding.fix else ""
        level = "warning" if finding.warn else "problem"
        lines.append(f"  {finding.node}: {finding.check} {level}: {finding.message}{fix}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------- GitHub

def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotation(file: str, line: int | None, title: str, message: str) -> str:
    """A workflow command GitHub Actions shows as an error on that line of the file
    (https://docs.github.com/actions/reference/workflow-commands-for-github-actions)."""
    where = f"file={_escape_property(file)}" + (f",line={line}" if line else "")
    return f"::error {where},title={_escape_property(title)}::{_escape_data(message)}"


def annotation_path(path: str, rootpath: str, checkout: str | None, invoked_in: str) -> str:
    """The test file (`path`, absolute or relative to pytest's rootdir) as GitHub names it:
    relative to the checkout ($GITHUB_WORKSPACE), else to where pytest was started."""
    absolute = os.path.normpath(os.path.join(rootpath, path))
    relative = os.path.relpath(absolute, checkout or invoked_in)
    return absolute if relative.startswith("..") else relative


# -------------------------------------------------------------------------------------- summary

@dataclass
class PoolStats:
    """One process's (one xdist worker's) count of labs and tests, summed in the controller."""

    labs: int = 0
    tests: int = 0
    up_s: float = 0.0
    down_s: float = 0.0
    names: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # how to reach each lab kept for debugging
    notes: list[str] = field(default_factory=list)  # anything else the session should hear of

    def add(self, other: PoolStats) -> None:
        self.labs += other.labs
        self.tests += other.tests
        self.up_s += other.up_s
        self.down_s += other.down_s
        self.names += other.names
        self.kept += other.kept
        self.notes += [note for note in other.notes if note not in self.notes]

    def as_dict(self) -> dict:
        return {"labs": self.labs, "tests": self.tests, "up_s": self.up_s, "down_s": self.down_s,
                "names": list(self.names), "kept": list(self.kept), "notes": list(self.notes)}


def summary_line(stats: PoolStats) -> str:
    """`ddplab: 1 lab for 3 tests (bring-up 2.1 s, teardown 1.0 s)`: what lab reuse saved is the
    difference between the two counts."""
    labs = f"{stats.labs} lab{'s' * (stats.labs != 1)}"
    tests = f"{stats.tests} test{'s' * (stats.tests != 1)}"
    return f"ddplab: {labs} for {tests} (bring-up {stats.up_s:.1f} s, teardown {stats.down_s:.1f} s)"


def kept_hint(lab: str, workspace: Path) -> str:
    return (f"lab {lab} was kept for debugging: `cd {workspace} && labctl status --lab {lab}` "
            f"(`labctl exec --lab {lab} node0 -- bash` for a shell); `labctl down --lab {lab} --volumes` removes it")
