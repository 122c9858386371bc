"""ddplab's pytest plugin: a `ddp_lab` fixture that hands each test a lab that is up, reused
between tests of the same topology, and failures that say which node failed and show its log.

    @pytest.mark.ddplab(nodes=3, bw="100mbit")
    def test_training(ddp_lab):
        result = ddp_lab.run("ddpci/train.py", "--steps", "20")   # raises RunFailed if a node fails
        assert result.summary["replicas_consistent"]

Registered by ddplab's install (the `pytest11` entry point `ddplab`); `-p no:ddplab` turns it
off, `-p ddplab` loads it where plugin autoload is off. It costs a session nothing until a test
asks for the fixture: no engine is asked anything before. See docs/how-to/ci.md, "The pytest plugin".
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from labctl.api import gc_labs
from labctl.core.workspace import find_workspace
from labctl.engine.docker import docker_client
from labctl.errors import ConfigError, LabError
from labctl.pytest_plugin.pool import LabPool
from labctl.pytest_plugin.report import (
    SECTION_PREFIX,
    PoolStats,
    annotation_path,
    doctor_summary,
    failure_report,
    github_annotation,
    kept_hint,
    logs_report,
    summary_line,
)
from labctl.pytest_plugin.settings import (
    MARKER,
    MARKER_DOC,
    SETTING_SOURCES,
    Settings,
    lab_request,
    resolve_settings,
    worker_id,
)

OWNER_PID_VAR = "DDPLAB_OWNER_PID"  # read by labctl/lab/owner.py when a lab is brought up
OWNER_SESSION_VAR = "DDPLAB_OWNER_SESSION"
SESSION_KEY = "ddplab_session"  # in xdist's workerinput: the controller's session id, for every worker
OUTPUT_KEY = "ddplab"  # in xdist's workeroutput: a worker's PoolStats

HELP = {
    "nodes": "nodes of a test's lab when its ddplab marker does not say (default 3)",
    "image": "node image tag (default: labctl's, DDPLAB_IMAGE or ddplab-node:torch<version>-cpu)",
    "run_timeout_s": "seconds every run through ddp_lab may take unless the test gives timeout_s (default 300): "
                     "a hang fails its test with doctor's findings",
    "keep_failed": "keep the lab of a failed test (not reused, not removed) and say how to reach it",
    "no_engine": "fail (default) or skip the tests that use ddp_lab when no Docker engine answers",
    "fresh": "a fresh lab for every test, no reuse (slower; tells a test from its neighbours)",
}

METAVARS = {"nodes": "N", "image": "TAG", "run_timeout_s": "SECONDS", "no_engine": "fail|skip"}


@dataclass
class State:
    """The plugin's state for one pytest process, kept in config.stash."""

    settings: Settings
    session: str
    worker: str
    workspace: Path
    rootpath: Path
    invoked_in: Path
    saved_env: dict[str, str | None]
    pool: object = None  # a LabPool, made when a test first asks for a lab
    swept: bool = False
    claimed: bool = False  # the owner variables are set in os.environ
    totals: PoolStats = field(default_factory=PoolStats)  # the controller's sum over workers
    annotations: list[str] = field(default_factory=list)


STATE = pytest.StashKey[State]()
LAB = pytest.StashKey[object]()
REPORTS = pytest.StashKey[dict]()


# ----------------------------------------------------------------------------------- options

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ddplab", "ddplab: a lab of DDP nodes for tests (the ddp_lab fixture)")
    for name, (option, ini_key, _) in SETTING_SOURCES.items():
        if name in ("keep_failed", "fresh"):
            group.addoption(option, action="store_const", const=True, default=None, dest=ini_key, help=HELP[name])
        else:
            group.addoption(option, default=None, dest=ini_key, metavar=METAVARS[name], help=HELP[name])
        parser.addini(ini_key, HELP[name], default="")
    parser.addini("ddplab_workspace", "the folder the lab's nodes see (mounted at the same path): test scripts must "
                                      "be inside it (default: the nearest folder upwards from the rootdir that holds "
                                      ".lab/, else the rootdir)", type="paths", default=[])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_DOC)
    try:
        settings = resolve_settings({name: config.getoption(ini_key) for name, (_, ini_key, _) in SETTING_SOURCES.items()},
                                    {name: config.getini(ini_key) for name, (_, ini_key, _) in SETTING_SOURCES.items()})
    except ConfigError as exc:
        raise pytest.UsageError(f"ddplab: {exc}") from None
    workerinput = getattr(config, "workerinput", None)
    session = (workerinput or {}).get(SESSION_KEY) or uuid.uuid4().hex[:8]
    state = State(settings, session, worker_id(workerinput), _workspace(config), config.rootpath,
                  config.invocation_params.dir,
                  {var: os.environ.get(var) for var in (OWNER_PID_VAR, OWNER_SESSION_VAR)})
    config.stash[STATE] = state
    if workerinput is None:
        config.pluginmanager.register(Controller(state), "ddplab-controller")


