"""A test that fails on purpose, to show what a failing node looks like in the report: the node
and its error line, its log, and (under GitHub Actions) an annotation on the line below.
Skipped unless `--run-failing-example` (or DDPCI_RUN_FAILING=1) is given."""

from pathlib import Path

import pytest

TRAIN = str(Path(__file__).resolve().parents[1] / "ddpci" / "train.py")


@pytest.mark.failing_example
def test_a_failing_rank_is_named_in_the_report(ddp_lab):
    ddp_lab.run(TRAIN, "--steps", "10", "--fail-node", "node1", "--fail-step", "3", echo=False)
