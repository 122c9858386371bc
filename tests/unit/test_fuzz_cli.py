"""Every labctl command and option, fuzzed: never a traceback, exit status 2 with a message on bad
input, and nothing created.

The grammar comes from click's own command tree, so a new command or option is fuzzed without
touching this file. No Docker engine is reachable (DOCKER_HOST points nowhere), so input that
passes validation ends at "no Docker engine answers" (exit 1: the machine's state, not the
input): what is checked is that bad input never gets further than that, and never leaves a file
behind.
"""

from __future__ import annotations

import os

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labctl.cli import main


def leaf_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            out += leaf_commands(command, prefix + (name,))
        else:
            out.append((prefix + (name,), command))
    return out


COMMANDS = leaf_commands(main)
NASTY = st.sampled_from(["", "0", "-1", "1", "3", "65", "1e309", "nan", "inf", "-0", "0.0", "abc", "1:2", "3:1",
                         "1,2", ",", "node0", "node9", "100mbit", "100mbps", "1gbit", "10ms", "eth0", "x" * 300,
                         "../../etc", "a b", "ñ", "--", "-m", "1K:64M", "172.28.0.0/33", "node2=0.25",
                         "node2=", "=", "2:4"])
# argv entries are C strings: a NUL byte cannot reach labctl from any shell or exec call, so it is
# not generated (click's path checks would raise on it, an input no user can give).
VALUES = NASTY | st.text(alphabet=st.characters(blacklist_characters="\x00"), min_size=0, max_size=12)


@st.composite
def invocations(draw):
    path, command = draw(st.sampled_from(COMMANDS))
    argv = list(path)
    options = [p for p in command.params if isinstance(p, click.Option) and p.name not in ("help",)]
    for option in draw(st.lists(st.sampled_from(options), max_size=4)) if options else []:
        argv.append(option.opts[-1])
        if not option.is_flag:
            argv.append(draw(VALUES))
    for argument in (p for p in command.params if isinstance(p, click.Argument)):
        if draw(st.booleans()):
            argv.append(draw(VALUES))
    return argv


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith("DDPLAB_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    return tmp_path


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=invocations())
def test_any_input_is_a_clear_exit_never_a_traceback(sandbox, argv):
    before = set(sandbox.rglob("*"))
    result = CliRunner().invoke(main, argv, catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"labctl {argv!r} raised {result.exception!r}") from result.exception
    output = result.output
    assert "Traceback" not in output, (argv, output)
    if result.exit_code == 0:
        return  # valid input that needs no engine (cost, env, --help): it may write what it was asked to
    reached_the_engine = result.exit_code == 1 and "no Docker engine answers at" in output
    no_ssh_lab = result.exit_code == 1 and "no inventory at " in output  # the lab's state: no `up --ssh` here
    # `trace .` (or any folder that exists): a run folder with nothing in it to draw, the folder's state
    no_run_records = result.exit_code == 1 and "holds no metrics and no profiler traces" in output
    assert result.exit_code == 2 or reached_the_engine or no_ssh_lab or no_run_records, (argv, result.exit_code, output)
    assert output.strip(), argv
    assert set(sandbox.rglob("*")) == before, (argv, "bad input left files behind")


def test_the_grammar_covers_every_command():
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"up", "down", "run", "doctor", "fault", "shape", "bench scaling", "bench straggler", "cost", "env",
            "hosts check", "hosts sync", "hosts run"} <= names


LONG_NAME = "x" * 300  # longer than any file name Linux allows (255 bytes)


def every_value_slot():
    """An argv for each argument and each valued option of every command, given LONG_NAME."""
    for path, command in COMMANDS:
        for param in command.params:
            if isinstance(param, click.Argument):
                yield [*path, LONG_NAME]
            elif isinstance(param, click.Option) and not param.is_flag and param.name != "help":
                yield [*path, param.opts[-1], LONG_NAME]


@pytest.mark.parametrize("argv", list(every_value_slot()),
                         ids=lambda argv: " ".join(argv).replace(LONG_NAME, "<300 x>"))
def test_a_name_too_long_for_the_os_is_a_clear_exit(sandbox, argv):
    """The fuzzer above draws this value now and then; every slot gets it here, every run (a path
    component over 255 bytes makes Path.is_dir() raise ENAMETOOLONG where it returns False for ENOENT)."""
    result = CliRunner().invoke(main, argv, catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"labctl {argv!r} raised {result.exception!r}") from result.exception
    assert "Traceback" not in result.output
    assert result.exit_code in (0, 1, 2), (argv, result.exit_code, result.output)