def owner_environ(state: State) -> dict[str, str]:
    """What labctl reads to label a lab with its owner (labctl/lab/owner.py): this process, so that
    `labctl gc` removes the lab once the session is gone (killed with -9, a CI job cancelled)."""
    return {OWNER_PID_VAR: str(os.getpid()), OWNER_SESSION_VAR: f"pytest-{state.session}"}


def _claim_labs(state: State) -> None:
    """From now on, labs brought up in this process belong to the session: the fixture's and any a
    test starts itself (`labctl up` in a subprocess inherits the variables)."""
    if not state.claimed:
        state.claimed = True
        os.environ.update(owner_environ(state))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The session's start, for a session with tests that use ddp_lab; one without is left as it
    was (a suite that tests labctl itself may depend on `labctl up` making labs without an owner)."""
    if any("ddp_lab" in getattr(item, "fixturenames", ()) for item in items):
        _claim_labs(config.stash[STATE])


def _workspace(config: pytest.Config) -> Path:
    given = config.getini("ddplab_workspace")
    if given:
        return Path(given[0]).resolve()

    return find_workspace(config.rootpath)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    for var, value in state.saved_env.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist's controller, for each worker: one session id for the whole run."""
    node.workerinput[SESSION_KEY] = node.config.stash[STATE].session


# ----------------------------------------------------------------------------------- fixture

def _pool(state: State):
    _claim_labs(state)  # (a test that asks for ddp_lab with request.getfixturevalue: only now)
    if state.pool is None:
        state.pool = LabPool(state.settings, state.session, state.worker, state.workspace, docker_client,
                             owner_environ(state))
    return state.pool


def _sweep(state: State, pool) -> None:
    """Once per process, before its first lab: remove the labs of sessions that died (killed with
    -9, a CI job cancelled) through labctl's gc."""
    if state.swept:
        return
    state.swept = True

    try:
        removed = [verdict.lab for verdict in gc_labs(client=pool.client()) if verdict.remove]
    except Exception as exc:  # noqa: BLE001 - a courtesy: the session goes on, and says it at the end
        pool.stats.notes.append(f"sweeping the labs of dead sessions failed: {exc}")
        return
    if removed:
        pool.stats.notes.append(f"removed {len(removed)} lab{'s' * (len(removed) != 1)} of sessions that had "
                                f"died: {', '.join(removed)}")


@pytest.fixture
def ddp_lab(request: pytest.FixtureRequest):
    """A `labctl.api.Lab` that is up, for this test: reused from an earlier test of the same
    topology unless that test made it unfit; links as `@pytest.mark.ddplab(bw=..., delay=...)`
    says, cleared after. Runs made through it get the session's timeout and, on failure, put the
    failing node and its log in the test's report."""
    state = request.config.stash[STATE]
    marks = [(mark.args, mark.kwargs) for mark in request.node.iter_markers(MARKER)]
    # Each refusal is raised outside the `except` that caught labctl's error, so the report shows
    # the one message and not "During handling of the above exception, another exception occurred".
    spec, refused = None, None
    try:
        spec = lab_request(marks, state.settings, state.workspace, os.environ, root=state.rootpath)
    except LabError as exc:
        refused = f"ddplab: {exc}"
    if refused:
        pytest.fail(refused, pytrace=False)
    pool = _pool(state)
    try:
        pool.client()
    except LabError as exc:
        refused = f"ddplab: this test needs a lab and {exc}"
    if refused and state.settings.no_engine == "skip":
        pytest.skip(refused)
    if refused:
        pytest.fail(f"{refused}\n  (--ddplab-no-engine=skip skips such tests instead)", pytrace=False)
    _sweep(state, pool)
    try:
        lab = pool.acquire(spec, str(request.node.path))
    except LabError as exc:
        refused = f"ddplab: could not give this test a lab of {spec.describe()}: {exc}"
    if refused:
        pytest.fail(refused, pytrace=False)
    request.node.stash[LAB] = lab
    yield lab
    reports = request.node.stash.get(REPORTS, {})
    # An xfail that failed counts: what it left on the lab is no more known than a failure's.
    failed = any(report.failed or hasattr(report, "wasxfail") for report in reports.values())
    pool.release(lab, failed=failed, fresh=spec.fresh)


