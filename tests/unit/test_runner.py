"""How a failed run is explained: the node, its exit status, its error line, and what a known way of
dying means."""

from pathlib import Path

from labctl.run.launch import Launch
from labctl.run.result import Outcome, RunResult

# Node output when a worker aborted at exit (torchrun --standalone, plain_ddp.py, torch 2.13), as seen here.
EXIT_RACE = """PLAIN_DDP rank=1 world=2 local_rank=0 rank_sum=1 replicas_equal=True
terminate called without an active exception
E1122 13:31:21.911000 26595 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) local_rank: 0 (pid: 26599) of binary: /opt/venv/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  exitcode  : -6 (pid: 26599)  (SIGABRT)
  traceback : Signal 6 (SIGABRT) received by PID 26599""".splitlines()


def failed(lines, node="node1", code=1):
    return Outcome(Launch(node, node, ["torchrun", "x.py"]), exit_code=code, lines=lines)


def test_a_worker_that_aborted_at_exit_is_explained():
    culprit = failed(EXIT_RACE)
    other = Outcome(Launch("node0", "node0", ["torchrun", "x.py"]), exit_code=None, stopped=True)
    text = RunResult(Path("/r"), [other, culprit], culprit).explain()
    assert text.startswith("node1 failed first (13:31:21): killed by SIGABRT (aborted)")
    assert "why: it aborted while Python was exiting, after its work" in text
    assert "ending, once it has written and flushed everything and left the process group, with os._exit(0)" in text
    assert "then labctl stopped node0" in text and text.endswith("logs: /r/node1.log")


def test_an_ordinary_error_gets_its_own_line_and_no_guess():
    culprit = failed(["Traceback (most recent call last):", "ValueError: deliberate failure on rank 1"])
    text = RunResult(Path("/r"), [culprit], culprit).explain()
    assert "ValueError: deliberate failure on rank 1" in text and "why:" not in text


def test_a_summary_line_that_is_not_json_is_passed_over_not_a_crash():
    """A script's own "SUMMARY {" line, or one cut short on its way (srun cut the trainer's at 1,024
    bytes once): the run's result stands, with the SUMMARY that parses or none."""
    from labctl.run.result import find_summary

    assert find_summary(['SUMMARY {"final_loss": 2.5, "run_dir": "/t', "step 1"]) is None
    assert find_summary(['SUMMARY {"final_loss": 2.5, "run_dir": "/t', 'SUMMARY {"final_loss": 2.5}']) == \
           {"final_loss": 2.5}
    assert find_summary(["SUMMARY {of my own}", "SUMMARY {}"]) == {}
