"""Tensor parallelism (--strategy tp and fsdp+tp): each of gpt's blocks split over a node's processes.

Megatron-LM's split (arXiv:1909.08053), with torch's own API (torch.distributed.tensor.parallel):
a 2-D device mesh, ("dp", "tp") = (nodes, processes a node: torchrun's LOCAL_WORLD_SIZE), so the
"tp" axis never leaves a node, where the links are fastest.

    attention  qkv  ColwiseParallel: each rank holds the q, k and v rows of n_head / tp heads and
                    computes those heads' attention on its own
               proj RowwiseParallel: each rank's heads' share of the output, all-reduced
    MLP        fc1  ColwiseParallel: each rank 4C / tp of the 4C hidden units
               fc2  RowwiseParallel: their share of the output, all-reduced

So a block all-reduces the activations [b, t, C] twice in forward (after proj and after fc2) and
twice in backward (the input gradients of qkv and fc1), inside the node. The embeddings, the norms
and the tied head are not split: each rank of a node computes them whole on the same micro-batch.

The qkv weight is one [3C, C] matrix, q's rows, then k's, then v's. Cut by columns as it is, a
rank would hold all of q and half of k: group_heads reorders its rows first, so that each rank's
slice is its heads' q, k and v, and gpt's Block.forward, which chunks its qkv in three and counts
heads from the width, computes the same attention whole or split.

Across nodes the model is replicated:

    tp       FSDP2's replicate over the "dp" axis, per block and at the root: each rank all-reduces
             the gradients of its shard with the same shard on the other nodes, as DDP would. (DDP's
             own composition with TP, DistributedDataParallel(device_mesh=...), leaves the split
             parameters as plain attributes after the first forward in torch 2.13: model.parameters()
             then misses them, and with them the state, the checksum and the replica check.)
    fsdp+tp  FSDP2's fully_shard over the "dp" axis, per block and at the root: each shard sharded
             again across nodes (torchtitan's 2-D)

Every process of a node trains on the same micro-batches (the data is split over the "dp" axis
only), and only the node's first process counts their samples and loss.
"""

from __future__ import annotations

import os

import torch

TP_STRATEGIES = ("tp", "fsdp+tp")


def tp_size() -> int:
    """The processes of a node, which share each block: torchrun's LOCAL_WORLD_SIZE."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", 1))


def refusal(args, world: int, local: int) -> str | None:
    """Why --strategy tp or fsdp+tp cannot run with these flags on this world, or None."""
    s = args.strategy
    if args.workload != "gpt":
        return (f"error: --strategy {s} splits gpt's transformer blocks and --workload is {args.workload}: "
                "use --workload gpt")
    if local < 2 or world % local:
        return (f"error: --strategy {s} splits each block over a node's processes and this run has {local} on a "
                f"node (world size {world}): give each node 2 or more (labctl run --nproc-per-node 2)")
    if args.n_head % local:
        return (f"error: --strategy {s} gives each of a node's {local} processes whole attention heads, and "
                f"--n-head {args.n_head} does not divide by {local}: use --n-head {local * max(1, args.n_head // local)}")
    given = [flag for flag, on in (("--compile", args.compile), ("--ckpt-every", args.ckpt_every),
                                   ("--rank-micro-batch", args.rank_micro_batch),
                                   ("--static-graph", args.static_graph)) if on]
    if args.comm_hook != "none":
        given.append(f"--comm-hook {args.comm_hook}")
    if given:
        return (f"error: {', '.join(given)} is not wired for --strategy {s} in this trainer (it splits the blocks "
                "with DTensor): use --strategy ddp for it")
    return None


def group_heads(qkv: torch.nn.Linear, shards: int) -> None:
    """Reorder the rows of a fused [3C, C] qkv projection (q's C rows, k's, v's) into `shards` groups
    of (q, k, v) rows, each for C / shards of the heads: ColwiseParallel's slice r is then group r."""
    three_c = qkv.out_features
    with torch.no_grad():
        for p in (qkv.weight, qkv.bias):
            grouped = p.detach().reshape(3, shards, three_c // (3 * shards), *p.shape[1:]).transpose(0, 1)
            p.copy_(grouped.reshape(p.shape))


def plan():
    """The parallel style of each linear layer of a gpt Block (trainer/gpt.py)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"qkv": ColwiseParallel(), "proj": RowwiseParallel(), "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}


def node_mesh(c, names: tuple[str, str]):
    """A 2-D device mesh of the nodes, then a node's processes (consecutive ranks, as torchrun numbers
    them), its axes so named: tp's ("dp", "tp"), hsdp's ("replicate", "shard")."""
    from torch.distributed.device_mesh import init_device_mesh

    local = tp_size()
    return init_device_mesh(c.device.type, (c.world_size // local, local), mesh_dim_names=names)


def parallelize(model, c, args):
    """gpt's blocks split over each node's processes, the model replicated (tp: FSDP2's replicate) or
    sharded (fsdp+tp: fully_shard) across nodes. Changes the model in place; returns the module the
    loop trains. Every parameter stays a DTensor: param_checksum gathers it whole, so every rank's
    checksum is the same where the replicas agree."""
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = node_mesh(c, ("dp", "tp"))
    for block in model.blocks:
        group_heads(block.qkv, mesh["tp"].size())
        parallelize_module(block, mesh["tp"], plan())
    across = fully_shard if args.strategy == "fsdp+tp" else replicate
    for block in model.blocks:
        across(block, mesh=mesh["dp"])
    return across(model, mesh=mesh["dp"])


def data_share(args, c) -> tuple[int, int]:
    """(this rank's share of the data, shares): a node's processes share one under tp and fsdp+tp."""
    if args.strategy in TP_STRATEGIES and c.world_size > 1:
        return c.rank // tp_size(), c.world_size // tp_size()
    return c.rank, c.world_size


def counts_samples(args, c) -> bool:
    """Whether this rank's samples and loss are counted: under tp and fsdp+tp, a node's first process's."""
    return args.strategy not in TP_STRATEGIES or c.world_size == 1 or c.local_rank == 0


def summary(args, c) -> dict:
    """The SUMMARY's word on the split: the mesh, and a block's all-reduces in forward and backward."""
    if args.strategy not in TP_STRATEGIES:
        return {}
    return {"tp_size": tp_size(), "dp_size": c.world_size // tp_size(),
            "tp_allreduces_per_block": {"forward": 2, "backward": 2}}
