"""The labs of one test process (one pytest-xdist worker): brought up on first need, handed to the
next test of the same topology, torn down when a test has made them unfit or the session ends.

A test gets a `TestLab`, the API's `Lab` that also remembers what the test did to it: every run's
result (for the report), the faults and CPU limits it changed (a lab with a fault is never handed
on), and whether it shaped the links (cleared before the next test).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping

from labctl.api import Lab
from labctl.errors import LabError, RunFailed
from labctl.pytest_plugin.report import PoolStats, RunRecord, doctor_summary, kept_hint
from labctl.pytest_plugin.settings import LabRequest, Settings, lab_name

MAX_IDLE_LABS = 2  # labs of other topologies kept up for later tests; the oldest beyond this goes


class TestLab(Lab):
    """The `Lab` the `ddp_lab` fixture yields. Every run gets the session's timeout unless it
    gives its own, and is recorded; a run that times out comes back with doctor's findings."""

    __test__ = False  # a class named Test* that pytest must not collect

    def __init__(self, *args, run_timeout_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.run_timeout_s = run_timeout_s
        self.runs: list[RunRecord] = []
        self.unfit: str | None = None  # why no other test may have it
        self.shaped = False
        self.served_failure = False  # a test failed on it: its run logs stay on disk
        self.key: tuple = ()  # the LabRequest.key it was brought up for
        self._test_file: str | None = None

    def begin_test(self, test_file: str) -> None:
        self.runs = []
        self._test_file = test_file

    def run(self, *argv: str, **options):
        __tracebackhide__ = True  # the test's line is what matters; labctl's frames say nothing more
        try:
            return super().run(*argv, **options)
        except RunFailed as exc:
            raise exc.with_traceback(None) from None

    def execute(self, plan, *, echo: bool | str = True, check: bool = True):
        __tracebackhide__ = True
        site = self._call_site()
        if plan.timeout_s is None:  # the session's limit, unless the test gave the run its own
            plan = replace(plan, timeout_s=self.run_timeout_s)
        try:
            result = super().execute(plan, echo=echo, check=check)
        except RunFailed as exc:
            record = self._record(exc.result, site)
            if record.doctor:  # in the exception's own message: a hang says what doctor saw
                exc.args = (f"{exc.args[0]}\n{record.doctor}", *exc.args[1:])
            raise exc.with_traceback(None) from None
        self._record(result, site)
        return result

    def _record(self, result, site) -> RunRecord:
        record = RunRecord(result, site, lab=self.name)
        if result is not None and result.timed_out:
            self.unfit = "a run timed out on it"
            record.doctor = self._doctor()
        self.runs.append(record)
        return record

    def _doctor(self) -> str:
        try:
            return doctor_summary(self.doctor())
        except LabError as exc:
            return f"doctor could not look at the lab after the timeout: {exc}"

    def _call_site(self) -> tuple[str, int] | None:
        """Where in the test the run was made: the innermost frame in the test's file."""
        frame = sys._getframe(1)
        while frame is not None:
            if self._test_file and frame.f_code.co_filename == self._test_file:
                return frame.f_code.co_filename, frame.f_lineno
            frame = frame.f_back
        return None

    def fault(self, kind, node: str) -> str:
        self.unfit = f"the test injected a fault ({kind} {node})"
        return super().fault(kind, node)

    def slow(self, node: str, cpus: float | None) -> float | None:
        self.unfit = f"the test changed {node}'s CPU limit"
        return super().slow(node, cpus)

    def shape(self, *args, **kwargs):
        self.shaped = True
        return super().shape(*args, **kwargs)


class LabPool:
    """One process's labs, by topology (`LabRequest.key`)."""

    def __init__(self, settings: Settings, session: str, worker: str, workspace: Path,
                 connect: Callable[[], object], owner: Mapping[str, str]):
        self.settings = settings
        self.session = session
        self.worker = worker
        self.workspace = workspace
        self._connect = connect
        self._owner = dict(owner)  # the owner variables: given to each lab, whatever os.environ says by then
        self._client = None
        self._engine_error: LabError | None = None
        self.idle: OrderedDict[tuple, TestLab] = OrderedDict()
        self.busy: list[TestLab] = []  # handed to a test and not yet back
        self.stats = PoolStats()

    def client(self):
        """The engine's client, made once; the same StateError for every test when none answers."""
        if self._engine_error is not None:
            raise self._engine_error
        if self._client is None:
            try:
                self._client = self._connect()
            except LabError as exc:
                self._engine_error = exc
                raise
        return self._client

    def acquire(self, spec: LabRequest, test_file: str) -> TestLab:
        """A lab for one test: an idle one of its topology that is still whole, else a new one;
        shaped as the test's marker says."""
        self.stats.tests += 1
        lab = None if spec.fresh else self.idle.pop(spec.key, None)
        if lab is not None and not self._whole(lab):
            self._remove(lab)
            lab = None
        if lab is None:
            lab = self._bring_up(spec)
        self.busy.append(lab)
        lab.begin_test(test_file)
        if spec.shaped:
            try:
                lab.shape(spec.bw, delay=spec.delay)
            except BaseException:
                self.release(lab, failed=False, fresh=True)
                raise
        return lab

    def release(self, lab: TestLab, *, failed: bool, fresh: bool) -> str | None:
        """After a test: back to the pool, or removed (a fresh lab, one the test made unfit, one a
        test failed on), or kept for debugging. Returns the sentence saying it was kept, if it was."""
        if lab in self.busy:
            self.busy.remove(lab)
        if failed:
            lab.served_failure = True
            if self.settings.keep_failed:
                hint = kept_hint(lab.name, self.workspace)
                self.stats.kept.append(hint)
                return hint
        if failed or fresh or lab.unfit:
            self._remove(lab)
            return None
        if lab.shaped:
            try:
                lab.clear_shape()
                lab.shaped = False
            except LabError:
                self._remove(lab)
                return None
        older = self.idle.pop(lab.key, None)
        if older is not None:  # (a test marked fresh made a second lab of this key: one is enough)
            self._remove(older)
        self.idle[lab.key] = lab
        while len(self.idle) > MAX_IDLE_LABS:
            self._remove(self.idle.popitem(last=False)[1])
        return None

    def close(self) -> None:
        """The session's end: every lab goes, idle or (after an interrupted test) still busy."""
        while self.busy:
            self._remove(self.busy.pop())
        while self.idle:
            self._remove(self.idle.popitem(last=False)[1])

    def _bring_up(self, spec: LabRequest) -> TestLab:
        client = self.client()
        self.stats.labs += 1
        name = lab_name(self.session, self.worker, self.stats.labs)
        said: list[str] = []
        lab = TestLab(spec=replace(spec.lab, lab=name), workspace=self.workspace, client=client, report=said.append,
                      environ={**os.environ, **self._owner}, run_timeout_s=self.settings.run_timeout_s)
        lab.key = spec.key
        started = time.monotonic()
        try:
            lab.up()
        except BaseException as exc:
            self._remove(lab)
            if said and isinstance(exc, LabError):
                exc.message = f"{exc.message} (bringing up lab {name}; labctl said: {'; '.join(said)})"
            raise
        finally:
            self.stats.up_s += time.monotonic() - started
        self.stats.names.append(name)
        return lab

    def _whole(self, lab: TestLab) -> bool:
        """Every node still running (something outside the fixture may have stopped one)."""
        try:
            states = lab.status()
        except LabError:
            return False
        return len(states) == lab.config.nodes and all(n.state == "running" for n in states)

    def _remove(self, lab: TestLab) -> None:
        started = time.monotonic()
        try:
            lab.down(volumes=True)
        except LabError:
            pass  # no engine left to remove it from: nothing of it is left there either
        finally:
            self.stats.down_s += time.monotonic() - started
        if not lab.served_failure:  # a failed test's run logs stay where its report says they are
            shutil.rmtree(lab.directory, ignore_errors=True)
