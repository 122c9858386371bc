"""The training script. Reads top to bottom: flags, setup, loop, summary."""

import argparse
import ctypes
import hashlib
import json
import os
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from trainer.batching import BatchError, global_batch_indices, parse_rank_micro, plan_micro_batches, rank_share
from trainer.data import make_dataset
from trainer.dist import (
    all_gather,
    all_reduce_sum,
    compute_cleanup,
    compute_init,
    get_dist_info,
    print0,
    println,
    rank_tag,
)
from trainer.metrics import open_metrics
from trainer.model import MLP


def at_least(lo, kind=int):
    """argparse type: a `kind` number >= lo, with a message that says so."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {text}")
        return value

    return parse


def above_zero(text):
    """argparse type: a finite float > 0."""
    value = at_least(float("-inf"), float)(text)
    if not 0 < value < float("inf"):  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Train a small MLP on synthetic data; DDP when launched by torchrun.",
    )
    add = p.add_argument
    # data
    add("--samples", type=at_least(1), default=4096,
        help="dataset size in samples, shared out across ranks (default 4096)")
    add("--features", type=at_least(1), default=32, help="input features per sample (default 32)")
    add("--classes", type=at_least(2), default=4, help="number of classes (default 4)")
    add("--seed", type=int, default=0,
        help="seeds data, model init and shuffle; the same on every rank (default 0)")
    # model
    add("--hidden", type=at_least(1), default=64, help="MLP hidden width in units (default 64)")
    # optimization
    add("--epochs", type=at_least(1), default=3, help="passes over the dataset (default 3)")
    add("--batch-size", type=at_least(1), default=64,
        help="samples per step PER RANK; global batch = this x world size (default 64)")
    add("--lr", type=above_zero, default=3e-3, help="Adam learning rate (default 3e-3)")
    # global-batch mode (see trainer/batching.py): steps of G samples, the same G samples at every
    # step whatever the world size; replaces --epochs/--batch-size when --global-batch is given
    add("--global-batch", type=at_least(1), default=None,
        help="samples per optimizer step over all ranks; enables global-batch mode (default off)")
    add("--micro-batch", type=at_least(1), default=8,
        help="samples per rank per micro-step in global-batch mode (default 8)")
    add("--steps", type=at_least(1), default=20, help="optimizer steps in global-batch mode (default 20)")
    add("--rank-micro-batch", default=None, metavar="RANK=M,...",
        help="per-rank micro-batch overrides, e.g. 0=10,1=6 to give a slow rank less work; "
             "gradients are weighted by sample count, so the step is still the global-batch mean")
    # DDP levers (no effect in a single process)
    add("--bucket-cap-mb", type=above_zero, default=25.0,
        help="DDP gradient bucket size in MiB: smaller buckets start communicating earlier (default 25)")
    add("--comm-hook", choices=["none", "fp16", "bf16", "powersgd"], default="none",
        help="DDP communication hook: compress gradients to fp16/bf16, or PowerSGD rank-1 (default none)")
    add("--static-graph", action="store_true", help="tell DDP the graph never changes between steps")
    # distributed
    add("--timeout-s", type=above_zero, default=120.0,
        help="process-group timeout in seconds: rendezvous and every collective fail "
             "after this instead of hanging on a dead peer (default 120)")
    # logging
    add("--run-dir", default=None,
        help="directory for metrics-rank<RANK>.jsonl; default $DDPLAB_RUN_DIR, "
             "else runs/<TORCHELASTIC_RUN_ID or 'local'> under the cwd")
    add("--log-every", type=at_least(0), default=0,
        help="also write a metrics record every N optimizer steps; 0 = per epoch only (default 0)")
    add("--no-metrics", action="store_true",
        help="write no metrics files (e.g. on a read-only filesystem)")
    return p.parse_args(argv)


def resolve_run_dir(run_dir_arg):
    if run_dir_arg:
        return Path(run_dir_arg)
    if os.environ.get("DDPLAB_RUN_DIR"):
        return Path(os.environ["DDPLAB_RUN_DIR"])
    # torchrun gives all ranks of one job the same run id, so they share a dir.
    return Path("runs") / os.environ.get("TORCHELASTIC_RUN_ID", "local")


def build_loader(dataset, batch_size, seed, rank, world_size, device):
    # The sampler hands each rank a disjoint shard. drop_last=True evens the
    # shards out, so every rank takes the same number of steps; a rank with an
    # extra step would wait forever in DDP's gradient all-reduce.
    # Passing num_replicas/rank explicitly makes it work without a process group.
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    pin_memory = device.type == "cuda"  # faster host-to-GPU copies
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, pin_memory=pin_memory)
    return loader, sampler


def train_step(model, optimizer, x, y):
    """One optimizer step on one batch; returns the (graph-free) batch loss."""
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # under DDP this also averages the gradients across ranks
    optimizer.step()
    return loss.detach()


def wrap_ddp(model, c, bucket_cap_mb=25.0, comm_hook="none", static_graph=False):
    """DDP with the levers clusters tune: bucket size, a gradient-compression hook, static graph."""
    if comm_hook == "bf16" and c.backend != "nccl":
        # torch's bf16_compress_hook is built on NCCL's bf16 all-reduce; gloo has none.
        raise SystemExit("error: --comm-hook bf16 needs CUDA and NCCL; on CPU (gloo) use fp16 or powersgd")
    ddp = DDP(model, device_ids=[c.local_rank] if c.device.type == "cuda" else None,
              bucket_cap_mb=bucket_cap_mb, static_graph=static_graph)
    register_comm_hook(ddp, comm_hook)
    return ddp


def register_comm_hook(ddp, name):
    """PyTorch's DDP communication hooks: https://pytorch.org/docs/stable/ddp_comm_hooks.html"""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif name == "powersgd":
        # Rank-1 approximation with error feedback; plain all-reduce for the first steps, as the
        # PowerSGD paper warms up.
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif name != "none":
        raise ValueError(f"unknown comm hook {name!r}")


