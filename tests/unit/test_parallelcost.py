"""Pipeline and tensor parallelism priced by hand (trainer/parallelcost.py, `labctl cost --strategy
pp|tp` through labctl/bench/parallelrows.py): every number below is worked out in the comments."""

from __future__ import annotations

import pytest

from labctl.api.bench import CostQuery, estimate
from labctl.errors import ConfigError
from trainer.parallelcost import ParallelStep, bubble, pipeline_cost, simulate_pipeline, stage_order, tensor_cost
from trainer.stepmodel import Link

GBE = Link(1e9, stack_s=50e-6, name="1GbE")
A = 8 * 1024 * 768 * 2  # a micro-batch of 8 sequences of 1024 tokens, hidden 768, bf16: 12,582,912 bytes


def test_a_pipelines_bubble_is_its_stages_less_one_over_its_slots():
    assert bubble(4, 8) == 3 / 11 and bubble(2, 1) == 1 / 2 and bubble(1, 8) == 0


def test_a_four_stage_pipeline_of_eight_micro_batches_by_hand():
    c = pipeline_cost(4, ParallelStep(8, A, 0.85, compute_s=0.4), GBE)
    one = A * 8 / (1e9 * 0.85) + 50e-6  # 118.4 ms: one micro-batch's activations across one boundary
    assert c.transfer_s == pytest.approx(one)
    assert c.comm_s == pytest.approx(11 * 2 * one)  # 8 + 4 - 1 slots, a transfer in and one out in each
    assert c.step_s == pytest.approx(11 * (0.4 / 4 + 2 * one))  # 3.71 s
    assert c.bytes_per_rank == 2 * 8 * A  # a middle stage sends the activations on and their gradients back


def test_two_stages_send_once_a_micro_batch_and_one_stage_sends_nothing():
    assert pipeline_cost(2, ParallelStep(4, A), GBE).bytes_per_rank == 4 * A
    alone = pipeline_cost(1, ParallelStep(4, A, compute_s=0.1), GBE)
    assert alone.bytes_per_rank == 0 and alone.comm_s == 0 and alone.step_s == pytest.approx(0.4)


def test_tensor_parallelism_all_reduces_the_activations_four_times_a_block_and_micro_batch():
    ten = Link(10e9, stack_s=20e-6)
    c = tensor_cost(2, 12, ParallelStep(8, A, 0.85, compute_s=0.4), ten)
    assert c.all_reduces == 4 * 12 * 8  # 384: two in forward, two in backward, each of 12 blocks, 8 micro-batches
    one = 2 * (2 - 1) / 2 * A * 8 / (10e9 * 0.85) + 2 * (2 - 1) * 20e-6  # the ring over 2 ranks: 11.9 ms
    assert c.comm_s == pytest.approx(384 * one) and c.bytes_per_rank == pytest.approx(384 * A)
    assert c.step_s == pytest.approx(8 * 0.4 / 2 + 384 * one)  # each rank computes half of every layer


def test_labctl_cost_prices_pp_and_tp_steps_with_the_same_arithmetic():
    pp = estimate(CostQuery(124e6, "bf16", "4", ["1GbE"], 0.4, 8, strategy="pp", activations="8,1024,768"))
    [row] = pp.rows
    assert row["step_s"] == pytest.approx(pipeline_cost(4, ParallelStep(8, A, 0.85, 0.4), GBE).step_s)
    assert row["bubble"] == pytest.approx(3 / 11) and row["state_bytes_per_rank"] == pytest.approx(124e6 / 4 * 16)
    tp = estimate(CostQuery(124e6, "bf16", "4", ["10GbE"], 0.4, 8, strategy="tp", activations="8,1024,768",
                            layers=12, nproc_per_node=2))
    assert tp.rows[0]["comm_s"] == pytest.approx(tensor_cost(2, 12, ParallelStep(8, A, 0.85), Link(10e9, stack_s=20e-6)).comm_s)


@pytest.mark.parametrize("query, fragment", [
    (CostQuery(1e8, ranks="4", strategy="pp"), "is needed with --strategy pp"),
    (CostQuery(1e8, ranks="4", strategy="pp", activations="8,x,768"), "must be three positive whole numbers"),
    (CostQuery(1e8, ranks="4", strategy="tp", activations="8,1024,768", nproc_per_node=2), "--layers"),
    (CostQuery(1e8, ranks="4", strategy="tp", activations="8,1024,768", layers=12), "must be 2 or more"),
    (CostQuery(1e8, ranks="4", activations="8,1024,768"), "with --strategy pp or --strategy tp"),
])
def test_what_pp_and_tp_need_is_asked_for_by_name(query, fragment):
    with pytest.raises(ConfigError, match=fragment):
        estimate(query)


def test_each_schedule_runs_a_stages_micro_batches_in_torchs_order():
    # 1F1B on 3 stages of 6: the first stage fills the pipe with 3 forwards, the last turns each around
    assert stage_order("1f1b", 3, 0, 6) == [("forward", 0), ("forward", 1), ("forward", 2), ("backward", 0),
                                            ("forward", 3), ("backward", 1), ("forward", 4), ("backward", 2),
                                            ("forward", 5), ("backward", 3), ("backward", 4), ("backward", 5)]
    assert stage_order("1f1b", 3, 2, 2) == [("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1)]
    assert stage_order("gpipe", 2, 1, 2) == [("forward", 0), ("forward", 1), ("backward", 0), ("backward", 1)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_equal_stages_played_out_take_the_slots_of_the_textbook(schedule):
    # p stages of (f, b) = (1, 2) ms, m micro-batches, nothing to send: (m + p - 1) x (f + b)
    assert simulate_pipeline([(1.0, 2.0)] * 3, schedule, 6, [0.0, 0.0]) == pytest.approx((6 + 3 - 1) * 3)
    assert simulate_pipeline([(1.0, 2.0)] * 4, schedule, 8, [0.0] * 3) == pytest.approx((8 + 4 - 1) * 3)


def test_the_slowest_stage_sets_the_pace_and_each_boundary_adds_its_transfers():
    # by hand, GPipe on 2 stages of 2 micro-batches, stage 1 twice as slow, 0.5 ms across:
    # stage 0 forwards at 0-1 and 1-2; stage 1 forwards at 1.5-3.5 and 3.5-5.5, backwards 5.5-9.5 and
    # 9.5-13.5; stage 0's backwards once the gradients arrive: 10-12 and 14-16
    assert simulate_pipeline([(1.0, 2.0), (2.0, 4.0)], "gpipe", 2, [0.5]) == pytest.approx(16.0)
    one_slow = simulate_pipeline([(1.0, 2.0), (1.0, 2.0), (4.0, 8.0)], "1f1b", 6, [0.0, 0.0])
    assert one_slow >= 6 * 12.0  # every micro-batch passes the slow stage once each way
