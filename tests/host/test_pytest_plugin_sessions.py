"""The pytest plugin in real pytest sessions (subprocesses) that need no engine: DOCKER_HOST points
nowhere, so a test asking for a lab meets the missing engine. Bad options and markers give one
clear line and no traceback; a missing engine fails (or, when asked, skips) the tests that need a
lab, and nothing else; the session's owner variables are set for labctl to label labs with."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = ["-p", "labctl.pytest_plugin", "-p", "no:ddplab"]  # by module, whether or not the entry point is installed
NOWHERE = "unix:///nonexistent/docker.sock"

TESTS = '''
import os

import pytest


def test_plain():
    assert os.environ["DDPLAB_OWNER_PID"] == str(os.getpid())
    assert os.environ["DDPLAB_OWNER_SESSION"].startswith("pytest-")


def test_needs_a_lab(ddp_lab):
    pass


@pytest.mark.ddplab(node=3)
def test_bad_marker(ddp_lab):
    pass
'''


def pytest_session(tmp_path: Path, *args: str, ini: str = "", tests: str = TESTS) -> subprocess.CompletedProcess:
    (tmp_path / "test_session.py").write_text(textwrap.dedent(tests))
    (tmp_path / "pytest.ini").write_text("[pytest]\n" + ini)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PYTEST_", "DDPLAB_")) and key != "DOCKER_CONTEXT"}
    env.update(PYTHONPATH=str(REPO), DOCKER_HOST=NOWHERE, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "pytest", *PLUGIN, "-p", "no:cacheprovider", "-v", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def outcome(result: subprocess.CompletedProcess, test: str) -> str:
    """PASSED, FAILED, ERROR or SKIPPED, from the verbose progress lines (-v)."""
    for line in result.stdout.splitlines():
        words = line.split()
        if f"test_session.py::{test}" in words:
            for word in ("ERROR", "FAILED", "PASSED", "SKIPPED"):
                if word in words:
                    return word
    raise AssertionError(f"{test} not in the summary:\n{result.stdout}")


def test_without_an_engine_the_tests_that_need_a_lab_fail_with_labctls_message(tmp_path):
    result = pytest_session(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert outcome(result, "test_plain") == "PASSED"
    assert outcome(result, "test_needs_a_lab") == "ERROR"
    assert f"ddplab: this test needs a lab and no Docker engine answers at {NOWHERE}" in result.stdout
    assert "--ddplab-no-engine=skip skips such tests instead" in result.stdout
    assert "Traceback" not in result.stdout and "ddplab: " not in result.stdout.split("short test summary")[1] \
        .split("ERROR")[0]  # no summary line: no lab was brought up
    # The marker is checked before the engine is asked: its error is the marker's own.
    assert outcome(result, "test_bad_marker") == "ERROR"
    assert "ddplab: @pytest.mark.ddplab has no argument node" in result.stdout


def test_skip_is_what_was_asked_for_not_the_default(tmp_path):
    result = pytest_session(tmp_path, "--ddplab-no-engine=skip")
    assert outcome(result, "test_needs_a_lab") == "SKIPPED"
    assert "no Docker engine answers" in result.stdout
    assert outcome(result, "test_bad_marker") == "ERROR"  # a typo is never skipped
    ini = pytest_session(tmp_path, ini="ddplab_no_engine = skip\n")
    assert outcome(ini, "test_needs_a_lab") == "SKIPPED"


@pytest.mark.parametrize("args, ini, says", [
    (["--ddplab-nodes", "0"], "", "ddplab: invalid --ddplab-nodes='0': must be from 1 to 64"),
    (["--ddplab-run-timeout", "soon"], "", "ddplab: invalid --ddplab-run-timeout='soon': must be a number of seconds"),
    (["--ddplab-no-engine", "maybe"], "", "ddplab: invalid --ddplab-no-engine='maybe': must be fail"),
    ([], "ddplab_run_timeout = -5\n", "ddplab: invalid ddplab_run_timeout (ini)='-5'"),
    ([], "ddplab_keep_failed = sometimes\n", "ddplab: invalid ddplab_keep_failed (ini)='sometimes': must be true or false"),
])
def test_a_bad_option_or_ini_value_is_a_usage_error_with_no_traceback(tmp_path, args, ini, says):
    result = pytest_session(tmp_path, *args, ini=ini)
    assert result.returncode == 4  # pytest's usage error
    assert says in result.stderr and "Traceback" not in result.stderr + result.stdout


def test_under_xdist_every_worker_says_the_same(tmp_path):
    pytest.importorskip("xdist")
    result = pytest_session(tmp_path, "-n", "2", "-k", "needs_a_lab or plain")
    assert result.returncode == 1, result.stdout + result.stderr
    assert outcome(result, "test_plain") == "PASSED" and outcome(result, "test_needs_a_lab") == "ERROR"
    assert "no Docker engine answers" in result.stdout and "INTERNALERROR" not in result.stdout + result.stderr


def test_a_session_without_a_test_that_needs_a_lab_leaves_the_environment_alone(tmp_path):
    result = pytest_session(tmp_path, tests='''
        import os


        def test_plain():
            assert "DDPLAB_OWNER_PID" not in os.environ and "DDPLAB_OWNER_SESSION" not in os.environ
    ''')
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ddplab:" not in result.stdout  # and no summary line