def param_checksum(model):
    """First 16 hex chars of sha256 over every parameter's name, shape and bytes.

    Identical iff the replicas hold bit-identical weights, which is what DDP
    promises after every step.
    """
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        t = p.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        # The tensor's raw bytes, read via ctypes so NumPy isn't required.
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()[:16]


def main(argv=None):
    args = parse_args(argv)

    # Open this rank's metrics file before joining the process group, so a bad
    # run dir fails fast here rather than leaving peers waiting at rendezvous.
    _, rank, _, _ = get_dist_info()
    run_dir = resolve_run_dir(args.run_dir)
    metrics = open_metrics(run_dir, rank, enabled=not args.no_metrics)

    c = compute_init(args.timeout_s)
    tag = rank_tag(c.rank, c.world_size)
    print0(f"{tag} backend {c.backend} world_size {c.world_size} device {c.device} "
           f"run_dir {run_dir}")

    # Same seed on every rank: identical data and identical initial weights
    # (DDP broadcasts rank 0's weights anyway, this keeps single-process runs
    # reproducible too).
    torch.manual_seed(args.seed)
    dataset = make_dataset(args.samples, args.features, args.classes, args.seed)
    loader, sampler = build_loader(
        dataset, args.batch_size, args.seed, c.rank, c.world_size, c.device
    )
    if len(loader) == 0:
        raise SystemExit(f"error: --samples {args.samples} over {c.world_size} ranks "
                         "leaves none per rank; raise --samples")

    raw_model = MLP(args.features, args.hidden, args.classes).to(c.device)
    model = raw_model
    if c.world_size > 1:
        model = wrap_ddp(raw_model, c, args.bucket_cap_mb, args.comm_hook, args.static_graph)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    if args.global_batch:
        return finish(args, c, raw_model, run_dir, *run_global_batches(args, c, model, optimizer, dataset, metrics, tag))

    step = samples_seen = 0  # per rank, over the whole run
    t0 = time.perf_counter()
    with metrics:
        for epoch in range(1, args.epochs + 1):
            # set_epoch reseeds the shuffle: a new order each epoch, same on all ranks.
            sampler.set_epoch(epoch)
            model.train()
            # Sum on the device: an .item() per step would stall a GPU pipeline.
            loss_sum = torch.zeros((), device=c.device)
            epoch_samples = 0
            for x, y in loader:
                x, y = x.to(c.device, non_blocking=True), y.to(c.device, non_blocking=True)
                loss = train_step(model, optimizer, x, y)
                step += 1
                epoch_samples += len(y)
                samples_seen += len(y)
                loss_sum += loss * len(y)
                if args.log_every and step % args.log_every == 0:
                    metrics.log(kind="step", rank=c.rank, epoch=epoch, step=step,
                                loss=loss.item(), samples=samples_seen,
                                elapsed_s=time.perf_counter() - t0)
            epoch_loss = loss_sum.item() / epoch_samples
            metrics.log(kind="epoch", rank=c.rank, epoch=epoch, step=step, loss=epoch_loss,
                        samples=samples_seen, elapsed_s=time.perf_counter() - t0)
            println(f"{tag} epoch {epoch}/{args.epochs} loss {epoch_loss:.4f}")
    elapsed_s = time.perf_counter() - t0
    final_loss = all_reduce_sum(epoch_loss, c.device) / c.world_size  # a collective: every rank
    return finish(args, c, raw_model, run_dir, step, final_loss, samples_seen, elapsed_s, {"epochs": args.epochs})


