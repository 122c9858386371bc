"""`labctl trace` on a real run: tests/unit/trace_run/ holds the metrics of a 3-rank gpt run recorded
with the host's torch (`torchrun --standalone --nproc_per_node=3 -m trainer --workload gpt --steps 30
--run-dir DIR --profile`, 2026-11-25, the project's 2-CPU VM), its SUMMARY (summary.json), and an
excerpt of rank 1's torch.profiler trace (its metadata, ProfilerStep#, gloo:all_reduce, 40 operators
and one flow). The merged trace is checked against the Chrome trace event format's required fields."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from labctl.trace import write_trace
from labctl.trace.records import read_run

RECORDED = Path(__file__).parent / "trace_run"


@pytest.fixture
def run(tmp_path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(RECORDED, folder)
    return folder


def summary() -> dict:
    return json.loads((RECORDED / "summary.json").read_text())


def check_chrome_trace(document: dict) -> None:
    """The format's rules (the Trace Event Format document; Perfetto's JSON importer keeps to them):
    an object with a traceEvents list; every event a ph, a name, a pid and a tid; ts in microseconds
    on every timed event; "X" events a dur; process_name metadata an args.name."""
    assert isinstance(document["traceEvents"], list) and document["traceEvents"]
    assert document.get("displayTimeUnit") in (None, "ms", "ns")
    for e in document["traceEvents"]:
        assert isinstance(e.get("ph"), str) and len(e["ph"]) == 1, e
        assert isinstance(e.get("name"), str), e
        assert isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        if e["ph"] != "M":
            assert isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
        if e["ph"] == "M" and e["name"] in ("process_name", "thread_name"):
            assert isinstance(e["args"]["name"], str), e
        if e["ph"] == "i":
            assert e.get("s", "t") in ("g", "p", "t"), e
    json.dumps(document, allow_nan=False)  # strict JSON: no NaN or Infinity anywhere


def test_the_recorded_run_names_the_rank_summary_named_and_its_wait(run):
    report = write_trace(run)
    s = summary()
    assert report.steps == list(range(2, 31)) and len(report.steps) == s["measured_steps"]
    assert report.waited_for == s["slowest_rank"]
    # the same definition over the same steps, from the metrics' microsecond-rounded compute_ms
    assert report.waited_total_s == pytest.approx(s["waited_for_slowest_s"], abs=0.0015)
    assert [r.label for r in report.rows] == ["rank 0 (vm)", "rank 1 (vm)", "rank 2 (vm)"]
    for row in report.rows:
        shares = [row.fraction(x) for x in (row.compute_s, row.exposed_s, row.waiting_s, row.other_s)]
        assert sum(shares) == pytest.approx(1.0, abs=1e-6) and all(0 <= x <= 1 for x in shares)
        # this model's 109k gradients fit DDP's first 25 MB bucket: one all-reduce after backward, nothing hidden
        assert row.overlap_fraction == pytest.approx(0.0, abs=0.01)


def test_the_recorded_runs_clocks_agree_once_aligned(run):
    report = write_trace(run)
    a = report.alignment
    assert a.event == "start" and a.reference == 0 and sorted(a.offsets_s) == [0, 1, 2]
    assert all(abs(o) < 0.005 for o in a.offsets_s.values())  # one machine, one clock: barrier jitter only
    assert a.residual_ms is not None and a.residual_ms < 5


def test_the_merged_trace_is_chrome_trace_json_with_one_process_per_rank(run):
    report = write_trace(run)
    document = json.loads(report.merged.read_text())
    check_chrome_trace(document)
    names = {e["pid"]: e["args"]["name"] for e in document["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0 (vm)", 1: "rank 1 (vm)", 2: "rank 2 (vm)"}
    steps = [e for e in document["traceEvents"] if e["ph"] == "X" and e["name"] == "step 5" and e["pid"] == 0]
    record = read_run(run).rank(0).steps[4]
    assert len(steps) == 1 and steps[0]["dur"] == pytest.approx((record.t_end - record.t_start) * 1e6, abs=0.01)
    assert document["otherData"]["alignment"] == report.alignment.as_dict()


def test_the_profiler_events_land_on_their_ranks_aligned_steps(run):
    report = write_trace(run)
    events = json.loads(report.merged.read_text())["traceEvents"]
    profiled = [e for e in events if e["name"].startswith("ProfilerStep#")]
    assert profiled and {e["pid"] for e in profiled} == {1}  # only rank 1 has a trace in the excerpt
    # ProfilerStep#N is the profiler's span from one prof.step() to the next: the trainer's step N + 1
    for e in profiled:
        n = int(e["name"].split("#")[1]) + 1
        [step] = [x for x in events if x["ph"] == "X" and x["name"] == f"step {n}" and x["pid"] == 1]
        assert e["ts"] == pytest.approx(step["ts"], abs=1000)  # within 1 ms of the metrics' own start
    flows = [e for e in events if e["ph"] in ("s", "f")]
    assert len(flows) == 2 and flows[0]["id"] == flows[1]["id"] >= 10**9  # made unique to rank 1
    threads = {e["tid"] for e in events if e["pid"] == 1 and e["ph"] == "X" and e.get("cat") == "cpu_op"}
    assert threads and all(t >= 10 for t in threads)  # the profiler's threads beside the metrics' 0 and 1


def test_a_run_with_profiler_traces_only_still_merges(run):
    for path in run.glob("metrics-rank*.jsonl"):
        path.unlink()
    report = write_trace(run)
    assert report.rows == [] and report.png is None and report.breakdown is None
    assert "no step records" in report.verdict()
    assert any("clocks not aligned" in n for n in report.notes)
    document = json.loads(report.merged.read_text())
    check_chrome_trace(document)
    assert min(e["ts"] for e in document["traceEvents"] if e["ph"] != "M") == pytest.approx(0.0, abs=0.01)
    assert any("no picture and no table" in n for n in report.notes)
    names = [e["args"]["name"] for e in document["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert names == ["rank 1 (vm)"]  # the host from the trace's own host_name
