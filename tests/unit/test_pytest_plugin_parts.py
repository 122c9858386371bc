"""The pytest plugin's pure parts: settings from options and ini keys, a test's lab from its
markers, which labs are interchangeable, lab names, and the report of a failed run, built from
recorded real runs (tests/unit/failures/) with their logs written as the executor writes them."""

from __future__ import annotations

from pathlib import Path

import pytest
from failures.recorded import recorded_run
from hypothesis import given
from hypothesis import strategies as st

from labctl.diagnose.findings import Diagnosis, Finding
from labctl.errors import ConfigError, LabError
from labctl.pytest_plugin.report import (
    PoolStats,
    RunRecord,
    annotation_path,
    doctor_summary,
    excerpt,
    failure_report,
    github_annotation,
    headline,
    summary_line,
)
from labctl.pytest_plugin.settings import (
    DEFAULT_RUN_TIMEOUT_S,
    Settings,
    lab_name,
    lab_request,
    resolve_settings,
    worker_id,
)
from labctl.run.result import RunResult
from labctl.spec.labspec import SETTINGS, LabSpec

# ------------------------------------------------------------------------------------ settings


def test_defaults_when_nothing_is_given():
    assert resolve_settings({}, {}) == Settings(nodes=3, image=None, run_timeout_s=DEFAULT_RUN_TIMEOUT_S,
                                                keep_failed=False, no_engine="fail", fresh=False)


def test_the_command_line_wins_over_the_ini_file():
    settings = resolve_settings({"nodes": "4", "keep_failed": True}, {"nodes": "2", "run_timeout_s": "60",
                                                                      "keep_failed": "false", "no_engine": "skip"})
    assert (settings.nodes, settings.keep_failed, settings.run_timeout_s, settings.no_engine) == (4, True, 60.0, "skip")


def test_an_empty_ini_value_is_not_set():
    assert resolve_settings({}, {"nodes": "", "image": "", "keep_failed": ""}) == Settings()


@pytest.mark.parametrize("options, ini, key, says", [
    ({"nodes": "0"}, {}, "--ddplab-nodes", "must be from 1 to 64"),
    ({"nodes": "three"}, {}, "--ddplab-nodes", "whole number"),
    ({}, {"nodes": "65"}, "ddplab_nodes (ini)", "must be from 1 to 64"),
    ({"run_timeout_s": "0"}, {}, "--ddplab-run-timeout", "more than 0"),
    ({"run_timeout_s": "5m"}, {}, "--ddplab-run-timeout", "number of seconds"),
    ({}, {"run_timeout_s": "-1"}, "ddplab_run_timeout (ini)", "more than 0"),
    ({"no_engine": "ignore"}, {}, "--ddplab-no-engine", "fail (the default"),
    ({}, {"keep_failed": "perhaps"}, "ddplab_keep_failed (ini)", "true or false"),
    ({"image": "two words"}, {}, "--ddplab-image", "without spaces"),
])
def test_a_bad_setting_names_its_option_or_ini_key(options, ini, key, says):
    with pytest.raises(ConfigError) as caught:
        resolve_settings(options, ini)
    assert caught.value.key == key and says in str(caught.value)


# -------------------------------------------------------------------------------------- marker

def marks(*kwargs: dict) -> list:
    """Markers as iter_markers gives them, closest first."""
    return [((), k) for k in kwargs]


def lab_spec(marked: list, settings: Settings, environ: dict | None = None):
    """The request of a test so marked, in a workspace without a .env."""
    return lab_request(marked, settings, Path("/nonexistent-workspace"), environ or {})


def test_a_test_without_a_marker_gets_the_session_defaults():
    request = lab_spec([], Settings(nodes=2, image="img:1"))
    assert (request.lab.nodes, request.lab.image, request.bw, request.fresh) == (2, "img:1", None, False)


def test_the_lab_is_a_lab_spec_resolved_as_labctl_up_resolves_it():
    request = lab_spec(marks({"nodes": 4}), Settings(), environ={"DDPLAB_MEMORY": "2g", "DDPLAB_NODES": "9"})
    assert isinstance(request.lab, LabSpec) and (request.lab.nodes, request.lab.memory) == (4, "2g")


def test_the_closest_marker_wins_key_by_key():
    spec = lab_spec(marks({"bw": "100mbit"}, {"nodes": 2, "bw": "1gbit"}, {"nodes": 4, "nproc_per_node": 2}),
                    Settings())
    assert (spec.lab.nodes, spec.lab.nproc_per_node, spec.bw) == (2, 2, "100mbit")


def test_node_cpus_as_text_or_a_mapping_are_the_same_lab():
    as_text = lab_spec(marks({"node_cpus": "node2=0.5,node0=1"}), Settings())
    as_mapping = lab_spec(marks({"node_cpus": {"node0": 1, "node2": 0.5}}), Settings())
    assert as_text.lab.node_cpus == as_mapping.lab.node_cpus == (("node0", 1.0), ("node2", 0.5))
    assert as_text.key == as_mapping.key