# ------------------------------------------------------------------------------------ reports

@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    item.stash.setdefault(REPORTS, {})[report.when] = report
    lab = item.stash.get(LAB, None)
    if lab is not None and report.when == "call" and report.failed:
        _explain_failure(item, report, lab, call)
    return report


def _explain_failure(item: pytest.Item, report: pytest.TestReport, lab, call: pytest.CallInfo) -> None:
    state = item.config.stash[STATE]
    kept = kept_hint(lab.name, state.workspace) if state.settings.keep_failed else None
    failed = [record for record in lab.runs if record.failed]
    properties: list[tuple[str, str]] = []
    if failed:
        record = failed[-1]
        raised = getattr(call.excinfo.value, "result", None) if call.excinfo else None
        # The RunFailed the test raised already says who failed; a result the test judged itself does not.
        explained = failure_report(record, kept_hint=kept, explained=raised is record.result)
        if explained.detail:  # (a timeout the test's error explained has nothing to add)
            _add_to_longrepr(report, explained.headline, explained.detail)
        _add_logs(item, report, explained.sections)
        properties = explained.properties
    else:
        diagnosis = getattr(call.excinfo.value, "diagnosis", None) if call.excinfo else None
        if diagnosis is not None:  # a preflight that refused to start the run: what it found

            _add_to_longrepr(report, "ddplab: the run was not started", doctor_summary(diagnosis)
                             .replace("asked after the timeout", "before the run"))
        elif kept:
            _add_to_longrepr(report, "ddplab: the lab was kept", kept)
        if lab.runs:
            _add_logs(item, report, logs_report(lab.runs[-1]))
        properties = [("ddplab_lab", lab.name)]
    for prop in properties:
        item.user_properties.append(prop)  # the teardown report's, which JUnit writes
        report.user_properties.append(prop)  # this report's: xdist carries it to the controller


def _add_logs(item: pytest.Item, report: pytest.TestReport, sections: list[tuple[str, str]]) -> None:
    """Each node's log: a section of its own under the failure in the terminal, and in the item's
    captured stdout, which the teardown report carries into JUnit's <system-out>
    (with `-o junit_logging=system-out` or `all`)."""
    report.sections.extend(sections)
    for title, text in sections:
        item.add_report_section("call", "stdout", f"{title.removeprefix(SECTION_PREFIX + ': ')}\n{text}\n")


def _add_to_longrepr(report: pytest.TestReport, title: str, text: str) -> None:
    """A section under the failure itself: in the terminal and in JUnit's <failure> text."""
    if hasattr(report.longrepr, "addsection"):
        report.longrepr.addsection(title, text)
    else:
        report.sections.append((title, text))


class Controller:
    """What only the process that prints the summary does (not an xdist worker): collect a GitHub
    annotation for each failure it hears of, and sum the workers' counts."""

    def __init__(self, state: State):
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" or not report.failed or os.environ.get("GITHUB_ACTIONS") != "true":
            return
        properties = dict(report.user_properties)
        cause = properties.get("ddplab_root_cause")
        if not cause:
            return
        file, line = report.location[0], report.location[1] + 1
        site = properties.get("ddplab_call_site")
        if site:  # the line of the test that made the failing run
            file, _, number = str(site).rpartition(":")
            line = int(number)
        path = annotation_path(file, str(self.state.rootpath), os.environ.get("GITHUB_WORKSPACE"),
                               str(self.state.invoked_in))
        self.state.annotations.append(github_annotation(path, line, f"ddplab: {report.nodeid}", str(cause)))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        output = getattr(node, "workeroutput", {}).get(OUTPUT_KEY)
        if output:
            self.state.totals.add(PoolStats(**output))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        totals = self.state.totals
        if totals.tests:
            terminalreporter.write_line(summary_line(totals))
            if terminalreporter.config.getoption("verbose") > 0 and totals.names:
                terminalreporter.write_line(f"ddplab: labs {', '.join(sorted(totals.names))}")
            for line in totals.kept + totals.notes:
                terminalreporter.write_line(f"ddplab: {line}")
        for annotation in self.state.annotations:
            terminalreporter.write_line(annotation)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Every lab of this process goes (kept ones excepted); a worker tells the controller its count."""
    state = session.config.stash[STATE]
    stats = PoolStats()
    if state.pool is not None:
        state.pool.close()
        stats = state.pool.stats
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput[OUTPUT_KEY] = stats.as_dict()
    else:
        state.totals.add(stats)
