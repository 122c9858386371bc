"""The check people are told to do by hand: the same global batches give the same training,
whether on 2 nodes or 1 process on the host, with or without uneven per-rank micro-batches."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO, labctl, module_lab, summary_of

ARGS = ["-m", "trainer", "--global-batch", "32", "--micro-batch", "8", "--steps", "20", "--no-metrics"]



@pytest.fixture(scope="module")
def lab2(docker_client, node_image):
    yield from module_lab(2)


@pytest.fixture(scope="module")
def host_loss() -> float:
    result = subprocess.run([sys.executable, *ARGS], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = summary_of(result.stdout)
    assert summary["world_size"] == 1 and summary["accum_steps"] == 4
    return summary["final_loss"]


@pytest.mark.parametrize("extra, micro_batches", [([], [8, 8]), (["--rank-micro-batch", "0=10,1=6"], [10, 6])])
def test_two_nodes_match_one_process(lab2, host_loss, extra, micro_batches):
    out = labctl("run", "--lab", lab2, "--", *ARGS, *extra, check=True).stdout
    summary = summary_of(out)
    assert summary["world_size"] == 2 and summary["micro_batches"] == micro_batches and summary["accum_steps"] == 2
    assert summary["replicas_consistent"] is True and summary["replicas_consistent_after_step1"] is True
    assert summary["final_loss"] == pytest.approx(host_loss, rel=1e-5, abs=1e-6)


def test_indivisible_batch_is_refused(lab2):
    result = labctl("run", "--lab", lab2, "--", "-m", "trainer", "--global-batch", "30", "--micro-batch", "8")
    assert result.returncode == 1
    assert "not divisible by --micro-batch 8 x world size 2 = 16" in result.stderr + result.stdout
