"""Collective sweeps in the manner of nccl-tests (all_reduce_perf, all_gather_perf, ...), for gloo
(or nccl) under torchrun.

    torchrun --standalone --nproc_per_node=3 -m trainer.bench_collectives --ops all_gather --sizes 1048576
    labctl bench collectives --sizes 1M:64M    # across the lab's nodes, with the cost model beside
    python -m trainer.bench_allreduce ...      # the one-op spelling: --ops all_reduce, allreduce.json

For each op and message size S (bytes of float32, as nccl-tests counts them: the tensor for
all_reduce and broadcast, the whole gathered output for all_gather, the whole input for
reduce_scatter and all_to_all; rounded down to a multiple of 4 x world size for the three that
split it): a few warm-up calls, then `--iters` timed samples, and with `--max-iters K --budget-s T`
more while the samples together took less than T seconds, up to K: a small message's time is
mostly the machine's noise (1 to 11 ms for the same 1 KiB allreduce on two shared cores), so it gets
as many samples as the probe's, while a large one keeps `--iters`. Every rank stops after the same
sample, since each decides from the times reduced to their maximum. Each sample is timed on every
rank from a barrier to the completion of its calls; the sample's time is the maximum over ranks
(the collective is done when the slowest rank is) over its calls, and the size's time is the median
over samples. A sample is one call, or with `--fill-ms F` as many calls back to back as fill F ms
at the pace of the last warm-up call (at most MAX_CALLS), as nccl-tests times its iterations in one
loop: a call then starts as the one before it ends, not on a link idle since the barrier, whose
shaper (tbf) has refilled its bucket and lets the call's first 128 KiB through unpaced
(docs/explanation/cost-model.md). Rank 0 prints one JSON line per op and size, `COLLECTIVE {...}`
(`ALLREDUCE` from trainer.bench_allreduce), with the op, the backend and the device measured, and
writes them all to `<run_dir>/collectives.json` (allreduce.json).

`--probe-size B --probe-iters K` first times a latency probe: an all_reduce of B bytes, K times
(small-message latency is the noisiest number here, so it gets more iterations than the sweep;
with --fill-ms, K calls in samples of calls back to back).
It comes first in the file with `"probe": true`; `labctl bench` takes the calibrated model's base
latency from it, and being first it also opens the connections. `--copy-probe` adds probe rows of
op "copy", one per size: every rank at once copying the message into a fresh tensor, the local
work gloo adds to an all-gather (it gathers into a buffer it allocates, then copies out) and to a
reduce-scatter (it clones the input before all-reducing it). The calibrated model takes each
size's copy rate from them: per byte it is not one number (a large fresh buffer is new pages,
faulted in and zeroed by the kernel; a small one comes back from the allocator warm).

On nccl (--backend, default $DDPLAB_BACKEND, else auto: see trainer/backend.py) the tensors live on
the rank's GPU, and since NCCL's collectives return as soon as the kernel is queued, the clock
stops only after torch.cuda.synchronize(): the time is the collective's, not its launch's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.backend import backend_flag
from trainer.dist import compute_cleanup, compute_init, get_dist_info, println


OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
SPLIT = ("all_gather", "reduce_scatter", "all_to_all")  # the message is cut into world-size chunks
MAX_CALLS = 100  # calls a sample times back to back, at most (--fill-ms)


def parse_args(argv=None, ops_flag=True, prog="python -m trainer.bench_collectives"):
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    if ops_flag:
        p.add_argument("--ops", default="all_reduce", help=f"comma-separated, of {', '.join(OPS)} (default all_reduce)")
    p.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes (multiples of 4)")
    p.add_argument("--iters", type=int, default=5, help="timed iterations per size (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations per size first (default 2)")
    p.add_argument("--max-iters", type=int, default=0,
                   help="timed iterations at most, while within --budget-s (default 0: exactly --iters)")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="seconds of timed iterations per size before stopping at --iters (default 0)")
    p.add_argument("--fill-ms", type=float, default=0.0,
                   help="time calls back to back, as many a sample as fill this many ms (default 0: one call a sample)")
    p.add_argument("--probe-size", type=int, default=1024, help="bytes of the latency probe (default 1024)")
    p.add_argument("--probe-iters", type=int, default=0, help="timed iterations of the latency probe (default 0: none)")
    p.add_argument("--copy-probe", action="store_true",
                   help="also time a local copy into a fresh tensor at every size, on every rank at once")
    p.add_argument("--timeout-s", type=float, default=300.0, help="process-group timeout in seconds (default 300)")
    p.add_argument("--backend", type=backend_flag, default=None,
                   help="auto, nccl or gloo (default $DDPLAB_BACKEND, else auto: nccl where CUDA is available)")
    p.add_argument("--run-dir", default=None, help="where rank 0 writes its JSON file (default $DDPLAB_RUN_DIR or .)")
    args = p.parse_args(argv)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()] if ops_flag else ["all_reduce"]
    unknown = [o for o in args.ops if o not in OPS]
    if not args.ops or unknown:
        p.error(f"--ops must name some of {', '.join(OPS)}; got {', '.join(unknown) or 'none'}")
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes must be integers (bytes), got {args.sizes!r}")
    if not args.sizes or any(s < 4 or s % 4 for s in args.sizes):
        p.error("--sizes must be positive multiples of 4 bytes (float32 elements)")
    if args.iters < 1 or min(args.warmup, args.probe_iters, args.max_iters, args.budget_s, args.fill_ms) < 0:
        p.error("--iters must be >= 1, --warmup, --probe-iters, --max-iters, --budget-s and --fill-ms >= 0")
    if args.fill_ms and not args.warmup:
        p.error("--fill-ms needs --warmup >= 1: the warm-up call's time says how many calls fill a sample")
    if args.probe_size < 4 or args.probe_size % 4:
        p.error("--probe-size must be a positive multiple of 4 bytes (float32 elements)")
    return args


def more(times: list[float], iters: int, max_iters: int, budget_s: float) -> bool:
    """Time another sample: fewer than `iters` so far, or fewer than `max_iters` within `budget_s`
    (`times`: the samples' own durations)."""
    return len(times) < iters or (len(times) < max_iters and sum(times) < budget_s)


def calls_per_sample(warm_s: float, fill_s: float) -> int:
    """The calls a sample times back to back: as many as fill `fill_s` at `warm_s` a call, 1 to MAX_CALLS."""
    if fill_s <= 0:
        return 1
    return max(1, min(MAX_CALLS, math.ceil(fill_s / max(warm_s, 1e-9))))


def message_size(op: str, size_bytes: int, world_size: int) -> int:
    """The bytes the op is timed at: `size_bytes`, or rounded down to world-size chunks of float32
    for the ops that split it (nccl-tests rounds its counts the same way); at least one element each."""
    if op not in SPLIT:
        return size_bytes
    return max(size_bytes // (4 * world_size), 1) * 4 * world_size


def collective(op: str, size_bytes: int, world_size: int, device: torch.device):
    """A function that runs `op` once on a message of `size_bytes` (already a message_size)."""
    count = size_bytes // 4
    full = torch.ones(count, dtype=torch.float32, device=device)
    if op == "copy":  # no collective: gloo's local work around one, a fresh buffer written, then copied out
        out = torch.empty_like(full)
        return lambda: out.copy_(torch.empty_like(full).fill_(1.0))
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    if op == "broadcast":
        return lambda: dist.broadcast(full, src=0)
    part = torch.ones(count // world_size, dtype=torch.float32, device=device)
    if op == "all_gather":
        return lambda: dist.all_gather_single(full, part)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_single(part, full)
    out = torch.empty_like(full)
    return lambda: dist.all_to_all_single(out, full)


def slowest_rank(seconds: float, device: torch.device) -> float:
    """`seconds` reduced to their maximum over ranks (on nccl the tensor must be on the GPU)."""
    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item()


@dataclass(frozen=True)
class Sampling:
    """How a size is timed: `warmup` calls, then `iters` samples and more up to `max_iters` while
    within `budget_s` (more()), each sample as many calls back to back as fill `fill_s`
    (calls_per_sample); with `iters_count_calls` (the latency probe), `iters` counts calls, not
    samples, so the probe times as many calls back to back as one at a time."""

    iters: int
    warmup: int
    max_iters: int = 0
    budget_s: float = 0.0
    fill_s: float = 0.0
    iters_count_calls: bool = False


def time_size(run_once, device: torch.device, sampling: Sampling) -> list[float]:
    """Per-call times of run_once() in seconds, a sample's calls averaged, each the maximum over
    ranks (so all ranks agree on `more`)."""
    cuda = device.type == "cuda"

    def sync():  # NCCL's collectives return once queued: wait for the kernels themselves
        if cuda:
            torch.cuda.synchronize(device)

    warm_s = 0.0
    for _ in range(sampling.warmup):
        started = time.perf_counter()
        run_once()
        sync()
        warm_s = time.perf_counter() - started
    calls = calls_per_sample(slowest_rank(warm_s, device), sampling.fill_s) if sampling.fill_s > 0 else 1  # no reduction unasked
    iters = max(1, math.ceil(sampling.iters / calls)) if sampling.iters_count_calls else sampling.iters
    spent: list[float] = []  # each sample's own duration
    while more(spent, iters, sampling.max_iters, sampling.budget_s):
        dist.barrier()
        sync()  # nothing of the warm-up or the barrier still queued on the GPU when the clock starts
        started = time.perf_counter()
        for _ in range(calls):
            run_once()
        sync()
        spent.append(slowest_rank(time.perf_counter() - started, device))
    return [s / calls for s in spent]


def main(argv=None, one_op: bool = False):
    """The sweep; `one_op` is trainer.bench_allreduce's spelling: all_reduce only, ALLREDUCE lines, allreduce.json."""
    prog = "python -m trainer.bench_allreduce" if one_op else "python -m trainer.bench_collectives"
    args = parse_args(argv, ops_flag=not one_op, prog=prog)
    is_ddp, rank, local_rank, world_size = get_dist_info()
    if not is_ddp:
        raise SystemExit(f"{prog.split('.')[-1]} needs a process group: run it under torchrun (or labctl bench)")
    c = compute_init(args.timeout_s, args.backend)
    device = c.device
    if rank == 0:
        println(f"{prog.split('.')[-1]}: backend {c.backend}, device {device}, world size {world_size} ({c.reason})")
    rows = []
    probe = [("all_reduce", args.probe_size, args.probe_iters, True)] if args.probe_iters else []
    probe += [("copy", size, args.iters, True) for size in args.sizes] if args.copy_probe else []
    sweep = [(op, size, args.iters, False) for op in args.ops for size in args.sizes]
    for op, asked, iters, is_probe in probe + sweep:
        size = message_size(op, asked, world_size)
        sampling = Sampling(iters, args.warmup, 0 if is_probe else args.max_iters, args.budget_s, args.fill_ms / 1e3,
                            iters_count_calls=is_probe and op != "copy")
        times = time_size(collective(op, size, world_size, device), device, sampling)
        row = {"op": op, "size": size, "count": size // 4, "type": "float", "world_size": world_size,
               "backend": c.backend, "device": device.type,
               "time_us": statistics.median(times) * 1e6, "times_us": [t * 1e6 for t in times]}
        if is_probe:
            row["probe"] = True
        rows.append(row)
        if rank == 0:
            println(("PROBE " if is_probe else "ALLREDUCE " if one_op else "COLLECTIVE ") + json.dumps(row))
    if rank == 0:
        run_dir = Path(args.run_dir or os.environ.get("DDPLAB_RUN_DIR") or ".")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / ("allreduce.json" if one_op else "collectives.json")).write_text(json.dumps(rows))
    compute_cleanup()


if __name__ == "__main__":
    from trainer.dist import exit_done

    main()
    exit_done()
