"""How a model's state is spread over the ranks, and what one rank holds of it.

    ddp   every rank holds the whole model, its gradients and its optimizer state; DDP all-reduces
          the gradients (trainer/ddp.py)
    zero  DDP, with torch's ZeroRedundancyOptimizer (ZeRO stage 1): each rank keeps the optimizer
          state of its share of the parameters only, steps that share, and broadcasts it back
    fsdp  FSDP2's fully_shard, once per transformer block and once for the whole model: each rank
          keeps 1/N of the parameters, gradients and optimizer state; a block's parameters are
          all-gathered before its forward and again before its backward, and its gradients
          reduce-scattered after it
    hsdp  fsdp on a 2-D mesh: sharded within a node's processes (torchrun's LOCAL_WORLD_SIZE, which
          --nproc-per-node sets), replicated across nodes; the all-gathers and reduce-scatters stay
          inside a node, and only the gradient shards are all-reduced between nodes
    pp    a pipeline (trainer/pipeline.py): each rank holds a stage of gpt's blocks, whole, and
          the activations pass from stage to stage; nothing is replicated but the tied embedding
    tp    tensor parallelism (trainer/tensorparallel.py): each block's layers split over a node's
          processes (Megatron-LM's), the model replicated across nodes (FSDP2's replicate, DDP's job)
    fsdp+tp  the same split, sharded across nodes with FSDP2 (torchtitan's 2-D)

The loop, the data order and the loss are the same for all seven, so they end at the same loss up
to the order in which floating-point sums are taken. A single process wraps nothing, as with DDP.
"""

import os
from contextlib import contextmanager, nullcontext

import torch

from trainer import tensorparallel
from trainer.ddp import wrap_ddp

STRATEGIES = ("ddp", "zero", "fsdp", "hsdp", "pp", "tp", "fsdp+tp")  # --strategy
SHARDED = ("fsdp", "hsdp")  # FSDP2: parameters, gradients and optimizer state in shards


def refusal(args):
    """Why the flags do not go together with --strategy, or None: before any process group exists."""
    if args.compile and args.strategy in SHARDED:
        return (f"error: --compile compiles the model before DDP wraps it, and --strategy {args.strategy} shards it "
                "with FSDP2 instead (compiling each block under fully_shard is not wired in this trainer): use "
                "--strategy ddp or zero")
    if args.strategy == "ddp":
        return None
    if args.strategy == "pp":
        from trainer.pipeline import refusal as pipeline_refusal

        return pipeline_refusal(args, int(os.environ.get("WORLD_SIZE", 1)))
    if args.strategy in tensorparallel.TP_STRATEGIES:
        return tensorparallel.refusal(args, int(os.environ.get("WORLD_SIZE", 1)), tensorparallel.tp_size())
    if args.strategy in SHARDED and (args.comm_hook != "none" or args.static_graph):
        given = "--comm-hook " + args.comm_hook if args.comm_hook != "none" else "--static-graph"
        return f"error: {given} is a DDP setting, and --strategy {args.strategy} has no DDP: use --strategy ddp or zero"
    local, world = int(os.environ.get("LOCAL_WORLD_SIZE", 1)), int(os.environ.get("WORLD_SIZE", 1))
    if args.strategy == "hsdp" and world > 1 and (local < 2 or world % local):
        return (f"error: --strategy hsdp shards within a node's processes and this run has {local} on a node "
                f"(world size {world}): give each node 2 or more (labctl run --nproc-per-node 2), or use --strategy fsdp")
    return None


def wrap_model(model, c, args, timer):
    """The model as the loop trains it: DDP (ddp, zero), sharded (fsdp, hsdp), or as it is in a world of one;
    with --compile, compiled first (DDP then wraps the compiled module, nanoGPT's order)."""
    if args.compile:
        model = torch.compile(model)
    if c.world_size == 1:
        return model
    if args.strategy in tensorparallel.TP_STRATEGIES:
        return tensorparallel.parallelize(model, c, args)
    if args.strategy in SHARDED:
        return shard_fully(model, c, hybrid=args.strategy == "hsdp")
    return wrap_ddp(model, c, args.bucket_cap_mb, args.comm_hook, args.static_graph, timer)


def shard_fully(model, c, hybrid=False):
    """FSDP2 on a 1-D mesh of every rank (hybrid: a 2-D mesh, replicated across nodes and sharded
    within one, which FSDP2 runs as HSDP): one unit per block (`model.blocks`, gpt's), then the root,
    which holds what is left (embeddings, the final norm, the tied head). fully_shard changes the
    module in place: its parameters become DTensors, each rank holding a shard."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = (tensorparallel.node_mesh(c, ("replicate", "shard")) if hybrid
            else init_device_mesh(c.device.type, (c.world_size,)))
    for block in getattr(model, "blocks", ()):
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def build_optimizer(model, args, world_size):
    """Adam, for every strategy; zero's shards its state over the ranks."""
    if args.strategy == "zero" and world_size > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=args.lr)
    return torch.optim.Adam(model.parameters(), lr=args.lr)


def micro_step(model, last: bool):
    """The context of one of a step's micro-steps: the gradients communicated on its last, accumulated
    (no_sync) on those before it."""
    return nullcontext() if last else no_sync(model)


@contextmanager
def no_sync(model):
    """A micro-step that accumulates gradients without communicating them: DDP's no_sync, FSDP2's
    requires_gradient_sync off (it keeps the unsharded gradients until the step's last backward)."""
    if hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def local(tensor):
    """What this rank holds of a tensor: a DTensor's shard, or the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def state_bytes(model, optimizer):
    """{"params", "grads", "optimizer"}: the bytes of each that this rank holds, counted from its tensors."""
    params = list(model.parameters())
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer steps a local optimizer
    states = [t for state in inner.state.values() for t in state.values() if torch.is_tensor(t)]
    return {
        "params": sum(nbytes(p) for p in params),
        "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(nbytes(t) for t in states),
    }


def nbytes(tensor):
    shard = local(tensor)
    return shard.numel() * shard.element_size()
