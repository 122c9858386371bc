"""The trainer's --strategy flag (trainer/strategy.py): what does not go with it is refused before
any process group exists. Checkpoints resuming under torchrun on this machine, and hsdp, are in
tests/host/test_strategy.py; the strategies train on a real 3-node lab in tests/integration/test_training.py."""

import pytest

from trainer.flags import parse_args


@pytest.mark.parametrize("argv, fragment", [
    (["--strategy", "fsdp", "--comm-hook", "fp16"], "--comm-hook fp16 is a DDP setting"),
    (["--strategy", "fsdp", "--static-graph"], "--static-graph is a DDP setting"),
    (["--strategy", "tensor"], "invalid choice: 'tensor'"),
    (["--strategy", "hsdp", "--static-graph"], "--static-graph is a DDP setting, and --strategy hsdp"),
    (["--strategy", "fsdp", "--compile"], "--compile compiles the model before DDP wraps it, and --strategy fsdp"),
    (["--strategy", "hsdp", "--compile"], "use --strategy ddp or zero"),
])
def test_flags_that_do_not_go_with_a_strategy_are_refused_before_anything_starts(argv, fragment, refusal):
    assert fragment in refusal(argv)


def test_compile_goes_with_ddp_and_zero():
    assert parse_args(["--compile"]).compile and parse_args(["--compile", "--strategy", "zero"]).compile
    assert not parse_args([]).compile


def test_hsdp_needs_more_than_one_process_on_a_node(refusal):
    assert "labctl run --nproc-per-node 2" in refusal(["--strategy", "hsdp"], world=3)


@pytest.mark.parametrize("local, argv, fragment", [
    (2, ["--strategy", "tp"], "--workload is toy: use --workload gpt"),
    (1, ["--strategy", "tp", "--workload", "gpt"], "has 1 on a node (world size 4): give each node 2 or more"),
    (4, ["--strategy", "fsdp+tp", "--workload", "gpt", "--n-head", "6", "--n-embd", "48"],
     "--n-head 6 does not divide by 4: use --n-head 4"),
    (2, ["--strategy", "tp", "--workload", "gpt", "--compile", "--comm-hook", "fp16"],
     "--compile, --comm-hook fp16 is not wired for --strategy tp"),
    (2, ["--strategy", "fsdp+tp", "--workload", "gpt", "--ckpt-every", "5"], "--ckpt-every is not wired"),
])
def test_tensor_parallelism_that_cannot_run_is_refused_before_anything_starts(local, argv, fragment, refusal):
    assert fragment in refusal(argv, world=4, local=local)


def test_tensor_parallelism_goes_with_gpt_on_two_processes_a_node(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert parse_args(["--strategy", "fsdp+tp", "--workload", "gpt"]).strategy == "fsdp+tp"


def test_a_node_shares_one_share_of_the_data_and_its_first_process_counts_it(monkeypatch):
    from types import SimpleNamespace

    from trainer.tensorparallel import counts_samples, data_share

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    tp, ddp = SimpleNamespace(strategy="tp"), SimpleNamespace(strategy="ddp")
    ranks = [SimpleNamespace(rank=r, local_rank=r % 2, world_size=4) for r in range(4)]
    assert [data_share(tp, c) for c in ranks] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert [data_share(ddp, c) for c in ranks] == [(r, 4) for r in range(4)]
    assert [counts_samples(tp, c) for c in ranks] == [True, False, True, False]


def test_grouped_heads_give_each_shard_its_heads_q_k_and_v():
    import torch

    from trainer.tensorparallel import group_heads

    c, shards = 8, 2
    qkv = torch.nn.Linear(c, 3 * c)
    with torch.no_grad():
        qkv.bias.copy_(torch.arange(3 * c, dtype=torch.float32))  # row i: q's i, k's i - c, v's i - 2c
    group_heads(qkv, shards)
    half = c // shards
    q, k, v = (list(range(first, first + c)) for first in (0, c, 2 * c))
    assert qkv.bias.tolist() == q[:half] + k[:half] + v[:half] + q[half:] + k[half:] + v[half:]


def test_a_block_computes_the_same_attention_from_grouped_heads_cut_in_shards():
    """What each rank computes under tensor parallelism, done by hand: shard r's qkv rows and proj
    columns give its heads' share of the output, and the shares summed (the all-reduce) are the block's."""
    import torch

    from trainer.gpt import Block
    from trainer.tensorparallel import group_heads

    torch.manual_seed(0)
    c, shards = 16, 2
    block, x = Block(c, 4), torch.randn(2, 5, c)
    whole = block.proj(attention(block, block.qkv(x)))
    group_heads(block.qkv, shards)
    rows, cols = 3 * c // shards, c // shards
    parts = [attention(block, torch.nn.functional.linear(x, block.qkv.weight[r * rows:(r + 1) * rows],
                                                         block.qkv.bias[r * rows:(r + 1) * rows]))
             @ block.proj.weight[:, r * cols:(r + 1) * cols].T for r in range(shards)]
    assert torch.allclose(sum(parts) + block.proj.bias, whole, atol=1e-6)


def attention(block, qkv):
    """A gpt Block's attention from its qkv projection's output, before proj (trainer/gpt.py's steps)."""
    import torch.nn.functional as F

    b, t, _ = qkv.shape
    q, k, v = (z.view(b, t, -1, block.head_dim).transpose(1, 2) for z in qkv.chunk(3, dim=2))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
