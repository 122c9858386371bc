"""The known limits of the nodes' torch, met on a real lab: code written for NCCL, for a GPU or
for a machine with a compiler fails on the lab's CPU nodes, and labctl run's report ends with what
the limit is and the usual fix (labctl/run/known.py). Every entry of the table is met here, by
tests/integration/scripts/meets_a_limit.py, so the table stays true of the release the lab pins."""

from __future__ import annotations

import json

import pytest

from conftest import SCRIPTS, labctl
from labctl.run.known import LIMITS

pytestmark = pytest.mark.integration


def flat(text: str) -> str:
    """The terminal wraps long lines; compare words."""
    return " ".join(text.split())


@pytest.mark.parametrize("limit", LIMITS, ids=lambda limit: limit.name)
def test_a_rank_that_meets_a_known_limit_is_told_what_it_is_and_the_fix(lab2, limit):
    result = labctl("run", "--lab", lab2, "--json", "--", str(SCRIPTS / "meets_a_limit.py"), limit.name, timeout=240)
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
