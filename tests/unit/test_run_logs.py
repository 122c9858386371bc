"""A run's saved logs read back: --tail on real files, and `logs -f` following a run folder that a
stand-in for the executor grows line by line, then ends by writing the result file."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from labctl.errors import ConfigError, LabError
from labctl.run.logs import check_tail, follow_run_logs, run_logs, tail_lines
from labctl.run.result import RESULT_FILE


@pytest.mark.parametrize("data, lines, expected", [
    (b"a\nb\nc\n", None, b"a\nb\nc\n"),
    (b"a\nb\nc\n", 2, b"b\nc\n"),
    (b"a\nb\nc\n", 3, b"a\nb\nc\n"),
    (b"a\nb\nc\n", 10, b"a\nb\nc\n"),
    (b"a\nb\nc\n", 0, b""),
    (b"a\nb\npartial", 2, b"b\npartial"),  # an unterminated last line is a line
    (b"a\nprogress\r50%\rdone\n", 1, b"progress\r50%\rdone\n"),  # only \n ends a line
    (b"a\n\n\n", 2, b"\n\n"),  # empty lines count
    (b"", 3, b""),
])
def test_tail_lines(data, lines, expected):
    assert tail_lines(data, lines) == expected


@pytest.mark.parametrize("tail", [-1, 1.5, "3", True])
def test_a_bad_tail_is_refused(tail):
    with pytest.raises(ConfigError, match="invalid --tail=.*0 or more"):
        check_tail(tail)


def make_run(lab_dir, run_id="r1", logs=None, ended=False):
    run = lab_dir / "runs" / run_id
    run.mkdir(parents=True)
    for node, text in (logs or {}).items():
        (run / f"{node}.log").write_text(text)
    latest = lab_dir / "runs" / "latest"
    if latest.is_symlink():
        latest.unlink()
    latest.symlink_to(run_id)
    if ended:
        (run / RESULT_FILE).write_text("{}")
    return run


def test_run_logs_tail_each_node_in_rank_order(tmp_path):
    make_run(tmp_path, logs={"node10": "x\ny\n", "node2": "1\n2\n3\n", "node0": "only\n"})
    assert run_logs(tmp_path, None, None, tail=2) == [("node0", "only\n"), ("node2", "2\n3\n"), ("node10", "x\ny\n")]
    assert run_logs(tmp_path, "r1", "node2", tail=1) == [("node2", "3\n")]
    assert run_logs(tmp_path, None, "node2") == [("node2", "1\n2\n3\n")]
    with pytest.raises(LabError, match="no log for 'node7'") as caught:
        run_logs(tmp_path, None, "node7")
    assert "node0, node2, node10" in caught.value.hint
    with pytest.raises(LabError, match="no run r9") as caught:
        run_logs(tmp_path, "r9", None)
    assert caught.value.hint == "runs here: r1"


def test_no_run_yet(tmp_path):
    with pytest.raises(LabError, match="no run yet"):
        run_logs(tmp_path, None, None)
    with pytest.raises(LabError, match="no run yet"):
        list(follow_run_logs(tmp_path, None, None))


class Executor:
    """Plays the executor's part between two looks of the follower: each call to sleep() runs the
    next step (append lines, start a node's log, write the result file)."""

    def __init__(self, run, steps):
        self.run = run
        self.steps = list(steps)
        self.sleeps = 0

    def append(self, node, text):
        with open(self.run / f"{node}.log", "a") as f:
            f.write(text)

    def sleep(self, _seconds):
        self.sleeps += 1
        assert self.sleeps < 50, "the follower did not stop after the run ended"
        if self.steps:
            self.steps.pop(0)(self)


def test_follow_prints_what_is_there_then_new_lines_until_the_run_ends(tmp_path):
    run = make_run(tmp_path, logs={"node0": "old 1\nold 2\nold 3\n"})
    executor = Executor(run, [
        lambda e: e.append("node0", "new 1\n"),
        lambda e: e.append("node1", "late node, first line\npart"),  # a node whose log starts later, half a line
        lambda e: None,  # nothing new: the follower keeps looking
        lambda e: e.append("node1", "ial line\n"),
        lambda e: (e.append("node0", "last\nno newline at the end"), (run / RESULT_FILE).write_text("{}")),
    ])
    chunks = list(follow_run_logs(tmp_path, None, None, tail=2, poll_s=0, sleep=executor.sleep))
    assert chunks == [
        ("node0", "old 2\nold 3\n"),
        ("node0", "new 1\n"),
        ("node1", "late node, first line\n"),
        ("node1", "partial line\n"),
        ("node0", "last\n"),
        ("node0", "no newline at the end\n"),  # the rest, once the run has ended
    ]
    assert executor.sleeps == 5  # it stopped at the first look after the result file appeared


def test_follow_of_an_ended_run_prints_it_and_stops(tmp_path):
    make_run(tmp_path, logs={"node0": "a\nb\n", "node1": "c\n"}, ended=True)
    never = Executor(tmp_path, [])
    assert list(follow_run_logs(tmp_path, None, None, sleep=never.sleep)) == [("node0", "a\nb\n"), ("node1", "c\n")]
    assert never.sleeps == 0


def test_follow_one_node_whose_log_has_not_started(tmp_path):
    run = make_run(tmp_path, logs={"node0": "zero\n"})
    (tmp_path / "node1.env").write_text("NODE_RANK=1\n")  # node1 is a node of the lab
    executor = Executor(run, [lambda e: e.append("node1", "one\n"), lambda e: (run / RESULT_FILE).write_text("{}")])
    assert list(follow_run_logs(tmp_path, None, "node1", poll_s=0, sleep=executor.sleep)) == [("node1", "one\n")]
    with pytest.raises(LabError, match="no log for 'node9'"):  # no such node: refused, not waited for
        list(follow_run_logs(tmp_path, None, "node9", poll_s=0, sleep=executor.sleep))


def test_follow_stays_on_the_run_it_started_with(tmp_path):
    first = make_run(tmp_path, "r1", logs={"node0": "first run\n"})

    def new_run_starts(_e):
        make_run(tmp_path, "r2", logs={"node0": "second run\n"})  # `latest` now points at r2

    executor = Executor(first, [new_run_starts, lambda e: (first / RESULT_FILE).write_text("{}")])
    assert list(follow_run_logs(tmp_path, None, None, poll_s=0, sleep=executor.sleep)) == [("node0", "first run\n")]


def test_cli_logs_tail_and_follow(tmp_path, monkeypatch):
    from labctl.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DDPLAB_LAB", raising=False)
    make_run(tmp_path / ".lab" / "ddplab", logs={"node0": "1\n2\n3\n", "node1": "x\n"}, ended=True)
    result = CliRunner().invoke(main, ["logs", "node0", "--tail", "2"], catch_exceptions=False)
    assert (result.exit_code, result.output) == (0, "2\n3\n")  # one node: no header, as `tail` prints one file
    result = CliRunner().invoke(main, ["logs", "-f", "-n", "1"], catch_exceptions=False)
    assert (result.exit_code, result.output) == (0, "==> node0 <==\n3\n==> node1 <==\nx\n")
    result = CliRunner().invoke(main, ["logs", "--tail", "-3"], catch_exceptions=False)
    assert result.exit_code == 2 and "invalid --tail=-3: must be a whole number of lines, 0 or more" in result.output


def test_cli_follow_ctrl_c_is_a_quiet_130(tmp_path, monkeypatch):
    from labctl.cli import main
    from labctl.session import LabSession

    def interrupted(*_args, **_kwargs):
        yield "node0", "a line\n"
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(LabSession, "follow_logs", interrupted)
    result = CliRunner().invoke(main, ["logs", "-f"], catch_exceptions=False)
    assert (result.exit_code, result.output) == (130, "==> node0 <==\na line\n")
