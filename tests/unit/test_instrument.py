"""Step-time accounting: the comm hook timer, the run summary, and naming the straggler."""

import gc
import time

import pytest
import torch
import torch.distributed as dist

from trainer.instrument import CommTimer, StepTiming, straggler_line, summarize


def t(step, compute, comm=0.0, wait=0.0, tokens=100, wall=None):
    step_ms = compute + wait + 1.0
    return StepTiming(step, compute, comm, wait, step_ms, tokens, wall or step_ms + 0.5)


def test_summary_names_the_slowest_rank_and_the_wait():
    fast = [t(i, 10.0, comm=2.0, wait=32.0) for i in range(1, 6)]
    slow = [t(i, 40.0, comm=1.5, wait=2.0) for i in range(1, 6)]
    s = summarize([fast, fast, slow], ["node0", "node1", "node2"])
    assert s["measured_steps"] == 4  # step 1 dropped as warm-up
    assert (s["slowest_rank"], s["slowest_node"]) == (2, "node2")
    assert s["slowest_compute_ratio"] == 4.0
    assert s["waited_for_slowest_s"] == pytest.approx(4 * 30.0 / 1e3)
    assert s["compute_ms_per_step"] == 40.0  # the critical path
    assert s["allreduce_ms_per_step"] == 1.5  # the last to arrive waits for nobody
    assert s["tokens_per_s"] == pytest.approx(400 / (4 * 43.5 / 1e3), rel=1e-3)
    line = straggler_line({**s, "world_size": 3})
    assert line.startswith("straggler: rank 2 on node2 computes 4.0x") and "waited 0.12 s" in line


def test_balanced_ranks_name_no_straggler():
    steps = [[t(i, 10.0 + r * 0.1) for i in range(1, 4)] for r in range(3)]
    s = summarize(steps, ["a", "b", "c"])
    assert straggler_line({**s, "world_size": 3}) is None
    assert straggler_line({**summarize(steps[:1], ["a"]), "world_size": 1}) is None


def test_single_step_run_is_measured_not_dropped():
    s = summarize([[t(1, 5.0)]], ["a"])
    assert s["measured_steps"] == 1 and s["compute_ms_per_step"] == 5.0


@pytest.fixture
def world_of_one():
    """As test_trainer's gloo_world_of_one: models are collected while their group still exists."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    gc.collect()
    dist.destroy_process_group()


def test_comm_timer_times_a_real_ddp_allreduce(world_of_one):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    timer = CommTimer()
    model = DDP(torch.nn.Linear(64, 64))
    model.register_comm_hook(None, timer.wrap(default_hooks.allreduce_hook))
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(8, 64)).sum().backward()
    end = time.perf_counter()
    assert timer.buckets >= 1
    assert timer.comm_ms() > 0 and 0 <= timer.wait_ms(end) < 5_000
    assert all(p.grad is not None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # backward only
    timer.reset()
    assert (timer.buckets, timer.comm_ms(), timer.wait_ms(end)) == (0, 0.0, 0.0)
