"""The known limits of the nodes' torch, met on a real lab: code written for NCCL, for a GPU or
for a machine with a compiler fails on the lab's CPU nodes, and labctl run's report ends with what
the limit is and the usual fix (labctl/run/known.py). Every entry of the table is met here, by
tests/integration/scripts/meets_a_limit.py, so the table stays true of the release the lab pins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SCRIPTS, labctl
from labctl.run.known import LIMITS, known_limit

pytestmark = pytest.mark.integration


def flat(text: str) -> str:
    """The terminal wraps long lines; compare words."""
    return " ".join(text.split())


# The lab's image has a compiler: a script meets that limit as on a node whose CXX names none, with
# the compile caches off (a graph compiled before would need no compiler).
ENV = {"no-compiler": ["-e", "CXX=g++-absent", "-e", "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1"]}


@pytest.mark.parametrize("limit", LIMITS, ids=lambda limit: limit.name)
def test_a_rank_that_meets_a_known_limit_is_told_what_it_is_and_the_fix(lab2, limit):
    result = labctl("run", "--lab", lab2, "--json", *ENV.get(limit.name, []), "--", str(SCRIPTS / "meets_a_limit.py"),
                    limit.name, timeout=240)
    assert result.returncode == 1, (result.returncode, result.stdout[-3000:], result.stderr[-3000:])
    document = json.loads(result.stdout)
    root = document["root_cause"]
    assert root["known"] is not None, (root, result.stderr[-3000:])
    assert root["known"]["name"] == limit.name, (root, result.stderr[-3000:])
    assert root["consequence"] is None and root["rank"] in (0, 1), root
    report = flat(result.stderr)
    why, fix = limit.lines()
    assert flat(why) in report and flat(fix) in report, result.stderr[-3000:]
    assert report.index("failed first") < report.index(flat(why)) < report.index(flat(fix)) < report.index("logs:")


def test_doctor_ops_tries_every_operation_on_the_nodes_and_what_it_refuses_is_a_known_limit(lab2):
    """The probe's table on the lab (trainer/probe_ops.py on both nodes): what gloo does, and that
    each refusal it meets is one the run report explains."""
    result = labctl("doctor", "--ops", "--lab", lab2, "--json", check=True, timeout=240)
    table = json.loads(result.stdout)
    assert (table["backend"], table["device"], table["world_size"]) == ("gloo", "cpu", 2), table
    cells = {row["op"]: row for row in table["rows"]}
    assert set(cells) == {"all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single",
                          "broadcast", "send/recv", "batch_isend_irecv", "barrier", "monitored_barrier"}
    assert all(cells[op]["sync"] == "ok" for op in cells if op != "batch_isend_irecv"), cells
    assert all(cells[op]["async_wait"] == "ok" for op in cells if op != "monitored_barrier"), cells
    assert cells["all_reduce"]["get_future"] == "ok"
    assert "getFuture" in cells["reduce_scatter_tensor"]["get_future"], cells["reduce_scatter_tensor"]
    assert cells["all_reduce"]["AVG"] == cells["reduce_scatter_tensor"]["AVG"] == "ok"
    assert table["all_reduce_dtypes"]["float32"] == "ok"
    refused = {cell for row in table["rows"] for key, cell in row.items() if key != "op" and cell not in ("ok", "n/a")}
    refused |= {cell for cell in table["all_reduce_dtypes"].values() if cell != "ok"}
    assert refused, table
    context = ['  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 1, in f']
    assert all(known_limit(cell, context) for cell in refused), refused
    assert (Path(table["run_dir"]) / "ops.json").is_file()
