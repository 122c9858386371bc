"""`labctl doctor --ops`' table, read back and rendered (labctl/diagnose/ops.py,
labctl/cli/render_ops.py): held to a real probe's ops.json, written by trainer/probe_ops.py on a
3-node lab (tests/unit/ops/gloo-3-ranks.json, 2026-12-02, torch 2.13.0, gloo), and the probe's own
arithmetic of what each reduce op gives."""

import json
import re
from pathlib import Path

import pytest

from labctl.cli.render_ops import print_ops
from labctl.diagnose.ops import OpsReport
from labctl.run.known import known_limit
from trainer.probe_ops import REDUCE_OPS, reduced

RECORDED = Path(__file__).parent / "ops" / "gloo-3-ranks.json"


@pytest.fixture
def report():
    return OpsReport.from_dict(json.loads(RECORDED.read_text()), Path("/runs/r1"))


def test_each_refusal_is_listed_once_with_every_place_it_came_from(report):
    refusals = dict(report.refusals())
    futures = [e for e in refusals if "getFuture" in e]
    assert len(futures) == 1
    assert refusals[futures[0]] == ["reduce_scatter_tensor get_future", "send/recv get_future",
                                    "batch_isend_irecv get_future"]
    assert all(report.cell(op, "sync") == "ok" for op in ("all_reduce", "reduce_scatter_tensor", "send/recv"))
    assert report.cell("batch_isend_irecv", "sync") == "n/a" and report.cell("broadcast", "PREMUL_SUM") == "n/a"


def test_every_refusal_the_probe_met_is_a_known_limit_of_the_run_report(report):
    """What doctor --ops finds refused, a run that meets it is told about (labctl/run/known.py)."""
    for error, _ in report.refusals():
        limit = known_limit(error, ['  File ".../torch/distributed/distributed_c10d.py", line 1, in f'])
        assert limit is not None and limit.where == "gloo", error


def test_the_table_numbers_each_refusal_and_names_the_dtypes_gloo_refuses(report, capsys):
    print_ops(report, as_json=False)
    out = capsys.readouterr().out
    assert "gloo on 3 ranks (cpu), torch 2.13.0+cpu" in out
    notes = dict(re.findall(r"^\((\d)\) (.*?) \(", out, re.M))
    assert sorted(notes.values()) == sorted(e for e, _ in report.refusals()), out
    (number,) = [n for n, e in notes.items() if "getFuture" in e]
    assert re.search(rf"reduce_scatter_tensor .*no \({number}\)", out), out
    taken = re.search(r"^all_reduce takes (.*?); not (.*?) \(\d\)$", out, re.M)
    assert taken and "float32" in taken.group(1) and "uint64" in taken.group(2), out
    assert out.rstrip().endswith("logs: /runs/r1")


def test_json_is_the_probes_table_and_where_it_ran(report, capsys):
    print_ops(report, as_json=True)
    data = json.loads(capsys.readouterr().out)
    assert data["rows"] == report.rows and data["run_dir"] == "/runs/r1" and data["backend"] == "gloo"


@pytest.mark.parametrize("op, world, value", [("SUM", 3, 6), ("AVG", 3, 2), ("PRODUCT", 3, 6), ("MIN", 3, 1),
                                              ("MAX", 3, 3), ("PREMUL_SUM", 3, 3), ("BAND", 3, 0), ("BOR", 3, 3),
                                              ("BXOR", 3, 0), ("BXOR", 2, 3), ("BAND", 1, 1)])
def test_the_probe_expects_what_each_reduce_op_gives_of_the_ranks_values(op, world, value):
    assert op in REDUCE_OPS and reduced(op, world) == value
