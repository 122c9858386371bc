"""The table of known limits (labctl/run/known.py) as the failure report uses it: held to real runs
recorded on a 3-node lab (tests/unit/failures/limit-*.json, record.py), and to the rules of the
lookup. That each entry's message is what the pinned torch really says is
tests/integration/test_known_limits.py's to check, on a lab."""

import re
from pathlib import Path

import pytest

from labctl.run.known import LIMITS, known_limit

from failures.recorded import recorded_run

SCRIPT = Path(__file__).parents[1] / "integration" / "scripts" / "meets_a_limit.py"


@pytest.mark.parametrize("case, name", [("limit-gloo-no-future", "gloo-no-future"),
                                        ("limit-no-compiler-torchrun", "no-compiler")])
def test_a_recorded_run_that_met_a_limit_ends_with_why_and_the_fix(case, name):
    result = recorded_run(case)
    lines = result.explain().splitlines()
    (limit,) = [entry for entry in LIMITS if entry.name == name]
    assert lines[0].startswith("rank ") and " failed first (" in lines[0], lines
    assert lines[-3:-1] == limit.lines() and lines[-1].startswith("logs: "), lines
    assert result.to_dict()["root_cause"]["known"] == limit.to_dict()


@pytest.mark.parametrize("case", ["raise", "exit3", "sigkill", "hang-timeout", "static-raise"])
def test_a_failure_of_the_scripts_own_gets_no_limit(case):
    result = recorded_run(case)
    assert result.known_limit() is None
    assert not any(line.startswith(("why: ", "fix: ")) for line in result.explain().splitlines())
    root = result.to_dict()["root_cause"]
    assert root is None if case == "hang-timeout" else root["known"] is None, root


def test_the_error_line_decides_before_the_rest_of_the_output():
    """A node's output can hold another limit's words (a warning, a message printed by the script);
    the failed rank's own error is what the report explains."""
    lines = ["note: this script never calls torch.cuda; Torch not compiled with CUDA enabled is not its problem"]
    limit = known_limit("RuntimeError: Work::getFuture not implemented.", lines)
    assert limit is not None and limit.name == "gloo-no-future"


def test_a_generic_message_needs_its_context():
    """`Invalid scalar type` is gloo's only where the traceback went through c10d."""
    assert known_limit("RuntimeError: Invalid scalar type", ["  File \"x.py\", line 3, in <module>"]) is None
    through_c10d = ['  File ".../torch/distributed/distributed_c10d.py", line 3252, in all_reduce']
    assert known_limit("RuntimeError: Invalid scalar type", through_c10d).name == "gloo-dtype"


def test_every_entry_has_a_name_the_script_makes_and_says_where_and_how_to_fix():
    names = [limit.name for limit in LIMITS]
    assert len(set(names)) == len(names), names
    made = set(re.findall(r'name == "([a-z-]+)"', SCRIPT.read_text()))
    assert made == set(names), (made, names)
    for limit in LIMITS:
        assert limit.what and limit.where and limit.fix, limit
        assert not limit.what.endswith(".") and not limit.fix.endswith("."), limit  # the lines add their own ends


def test_ranks_that_failed_as_the_first_did_are_named_in_one_line():
    """Code that meets a limit meets it on every rank: one line for the rest, not the error again."""
    lines = recorded_run("limit-gloo-no-future").explain().splitlines()
    assert lines[1] in ("then rank 1 on node1 and rank 2 on node2 failed the same way",
                        "then rank 2 on node2 and rank 1 on node1 failed the same way"), lines
    assert sum("Work::getFuture" in line for line in lines) == 1, lines


def test_a_compile_cache_entry_that_cannot_be_used_is_said_once_per_rank_not_in_torchs_warnings():
    """Real lines of a rank whose shared cache held corrupt entries (tests/unit/failures/
    corrupt-compile-cache-node0.log): torch warns, a traceback each time, and compiles afresh."""
    from labctl.run.terminal import TerminalFilter

    lines = (Path(__file__).parent / "failures" / "corrupt-compile-cache-node0.log").read_text().splitlines()
    assert sum("unable to load compiled graph" in line for line in lines) == 2
    shown = TerminalFilter()
    printed = [out for line in lines + [line.replace("[rank0]", "[rank1]") for line in lines]
               for out in shown.feed(line)] + shown.flush()
    assert printed == [f"[rank{r}]: labctl: an entry of the compile cache could not be used (fx graph cache unable "
                       "to load compiled graph); this rank compiles afresh (torch's warnings about it are in the "
                       "node's log)" for r in (0, 1)], printed
