"""Global-batch semantics, independent of how many ranks share the work.

A step trains on one global batch of G samples. Which samples depends only on --seed, G and the
step number, never on the world size, so 1 process and N ranks see the same samples at every
step. Each rank takes a contiguous share of the global batch and walks it in K micro-batches
(gradient accumulation), K the same on every rank because DDP synchronises once per step, on the
last micro-batch.

By default every rank's micro-batch is M and K = G / (M x world size). With per-rank overrides
(`--rank-micro-batch 0=10,1=6`, to give a slow rank less work), rank r's share is K x m_r, with
K = G / sum(m_r). Losses are summed per sample and scaled by world_size / G before backward, so
DDP's averaging over ranks yields exactly the mean gradient over the G samples, however unevenly
they were shared.
"""

from __future__ import annotations

import torch


PERMUTE_UP_TO = 65_536  # datasets up to this size are permuted per step, larger ones sampled


class BatchError(ValueError):
    """A batch configuration that cannot be split as asked; the message says how to fix it."""


def parse_rank_micro(text: str | None) -> dict[int, int]:
    """'0=10,1=6' -> {0: 10, 1: 6}."""
    overrides: dict[int, int] = {}
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        rank, sep, size = part.partition("=")
        try:
            r, m = int(rank), int(size)
        except ValueError:
            raise BatchError(f"--rank-micro-batch: {part!r} is not RANK=SIZE (e.g. 0=10,1=6)") from None
        if not sep or r < 0 or m < 1:
            raise BatchError(f"--rank-micro-batch: {part!r} needs a rank >= 0 and a size >= 1")
        overrides[r] = m
    return overrides


def plan_micro_batches(global_batch: int, micro_batch: int, world_size: int,
                       overrides: dict[int, int] | None = None) -> tuple[int, list[int]]:
    """(K accumulation steps, micro-batch size of each rank)."""
    overrides = overrides or {}
    unknown = sorted(r for r in overrides if r >= world_size)
    if unknown:
        raise BatchError(f"--rank-micro-batch names rank {unknown[0]}, but the world has ranks 0..{world_size - 1}")
    sizes = [overrides.get(r, micro_batch) for r in range(world_size)]
    per_step = sum(sizes)
    if global_batch % per_step:
        if overrides:
            raise BatchError(f"--global-batch {global_batch} is not a multiple of the micro-batches' sum "
                             f"{' + '.join(map(str, sizes))} = {per_step}; adjust the sizes so it divides")
        raise BatchError(f"--global-batch {global_batch} is not divisible by --micro-batch {micro_batch} x "
                         f"world size {world_size} = {per_step}; accumulation steps must be a whole number")
    return global_batch // per_step, sizes


def global_batch_indices(n_samples: int, global_batch: int, seed: int, step: int) -> torch.Tensor:
    """The step's global batch: G distinct sample indices, a function of (seed, G, step) only."""
    if global_batch > n_samples:
        raise BatchError(f"--global-batch {global_batch} is larger than the dataset ({n_samples} samples)")
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    if n_samples <= PERMUTE_UP_TO:
        return torch.randperm(n_samples, generator=generator)[:global_batch]
    # A permutation of a large dataset costs O(n) per step (50 ms for 2M windows): draw instead,
    # skipping repeats, which is O(G) and just as deterministic.
    chosen: dict[int, None] = {}
    while len(chosen) < global_batch:
        for i in torch.randint(n_samples, (2 * global_batch,), generator=generator).tolist():
            chosen.setdefault(i)
            if len(chosen) == global_batch:
                break
    return torch.tensor(list(chosen), dtype=torch.long)


def rank_share(indices: torch.Tensor, sizes: list[int], accum: int, rank: int) -> list[torch.Tensor]:
    """Rank `rank`'s micro-batches: its contiguous share of the global batch, cut in `accum` pieces."""
    start = accum * sum(sizes[:rank])
    size = sizes[rank]
    return [indices[start + k * size: start + (k + 1) * size] for k in range(accum)]