def run_global_batches(args, c, model, optimizer, dataset, metrics, tag):
    """Global-batch mode: K micro-steps per step, gradients synchronised only on the last."""
    try:
        accum, sizes = plan_micro_batches(args.global_batch, args.micro_batch, c.world_size,
                                          parse_rank_micro(args.rank_micro_batch))
    except BatchError as exc:
        raise SystemExit(f"error: {exc}") from None
    x_all, y_all = dataset.tensors
    # Scale so that DDP's average over ranks is the mean over the G samples (see batching.py).
    scale = c.world_size / args.global_batch
    print0(f"{tag} global batch {args.global_batch} = {accum} accumulation steps x micro-batches {sizes}")
    samples_seen = 0
    t0 = time.perf_counter()
    with metrics:
        for step in range(1, args.steps + 1):
            indices = global_batch_indices(len(y_all), args.global_batch, args.seed, step)
            optimizer.zero_grad(set_to_none=True)
            loss_sum = torch.zeros((), device=c.device)
            for k, micro in enumerate(rank_share(indices, sizes, accum, c.rank)):
                x, y = x_all[micro].to(c.device), y_all[micro].to(c.device)
                # no_sync on all but the last micro-step: one gradient all-reduce per step.
                sync = k == accum - 1 or c.world_size == 1
                with (nullcontext() if sync else model.no_sync()):
                    micro_loss = F.cross_entropy(model(x), y, reduction="sum")
                    (micro_loss * scale).backward()
                loss_sum += micro_loss.detach()
                samples_seen += len(micro)
            optimizer.step()
            step_loss = all_reduce_sum(loss_sum.item(), c.device) / args.global_batch
            metrics.log(kind="step", rank=c.rank, step=step, loss=step_loss, samples=samples_seen,
                        elapsed_s=time.perf_counter() - t0)
            if step == args.steps or (args.log_every and step % args.log_every == 0):
                println(f"{tag} step {step}/{args.steps} loss {step_loss:.6f}")
    extra = {"global_batch": args.global_batch, "accum_steps": accum, "micro_batches": sizes}
    return args.steps, step_loss, samples_seen, time.perf_counter() - t0, extra


def finish(args, c, raw_model, run_dir, steps, final_loss, samples_seen, elapsed_s, extra):
    """The SUMMARY line (rank 0) and a clean exit. Collectives: every rank must get here."""
    total_samples = int(all_reduce_sum(samples_seen, c.device))
    checksum = param_checksum(raw_model)
    checksums = all_gather(checksum)
    summary = {
        "steps": steps,
        "final_loss": round(final_loss, 6),
        "world_size": c.world_size,
        "param_checksum": checksum,
        "replicas_consistent": len(set(checksums)) == 1,
        "backend": c.backend,
        **extra,
        "elapsed_s": round(elapsed_s, 3),
        "samples_per_s": round(total_samples / elapsed_s, 1),
        "samples": total_samples,
        "run_dir": str(run_dir),
    }
    print0("SUMMARY " + json.dumps(summary))
    compute_cleanup()
    return summary