def test_links_and_freshness_are_not_part_of_the_pool_key():
    plain = lab_spec([], Settings())
    assert lab_spec(marks({"bw": "100mbit", "fresh": True}), Settings()).key == plain.key
    assert lab_spec(marks({"nodes": 2}), Settings()).key != plain.key
    assert lab_spec(marks({"nproc_per_node": 2}), Settings()).key != plain.key
    assert lab_spec([], Settings(image="other:tag")).key != plain.key


def test_fresh_comes_from_the_marker_or_the_session():
    assert lab_spec(marks({"fresh": True}), Settings()).fresh
    assert lab_spec([], Settings(fresh=True)).fresh
    assert not lab_spec([], Settings()).fresh


@pytest.mark.parametrize("kwargs, says", [
    ({"node": 3}, "has no argument node"),
    ({"nodes": 0}, "must be from 1 to 64"),
    ({"nproc_per_node": 0}, "must be from 1 to 32"),
    ({"bw": "100mbps"}, "BYTES per second"),
    ({"bw": "fast"}, "must be a rate such as 100mbit"),
    ({"delay": "10"}, "add a unit"),
    ({"bw": "1gbit", "delay": "10"}, "add a unit"),
    ({"node_cpus": "node3=0.5"}, "the lab has node0..node2"),
    ({"node_cpus": "node1"}, "NODE=CPUS pairs"),
    ({"fresh": "maybe"}, "true or false"),
])
def test_a_bad_marker_says_which_argument_and_why(kwargs, says):
    with pytest.raises(LabError) as caught:
        lab_spec(marks(kwargs), Settings())
    assert says in str(caught.value)


def test_a_marker_takes_keywords_only():
    with pytest.raises(LabError, match="keyword arguments only"):
        lab_spec([((3,), {})], Settings())


# --------------------------------------------------------------------------------------- names

@pytest.mark.parametrize("workerinput, expected", [
    (None, "main"), ({}, "main"), ({"workerid": "gw0"}, "gw0"), ({"workerid": "gw12"}, "gw12"),
    ({"workerid": "GW/3 x"}, "gw3x"), ({"workerid": "!!"}, "main"),
])
def test_worker_ids(workerinput, expected):
    assert worker_id(workerinput) == expected


def test_lab_names_tell_sessions_workers_and_labs_apart():
    names = {lab_name(session, worker, n) for session in ("0a1b2c3d", "ffffffff")
             for worker in ("main", "gw0", "gw1") for n in (1, 2)}
    assert len(names) == 12
    assert lab_name("0a1b2c3d4e5f", "gw1", 2) == "pt-0a1b2c3d-gw1-2"


@given(session=st.text("0123456789abcdef", min_size=8, max_size=32),
       worker=st.one_of(st.just(None), st.builds(lambda n: {"workerid": f"gw{n}"}, st.integers(0, 10**6)),
                        st.builds(lambda t: {"workerid": t}, st.text(max_size=20))),
       number=st.integers(1, 10**6))
def test_every_lab_name_is_one_labctl_accepts(session, worker, number):
    name = lab_name(session, worker_id(worker), number)
    assert SETTINGS["lab"][1](name) == name


# -------------------------------------------------------------------------------------- report

def recorded(case: str, run_dir: Path) -> RunResult:
    """A recorded real run, its logs written to `run_dir` as the executor writes them."""
    return recorded_run(case, run_dir, write_logs=True)


def test_a_failed_run_is_reported_by_its_root_cause_with_the_failing_ranks_own_lines(tmp_path):
    result = recorded("raise", tmp_path)
    report = failure_report(RunRecord(result, ("/src/tests/test_x.py", 12), lab="pt-1-main-1"))
    assert report.headline.startswith("ddplab: rank 1 on node1 failed first (")
    assert report.headline.endswith("ValueError: deliberate failure on rank 1")
    detail = report.detail.splitlines()
    assert detail[0] == result.explain().splitlines()[0]
    shown = report.detail.split("rank 1 on node1, from ", 1)[1].splitlines()
    assert shown[-1].endswith("ValueError: deliberate failure on rank 1")  # the rank's traceback, not torchrun's
    assert any("Traceback" in line for line in shown)
    assert [title.split(" log,")[0] for title, _ in report.sections] == [
        "Captured stdout call: ddplab node1", "Captured stdout call: ddplab node0", "Captured stdout call: ddplab node2"]
    props = dict(report.properties)
    assert props["ddplab_root_node"] == "node1" and props["ddplab_root_rank"] == "1"
    assert props["ddplab_root_error"] == "ValueError: deliberate failure on rank 1"
    assert props["ddplab_call_site"] == "/src/tests/test_x.py:12" and props["ddplab_lab"] == "pt-1-main-1"
    assert props["ddplab_log_node1"] == str(tmp_path / "node1.log")


