"""Global-batch arithmetic and the sample-weighted gradient, in one process."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from trainer.batching import BatchError, global_batch_indices, parse_rank_micro, plan_micro_batches, rank_share


@pytest.mark.parametrize("g, m, w, overrides, expected", [
    (32, 8, 1, None, (4, [8])),
    (32, 8, 2, None, (2, [8, 8])),
    (32, 8, 4, None, (1, [8, 8, 8, 8])),
    (32, 8, 2, {0: 10, 1: 6}, (2, [10, 6])),
    (40, 8, 3, {2: 4}, (2, [8, 8, 4])),
])
def test_plan(g, m, w, overrides, expected):
    assert plan_micro_batches(g, m, w, overrides) == expected


@pytest.mark.parametrize("g, m, w, overrides, fragment", [
    (32, 8, 3, None, "not divisible by --micro-batch 8 x world size 3 = 24"),
    (32, 8, 2, {0: 10, 1: 7}, "10 + 7 = 17"),
    (32, 8, 2, {5: 4}, "names rank 5"),
])
def test_plan_errors(g, m, w, overrides, fragment):
    with pytest.raises(BatchError, match=fragment.replace("+", r"\+")):
        plan_micro_batches(g, m, w, overrides)


def test_parse_rank_micro():
    assert parse_rank_micro("0=10, 1=6") == {0: 10, 1: 6}
    assert parse_rank_micro(None) == {}
    for bad in ("0", "a=1", "0=0", "-1=3"):
        with pytest.raises(BatchError):
            parse_rank_micro(bad)


def test_global_batch_depends_only_on_seed_g_and_step():
    a = global_batch_indices(1000, 32, seed=3, step=5)
    assert torch.equal(a, global_batch_indices(1000, 32, seed=3, step=5))
    assert not torch.equal(a, global_batch_indices(1000, 32, seed=3, step=6))
    assert len(set(a.tolist())) == 32
    with pytest.raises(BatchError, match="larger than the dataset"):
        global_batch_indices(10, 32, seed=0, step=1)


@given(st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=5), st.integers(min_value=1, max_value=4))
def test_rank_shares_cover_the_global_batch_exactly_once(sizes, accum):
    indices = torch.arange(accum * sum(sizes))
    pieces = [micro for rank in range(len(sizes)) for micro in rank_share(indices, sizes, accum, rank)]
    assert torch.equal(torch.cat(pieces), indices)
    assert all(len(p) == sizes[r] for r in range(len(sizes)) for p in rank_share(indices, sizes, accum, r))


def test_weighted_gradient_equals_the_global_mean():
    """What DDP does to uneven shares, by hand: mean over ranks of (W/G x sum of losses) = mean loss."""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x, y = torch.randn(32, 5), torch.randint(0, 3, (32,))
    reference = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    accum, sizes = plan_micro_batches(32, 8, 2, {0: 10, 1: 6})
    world, per_rank = len(sizes), []
    for rank in range(world):
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for micro in rank_share(torch.arange(32), sizes, accum, rank):
            loss = F.cross_entropy(model(x[micro]), y[micro], reduction="sum") * world / 32
            grads = [g + d for g, d in zip(grads, torch.autograd.grad(loss, list(model.parameters())))]
        per_rank.append(grads)
    averaged = [sum(g[i] for g in per_rank) / world for i in range(len(reference))]  # DDP's all-reduce mean
    for got, want in zip(averaged, reference):
        torch.testing.assert_close(got, want)


def test_large_datasets_are_sampled_without_repeats_deterministically():
    from trainer.batching import PERMUTE_UP_TO

    n = PERMUTE_UP_TO * 30
    a = global_batch_indices(n, 512, seed=1, step=3)
    assert len(a) == 512 == len(set(a.tolist())) and int(a.min()) >= 0 and int(a.max()) < n
    assert torch.equal(a, global_batch_indices(n, 512, seed=1, step=3))
    assert not torch.equal(a, global_batch_indices(n, 512, seed=1, step=4))
    small = global_batch_indices(PERMUTE_UP_TO + 1, PERMUTE_UP_TO + 1, seed=0, step=1)  # G = n still works
    assert sorted(small.tolist()) == list(range(PERMUTE_UP_TO + 1))
