"""What every test here needs of the host: torch, for the tests that run the trainer on this machine.

labctl itself needs no torch (the nodes bring their own), so `make demo` leaves it out of .venv;
`make test` adds its CPU build (`make host-torch`). Without it the trainer's tests cannot import,
and one clear line is better than a screen of ImportErrors.

A test module's line for the end of the session (the docs' tally) is printed here when an xdist
worker ran it: the worker's own terminal summary is never shown.

labctl's output follows COLUMNS when it is not a terminal. pytest imports readline, which puts
COLUMNS=80 and LINES=24 into the environment of every process pytest starts (pytest-xdist's
workers among them), though not into pytest's own os.environ. A worker's own output is never
shown, so there COLUMNS is set to 200, the width labctl uses without it and the one the tests'
expectations were written for; the tests' own `labctl` subprocesses get 200 from their helpers.

Hypothesis's tests run without its 200 ms deadline per example: `make test` runs the unit tier at
idle priority beside the `alone` lab tests, where an example that takes 0.06 ms took 302 ms while
a lab test had the CPU, and Hypothesis failed it as flaky. What they check is the answers, not the
time; the suite's times are measured apart (docs/explanation/measurements.md).
"""

import importlib.util
import os

import pytest
from hypothesis import settings

settings.register_profile("ddplab", deadline=None)
settings.load_profile("ddplab")

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["COLUMNS"] = "200"


def pytest_configure(config):
    if importlib.util.find_spec("torch") is None:
        pytest.exit("the tests run the trainer on this machine and need torch in this Python: `make host-torch` "
                    "installs its CPU build into .venv (`make test` does it for you)", returncode=1)


WORKER_LINES: list[str] = []


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, on the controller
def pytest_testnodedown(node, error):
    WORKER_LINES.extend(getattr(node, "workeroutput", {}).get("summary_lines", []))


def pytest_terminal_summary(terminalreporter):
    for line in WORKER_LINES:
        terminalreporter.write_line(line)