def test_when_the_tests_own_error_says_who_failed_the_report_does_not_repeat_it(tmp_path):
    result = recorded("raise", tmp_path)
    report = failure_report(RunRecord(result), explained=True, kept_hint="lab x was kept")
    assert result.explain().splitlines()[0] not in report.detail
    assert report.detail.startswith("rank 1 on node1, from ") and report.detail.endswith("lab x was kept")


def test_a_lost_node_is_named_without_a_rank(tmp_path):
    result = recorded("lost-node-nnodes", tmp_path)
    props = dict(failure_report(RunRecord(result)).properties)
    assert props["ddplab_root_node"] == "node1" and "ddplab_root_rank" not in props
    assert "node lost" in props["ddplab_root_error"]


def test_a_timeout_says_who_had_not_finished_and_what_doctor_saw(tmp_path):
    result = recorded("hang-timeout", tmp_path)
    diagnosis = Diagnosis("lab x: nodes", [Finding("rendezvous", "node1", False, "cannot reach the rendezvous "
                                                   "port 29500 on node0", fix="labctl fault heal node1")], {}, 1.25)
    record = RunRecord(result, doctor=doctor_summary(diagnosis))
    report = failure_report(record)
    assert headline(result) == ("ddplab: the run timed out after 8 s (rank 0 on node0, rank 1 on node1, rank 2 on "
                                "node2 had not finished)")
    assert "doctor, asked after the timeout (1.2 s), found 1 problem:" in report.detail
    assert "node1: rendezvous problem: cannot reach the rendezvous port 29500 on node0 (fix: labctl fault heal " \
           "node1)" in report.detail


def test_doctor_with_nothing_to_say_says_so():
    text = doctor_summary(Diagnosis("lab x: nodes", [Finding("versions", "all", True, "one torch")], {}, 0.5))
    assert "every check passed" in text and "problem" not in text


def test_an_excerpt_without_the_error_is_the_logs_end(tmp_path):
    log = tmp_path / "node0.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert excerpt(log, "KeyError", 3) == "line 97\nline 98\nline 99"
    assert excerpt(log, "line 42", 2) == "line 41\nline 42"
    assert excerpt(tmp_path / "missing.log", None, 3).startswith("(no log:")


def test_github_annotations_escape_what_the_workflow_command_reads():
    line = github_annotation("tests/test x,y.py", 14, "ddplab: t::a", "rank 1 failed: 100%\nthen more")
    assert line == ("::error file=tests/test x%2Cy.py,line=14,title=ddplab%3A t%3A%3Aa::"
                    "rank 1 failed: 100%25%0Athen more")


@pytest.mark.parametrize("path, checkout, expected", [
    ("tests/test_a.py", "/repo", "examples/ci/tests/test_a.py"),  # relative to the rootdir, then the checkout
    ("/repo/examples/ci/tests/test_a.py", None, "ci/tests/test_a.py"),  # no checkout: from where pytest ran
    ("/elsewhere/test_a.py", "/repo", "/elsewhere/test_a.py"),
])
def test_annotation_paths(path, checkout, expected):
    assert annotation_path(path, "/repo/examples/ci", checkout, "/repo/examples") == expected


def test_the_summary_line_counts_labs_against_tests():
    stats = PoolStats(labs=1, tests=3, up_s=1.24, down_s=0.5)
    stats.add(PoolStats(labs=1, tests=1, up_s=1.0, down_s=0.5, names=["pt-a-gw1-1"]))
    assert summary_line(stats) == "ddplab: 2 labs for 4 tests (bring-up 2.2 s, teardown 1.0 s)"
    assert summary_line(PoolStats(labs=1, tests=1)) == "ddplab: 1 lab for 1 test (bring-up 0.0 s, teardown 0.0 s)"


def test_a_spec_describes_itself_for_an_error_message():
    spec = lab_spec(marks({"nodes": 2, "nproc_per_node": 2, "node_cpus": "node1=0.5", "bw": "1gbit", "delay": "5ms"}),
                    Settings())
    assert spec.describe() == "2 nodes, 2 processes per node, cpus node1=0.5, links 1gbit +5ms"
    assert lab_spec([], Settings()).describe() == "3 nodes"


def test_a_marker_may_ask_for_latency_alone():
    spec = lab_spec(marks({"delay": "10ms"}), Settings())
    assert spec.shaped and spec.bw is None and spec.delay == "10ms"
    assert spec.describe() == "3 nodes, links +10ms"
    assert lab_spec(marks({"bw": "1gbit", "delay": "5ms"}), Settings()).describe() == "3 nodes, links 1gbit +5ms"
    assert not lab_spec([], Settings()).shaped
