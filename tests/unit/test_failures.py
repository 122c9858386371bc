"""Which rank failed first, and what labctl says and exits with: held to recorded outputs of real
failed runs on a 3-node lab (tests/unit/failures/*.json, written by record.py there), and to the
terminal filter that keeps torchrun's reports and the consequences' tracebacks in the logs only."""

import json
from pathlib import Path

import pytest

from labctl.run.failures import Stream, consequence_of, judge
from labctl.run.result import RunResult
from labctl.run.terminal import TerminalFilter

from failures.recorded import recorded_lines, recorded_run

RECORDED = Path(__file__).parent / "failures"


def recorded(case: str) -> RunResult:
    return recorded_run(case)


# case: exit status, the first line's start, what the last lines must also say
CASES = {
    "exit3": (3, "rank 1 on node1 failed first (", ["exited with status 3", "(peer gone)", "logs: /runs/r1/node1.log"]),
    "raise": (1, "rank 1 on node1 failed first (", ["ValueError: deliberate failure on rank 1", "(peer gone)"]),
    "sigkill": (137, "rank 1 on node1 failed first (", ["killed by SIGKILL (out of memory?", "(peer gone)"]),
    "sigsegv": (139, "rank 1 on node1 failed first (", ["killed by SIGSEGV (segmentation fault)"]),
    "hang-timeout": (124, "--timeout-s 8 reached: rank 0 on node0, rank 1 on node1, rank 2 on node2 had not finished",
                     ["logs: /runs/r1"]),
    "lost-node-nnodes": (137, "node1 was lost first (", ["node lost", "(peer gone)", "logs: /runs/r1/node1.log"]),
    "static-exit3": (3, "rank 2 on node2 failed first (", ["exited with status 3", "(peer gone)"]),
    "static-raise": (1, "rank 0 on node0 failed first (", ["ValueError: deliberate failure on rank 0"]),
    "static-sigkill": (137, "rank 1 on node1 failed first (", ["killed by SIGKILL"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_root_cause_is_the_rank_that_failed_not_the_first_agent_to_exit(case):
    status, first, also = CASES[case]
    result = recorded(case)
    said = result.explain().splitlines()
    assert result.exit_status == status, said
    assert said[0].startswith(first), said
    for text in also:
        assert any(text in line for line in said), (text, said)
    assert not any("ChildFailedError" in line or "exitcode  :" in line for line in said)


@pytest.mark.parametrize("case", ["exit3", "raise", "sigkill", "sigsegv", "static-exit3", "static-raise"])
def test_every_other_rank_is_a_consequence(case):
    verdict = recorded(case).verdict
    assert [f.consequence for f in verdict.after] == ["peer gone", "peer gone"]
    assert verdict.root.consequence is None and verdict.root.node in {"node0", "node1", "node2"}
    assert sorted([verdict.root.rank] + [f.rank for f in verdict.after]) == [0, 1, 2]


def test_the_json_names_the_root_cause_and_every_node():
    doc = recorded("raise").to_dict()
    assert doc["ok"] is False and doc["exit_status"] == 1
    assert doc["root_cause"]["node"] == "node1" and doc["root_cause"]["rank"] == 1
    assert doc["root_cause"]["error"] == "ValueError: deliberate failure on rank 1"
    assert doc["root_cause"]["time"].startswith("20")
    assert sorted(doc["nodes"]) == ["node0", "node1", "node2"]
    assert doc["nodes"]["node1"]["ranks"] == [1] and doc["nodes"]["node1"]["log"] == "/runs/r1/node1.log"
    assert json.loads(json.dumps(doc)) == doc


def test_a_timeout_lists_who_was_still_running():
    doc = recorded("hang-timeout").to_dict()
    assert doc["exit_status"] == 124 and doc["timed_out"]
    assert doc["unfinished"] == ["rank 0 on node0", "rank 1 on node1", "rank 2 on node2"]


def test_sigkill_with_oom_kills_on_the_node_says_out_of_memory():
    result = recorded("sigkill")
    result.oom_kills = {"node0": 0, "node1": 2, "node2": 0}
    first = result.explain().splitlines()[0]
    assert "killed by SIGKILL (out of memory: the OOM killer has killed 2 processes in node1's memory cgroup" in first


def test_ctrl_c_exits_130():
    result = recorded("hang-timeout")
    result.timed_out, result.interrupted = False, True
    assert result.exit_status == 130 and result.explain().startswith("interrupted (Ctrl-C)")


def test_an_elastic_run_that_finished_on_enough_nodes_exits_0():
    result = recorded("lost-node-nnodes")
    for o in result.outcomes:
        if o.launch.node != "node1":
            o.exit_code = 0
    result.min_nodes = 2
    assert result.ok and result.exit_status == 0


@pytest.mark.parametrize("text, word", [
    ("RuntimeError: [pair.cc:553] Connection closed by peer [172.28.0.11]:33497", "peer gone"),
    ("RuntimeError: [pair.cc:537] Read error [172.28.0.11]:3486: Connection reset by peer", "peer gone"),
    ("RuntimeError: [unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation to complete", "peer silent"),
    ("torch.distributed.DistStoreError: Failed to recv, got 0 bytes. Connection was likely closed.", "peer gone"),
    ("ValueError: deliberate failure on rank 1", None),
    ("RuntimeError: CUDA out of memory", None),
])
def test_consequences_are_told_from_causes(text, word):
    assert consequence_of(text) == word


def test_two_ranks_failing_on_their_own_the_earlier_is_the_root():
    def stream(node, rank, error, second):
        lines = ["Traceback (most recent call last):", '  File "x.py", line 1', error]
        return Stream(node, lines, 1, rank=rank, ended_at=1_700_000_000 + second, torchrun=False)

    verdict = judge([stream("node0", 0, "KeyError: 'b'", 5), stream("node1", 1, "KeyError: 'a'", 2)], ok=False)
    assert (verdict.root.rank, verdict.root.error, verdict.exit_status) == (1, "KeyError: 'a'", 1)
    assert verdict.after[0].rank == 0 and verdict.after[0].consequence is None


def test_a_timeout_does_not_blame_a_rank_its_own_stop_made_fail():
    """Stopping node1 first can make rank 0, still running at the timeout, fail on its gloo pair
    ("Connection closed by peer") before node0 is stopped: that is the stop's doing. A rank whose
    launch had ended before the timeout still counts as failing before it."""
    gone = ["Traceback (most recent call last):", '  File "x.py", line 1',
            "RuntimeError: [pair.cc:553] Connection closed by peer [172.28.0.11]:1951"]
    stopped = Stream("node0", gone, 1, stopped=True, rank=0, ended_at=1_700_000_009, torchrun=False)
    live = {"node0": [0], "node1": [1], "node2": [2]}
    verdict = judge([stopped], ok=False, timed_out=True, live_ranks=live)
    assert (verdict.exit_status, verdict.root) == (124, None)
    assert verdict.unfinished == ["rank 0 on node0", "rank 1 on node1", "rank 2 on node2"]
    before = Stream("node0", ["ValueError: x"], 1, rank=0, ended_at=1_700_000_001, torchrun=False)
    assert judge([before], ok=False, timed_out=True, live_ranks=live).root.error == "ValueError: x"


def filtered(lines: list[str]) -> list[str]:
    """What the terminal shows of `lines`, fed one by one, then what is still held."""
    terminal = TerminalFilter()
    return [x for line in lines for x in terminal.feed(line)] + terminal.flush()


def shown(case: str, node: str) -> list[str]:
    """What the terminal shows of one node's recorded output."""
    return filtered(recorded_lines(case, node))


def test_the_root_cause_traceback_stays_on_the_terminal_and_torchruns_report_does_not():
    root = shown("raise", "node1")
    assert "[rank1]: ValueError: deliberate failure on rank 1" in root
    assert "[rank1]: Traceback (most recent call last):" in root
    assert not any("ChildFailedError" in line or "Root Cause" in line or "exitcode" in line for line in root)
    assert not any(line.startswith(("Traceback", "  File")) for line in root)  # torchrun's own stack
    assert any(line.startswith("FAIL_HOW rank=1") for line in root)  # ordinary output is untouched


def test_a_consequences_traceback_goes_to_the_log_only():
    for node in ("node0", "node2"):
        lines = shown("raise", node)
        assert lines == [next(x for x in lines if x.startswith("FAIL_HOW"))], lines


def test_a_survivors_callback_stacks_go_to_the_log_only():
    # node1's log of an elastic trainer run whose node2 was killed (a copy, nothing edited): its
    # error came from DDP's all-reduce hook, so after the exception line torch wrote blank lines and
    # two `At:` stacks, which reached the terminal until the filter dropped a consequence's tail too.
    lines = (RECORDED / "elastic-survivor-node1.log").read_text().splitlines()
    assert filtered(lines) == ["[rank 1/2 node1] step 60/60 loss 2.430710 (42 ms: compute 36, comm wait 4)"]


def test_a_root_causes_callback_stack_stays_on_the_terminal():
    lines = ["[rank1]: Traceback (most recent call last):", '[rank1]:   File "x.py", line 2, in <module>',
             "[rank1]: RuntimeError: Got the following error when running the callback: ValueError: mine", "",
             "[rank1]: At:", "[rank1]:   x.py(2): <lambda>", "", "FAIL_HOW rank=1"]
    assert filtered(lines) == lines


def test_a_traceback_cut_short_is_printed_at_the_end():
    terminal = TerminalFilter()
    assert terminal.feed("[rank3]: Traceback (most recent call last):") == []
    assert terminal.feed('[rank3]:   File "x.py", line 2, in <module>') == []
    assert terminal.flush() == ["[rank3]: Traceback (most recent call last):", '[rank3]:   File "x.py", line 2, in <module>']


KEEP_ALIVE = ("W1207 20:25:26.812000 31 torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:1315] The node "
              "'node2_31_0' has failed to send a keep-alive heartbeat to the rendezvous 'r' due to an error of type "
              "RendezvousConnectionError.")
STORE_CLIENT = "[W1207 20:25:26.813000 31 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=3): Connection reset"


def test_a_log_record_written_during_torchruns_traceback_leaves_it_held():
    # The agent's other threads log while its main thread prints the traceback (CI of 2026-12-07:
    # one such line ended the hold, and the whole ChildFailedError report reached the terminal).
    lines = recorded_lines("raise", "node1")
    at = lines.index("    run(args)") + 1
    shown = filtered(lines[:at] + [KEEP_ALIVE, STORE_CLIENT] + lines[at:])
    assert shown[-2:] == [KEEP_ALIVE, STORE_CLIENT], shown
    assert not any("ChildFailedError" in line or "Root Cause" in line or line.startswith("  File") for line in shown)


def test_torchruns_report_is_dropped_even_when_its_traceback_was_not_held():
    lines = ["raise ChildFailedError(", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
             "=" * 60, "Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 0)", "=" * 60,
             "after"]
    terminal = TerminalFilter()
    assert [x for line in lines for x in terminal.feed(line)] == ["raise ChildFailedError(", "after"]


CANCELLED = "slurmstepd-node0: error: *** STEP 5.0 ON node0 CANCELLED AT 2026-12-08T00:29:36 ***"


def dumped(type_name: str, text: str, prefix: str = "") -> list[str]:
    """What CPython writes for an exception it cannot print (sys.stderr gone): the object's dump."""
    return [prefix + line for line in ("object address  : 0x7f3f2ce23ac0", "object refcount : 2",
                                       "object type     : 0x3d4eb450", f"object type name: {type_name}",
                                       f"object repr     : {type_name}({text!r})", "lost sys.stderr")]


def test_a_step_cancelled_while_torchrun_prints_its_report_shows_slurms_line_and_no_traceback():
    # make test of 2026-12-08 (test_slurm_cluster): Slurm cancelled node0's step while torchrun printed
    # its traceback; srun relayed slurmstepd's line among the frames, and CPython, its sys.stderr gone,
    # dumped the ChildFailedError instead of writing its line. The line ended the hold, and the
    # traceback and the dump reached the terminal.
    lines = recorded_lines("raise", "node1")
    at = lines.index("    run(args)") + 1
    report = "\n" + "=" * 60 + "\nx.py FAILED\nRoot Cause (first observed failure):\n" + "=" * 60
    shown = filtered(lines[:at] + [CANCELLED] + dumped("ChildFailedError", report) + ["after"])
    assert shown[-2:] == [CANCELLED, "after"], shown
    assert not any(line.startswith(("Traceback", "  File", "object ", "lost sys.stderr")) for line in shown), shown


def test_a_dumped_exception_is_judged_as_its_line_would_be():
    frames = ["[rank1]: Traceback (most recent call last):", '[rank1]:   File "x.py", line 2, in <module>']
    mine = frames + dumped("ValueError", "mine", "[rank1]: ")
    terminal = TerminalFilter()
    assert [x for line in mine for x in terminal.feed(line)] == mine  # a root cause's, printed whole
    peer = dumped("RuntimeError", "Connection closed by peer", "[rank2]: ") + ["[rank2]: after"]
    assert [x for line in peer for x in terminal.feed(line)] == ["[rank2]: after"]  # a consequence's, with no traceback
