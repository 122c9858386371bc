"""`labctl trace` on a real lab with a straggler (node2 at a quarter of a CPU): the picture, the table
naming node2, its waiting total against SUMMARY's, the clocks aligned within 1 ms, the merged trace's
format. Where else trace is used: bench straggler's pictures (test_training.py's bench test), the
straggler scenario's diagnosis (test_scenarios.py); its refusals and an fsdp run's collectives, which
need no straggler and no quiet machine, are test_training.py's too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import PNG_MAGIC, drop_lab, labctl, new_lab_name, summary_of

pytestmark = pytest.mark.alone  # its straggler is a CPU share, which a second test's load blurs


@pytest.fixture(scope="module")
def straggler_lab(docker_client, node_image):
    """3 nodes, node2 limited to 0.25 CPUs from the start (`up --node-cpus`)."""
    name = new_lab_name()
    labctl("up", "--lab", name, "--nodes", "3", "--node-cpus", "node2=0.25", check=True)
    yield name
    drop_lab(name)


@pytest.fixture(scope="module")
def traced(straggler_lab):
    """The issue's command, `labctl run --trace` of a 60-step gpt run, then `labctl trace --json` of the
    latest run (the same one): (SUMMARY, trace --json, run --trace's text, its table included)."""
    out = labctl("run", "--lab", straggler_lab, "--trace", "--", "-m", "trainer", "--workload", "gpt", "--steps",
                 "60", check=True).stdout
    report = json.loads(labctl("trace", "--lab", straggler_lab, "--json", check=True).stdout)
    return summary_of(out), report, out


def test_the_picture_and_the_table_name_node2_and_its_wait_agrees_with_summary(traced):
    summary, report, text = traced
    assert Path(report["files"]["png"]).read_bytes()[:8] == PNG_MAGIC
    assert report["waited_for"] == "rank 2 (node2)" and summary["slowest_node"] == "node2"
    assert report["measured_steps"] == summary["measured_steps"] == 59
    assert report["waited_total_s"] == pytest.approx(summary["waited_for_slowest_s"], rel=0.10)
    rows = {r["rank"]: r for r in report["ranks"]}
    # node2's lane computes longest; the others wait for it, node2 hardly waits for anyone
    assert rows[2]["compute"] > max(rows[0]["compute"], rows[1]["compute"])
    assert min(rows[0]["waiting"], rows[1]["waiting"]) > 2 * rows[2]["waiting"]
    assert "rank 2 (node2) (waited for)" in text and "the others waited for rank 2 (node2)" in text
    assert f"timeline: {report['files']['png']}" in " ".join(text.split())


def test_the_clocks_aligned_on_the_start_barrier_agree_at_the_end_within_1_ms(traced):
    _, report, _ = traced
    alignment = report["alignment"]
    assert alignment["event"] == "start" and sorted(alignment["offsets_ms"]) == ["0", "1", "2"]
    assert alignment["residual_ms"] < 1.0, alignment
    merged = json.loads(Path(report["files"]["merged_trace"]).read_text())
    instants = [e for e in merged["traceEvents"] if e["ph"] == "i" and e.get("cat") == "clock"]
    start = [e["ts"] for e in instants if e["name"] == f"start barrier {alignment['barrier'] + 1}"]
    assert len(start) == 3 and max(start) - min(start) < 1000  # microseconds: aligned, the start agrees
    ends = {e["name"]: [] for e in instants if e["name"].startswith("end barrier")}
    for e in instants:
        if e["name"] in ends:
            ends[e["name"]].append(e["ts"])
    assert min(max(ts) - min(ts) for ts in ends.values()) < 1000  # and one end barrier within 1 ms, as residual


def test_the_merged_trace_is_chrome_trace_json_one_process_per_rank(traced):
    _, report, _ = traced
    merged = json.loads(Path(report["files"]["merged_trace"]).read_text())
    for e in merged["traceEvents"]:
        assert {"ph", "name", "pid", "tid"} <= e.keys() and isinstance(e["pid"], int), e
        assert e["ph"] == "M" or e["ts"] >= 0, e
        assert e["ph"] != "X" or e["dur"] >= 0, e
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0 (node0)", 1: "rank 1 (node1)", 2: "rank 2 (node2)"}
