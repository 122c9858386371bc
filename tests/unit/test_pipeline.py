"""--strategy pp's pure parts (trainer/pipeline.py): how the blocks are cut into stages, and what is
refused before any process group exists. The pipeline trains under torchrun in tests/host/test_strategy.py
and on a real 3-node lab in tests/integration/test_training.py."""

import pytest
import torch

from trainer.flags import parse_args
from trainer.gpt import GPT
from trainer.pipeline import GPTStage, StageError, plan_stages


def test_an_even_split_gives_the_earlier_stages_the_blocks_left_over():
    assert plan_stages(8, 3) == [3, 3, 2] and plan_stages(6, 3) == [2, 2, 2] and plan_stages(3, 3) == [1, 1, 1]


def test_given_layers_are_taken_as_they_are_and_checked():
    assert plan_stages(8, 3, [4, 3, 1]) == [4, 3, 1]
    for wrong in ([4, 4], [4, 3, 2], [8, 0, 0]):
        with pytest.raises(StageError, match="needs 3 counts"):
            plan_stages(8, 3, wrong)


def test_auto_gives_a_node_at_a_quarter_of_the_speed_fewer_blocks():
    # blocks a second of node0, node1 and node2 at a quarter of a CPU: 8 blocks; the stages then take
    # 10, 7.5 and 10 ms, where [3, 3, 2] would take 7.5, 7.5 and 20
    assert plan_stages(8, 3, speeds=[400.0, 400.0, 100.0]) == [4, 3, 1]
    assert plan_stages(8, 3, speeds=[1.0, 1.0, 1.0]) == plan_stages(8, 3) == [3, 3, 2]
    assert plan_stages(6, 2, speeds=[1.0, 1.0]) == [3, 3]
    assert plan_stages(3, 3, speeds=[1.0, 100.0, 1.0]) == [1, 1, 1]  # every stage keeps one block


def test_more_stages_than_blocks_is_refused():
    with pytest.raises(StageError, match="with 4 stages .* --n-layer is 2"):
        plan_stages(2, 4)


@pytest.mark.parametrize("world, argv, fragment", [
    (3, ["--strategy", "pp"], "--strategy pp cuts gpt's transformer blocks into stages: add --workload gpt"),
    (1, ["--workload", "gpt", "--strategy", "pp"], "needs 2 or more ranks, one stage each, and this run has 1"),
    (3, ["--workload", "gpt", "--strategy", "pp"], "with 3 stages (one per rank) needs at least as many transformer "
                                                   "blocks, and --n-layer is 2"),
    (2, ["--workload", "gpt", "--strategy", "pp", "--micro-batches", "1"],
     "--schedule 1f1b needs at least one micro-batch per stage: --micro-batches 1 with 2 stages"),
    (3, ["--workload", "gpt", "--strategy", "pp", "--n-layer", "8", "--stage-layers", "3,3,3"],
     "--stage-layers 3,3,3: needs 3 counts (one per rank), each 1 or more, summing to --n-layer 8"),
    (3, ["--workload", "gpt", "--strategy", "pp", "--n-layer", "3", "--stage-layers", "one,two"],
     "--stage-layers 'one,two' is not a comma-separated list"),
    (2, ["--workload", "gpt", "--strategy", "pp", "--global-batch", "30", "--micro-batches", "4"],
     "--global-batch 30 does not split into --micro-batches 4"),
    (2, ["--workload", "gpt", "--strategy", "pp", "--compile"], "--compile does not go with --strategy pp"),
    (2, ["--workload", "gpt", "--strategy", "pp", "--ckpt-every", "5"], "--ckpt-every does not go with --strategy pp"),
])
def test_a_pipeline_that_cannot_run_is_refused_before_anything_starts(world, argv, fragment, refusal):
    assert fragment in refusal(argv, world=world)


def test_the_defaults_are_two_micro_batches_a_stage_of_micro_batch_samples(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    args = parse_args(["--workload", "gpt", "--strategy", "pp", "--n-layer", "3", "--schedule", "gpipe"])
    assert (args.micro_batches, args.global_batch) == (6, 48)
    assert parse_args(["--workload", "gpt", "--strategy", "pp", "--n-layer", "3", "--global-batch", "24"]).global_batch == 24


def test_the_stages_together_compute_what_the_whole_model_does():
    torch.manual_seed(0)
    model = GPT(vocab_size=20, block_size=8, n_layer=3, n_embd=16, n_head=2)
    x = torch.randint(20, (2, 8))
    stages = [GPTStage(model, 0, 1, True, False), GPTStage(model, 1, 1, False, False), GPTStage(model, 2, 1, False, True)]
    out = x
    for stage in stages:
        out = stage(out)
    assert torch.equal(out, model(x))
    assert stages[2].head.weight is stages[0].tok.weight  # one model: the tie holds until the stages go apart
