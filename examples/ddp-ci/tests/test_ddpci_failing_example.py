"""Tests that fail on purpose, to show what a failure on the lab looks like in the report: the
node and its error line, its log, and (under GitHub Actions) an annotation on the test's line; for
a hang, what doctor found once the run's timeout stopped it. Skipped unless
`--run-failing-example` (or DDPCI_RUN_FAILING=1) is given."""

from pathlib import Path

import pytest

TRAIN = str(Path(__file__).resolve().parents[1] / "ddpci" / "train.py")


@pytest.mark.failing_example
def test_a_failing_rank_is_named_in_the_report(ddp_lab):
    ddp_lab.run(TRAIN, "--steps", "10", "--fail-node", "node1", "--fail-step", "3", echo=False)


@pytest.mark.failing_example
def test_a_hung_rank_times_out_with_doctors_findings(ddp_lab):
    ddp_lab.run(TRAIN, "--steps", "10", "--fail-node", "node2", "--fail-step", "3", "--hang", timeout_s=15,
                echo=False)
