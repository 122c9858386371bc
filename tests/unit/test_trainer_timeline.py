"""The metrics a cross-rank timeline is built from: absolute step times on one clock per process,
the "clock" records at the start and end barriers, and the SUMMARY's kernel fields. Two ranks under
torchrun on this machine leave a timeline in tests/host/test_trainer_timeline.py."""

import time

import pytest
import torch

from trainer.instrument import StepTiming, wall, wall_now
from trainer.train import main
from hostrun import LAUNCH_VARS

SMALL = ["--samples", "512", "--features", "8", "--classes", "3", "--hidden", "16", "--lr", "0.01"]


def test_the_clock_is_unix_seconds_read_through_perf_counter():
    before = time.time()
    now = wall_now()
    assert before - 0.5 < now < time.time() + 0.5  # unix seconds, near the wall clock
    assert wall(None) is None  # a step without communication has no comm times
    p = time.perf_counter()
    assert wall(p + 2.5) - wall(p) == pytest.approx(2.5)


def test_step_records_keep_durations_and_times_to_the_microsecond():
    t = StepTiming(1, 1.23456789, 0.0, 0.0, 2.0, 64, 4.0, t_start=1795600000.123456789, t_end=1795600000.1271)
    r = t.record()
    assert r["compute_ms"] == 1.235 and r["t_start"] == 1795600000.123457 and r["t_comm_start"] is None
    assert r["tokens_per_s"] == 16000.0 and "step" not in r


def test_summary_says_which_cpu_kernels_ran(tmp_path, monkeypatch):
    for var in LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    s = main(SMALL + ["--epochs", "1", "--no-metrics"])
    assert s["cpu_kernels"] == "native" and s["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    keys = list(s)
    assert keys[keys.index("threads") + 1: keys.index("threads") + 3] == ["cpu_kernels", "cpu_capability"]
    monkeypatch.setenv("DDPLAB_CPU_KERNELS", "avx2")  # what labctl writes for a lab pinned to AVX2 kernels
    assert main(SMALL + ["--epochs", "1", "--no-metrics"])["cpu_kernels"] == "avx2"
