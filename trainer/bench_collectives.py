"""An allreduce sweep in the manner of nccl-tests' all_reduce_perf, for gloo (or nccl) under torchrun.

    torchrun --standalone --nproc_per_node=2 -m trainer.bench_allreduce --sizes 1024,1048576
    labctl bench allreduce --sizes 1K:64M      # across the lab's nodes, with the cost model beside

For each message size S (bytes of float32): a few warm-up allreduces, then `--iters` timed ones, and
with `--max-iters K --budget-s T` more while the timed ones together took less than T seconds, up to
K: a small message's time is mostly the machine's noise (1 to 11 ms for the same 1 KiB allreduce on
two shared cores), so it gets as many samples as the probe's, while a large one keeps `--iters`.
Every rank stops after the same iteration, since each decides from the times reduced to their maximum.
Each iteration is timed on every rank between a barrier and the allreduce's completion; the
iteration's time is the maximum over ranks (the collective is done when the slowest rank is),
and the size's time is the median over iterations. Rank 0 prints one JSON line per size,
`ALLREDUCE {...}` (with the backend and device measured), and writes them all to
`<run_dir>/allreduce.json`.

`--probe-size B --probe-iters K` first times a latency probe: an allreduce of B bytes, K times
(small-message latency is the noisiest number here, so it gets more iterations than the sweep).
It comes first in allreduce.json with `"probe": true`; `labctl bench allreduce` takes the
calibrated model's base latency from it, and being first it also opens the connections.

On nccl (--backend, default $DDPLAB_BACKEND, else auto: see trainer/backend.py) the tensor lives on
the rank's GPU, and since NCCL's all_reduce returns as soon as the kernel is queued, the clock
stops only after torch.cuda.synchronize(): the time is the collective's, not its launch's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.backend import backend_flag
from trainer.dist import compute_cleanup, compute_init, get_dist_info, println


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m trainer.bench_allreduce", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes (multiples of 4)")
    p.add_argument("--iters", type=int, default=5, help="timed iterations per size (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations per size first (default 2)")
    p.add_argument("--max-iters", type=int, default=0,
                   help="timed iterations at most, while within --budget-s (default 0: exactly --iters)")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="seconds of timed iterations per size before stopping at --iters (default 0)")
    p.add_argument("--probe-size", type=int, default=1024, help="bytes of the latency probe (default 1024)")
    p.add_argument("--probe-iters", type=int, default=0, help="timed iterations of the latency probe (default 0: none)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="process-group timeout in seconds (default 300)")
    p.add_argument("--backend", type=backend_flag, default=None,
                   help="auto, nccl or gloo (default $DDPLAB_BACKEND, else auto: nccl where CUDA is available)")
    p.add_argument("--run-dir", default=None, help="where rank 0 writes allreduce.json (default $DDPLAB_RUN_DIR or .)")
    args = p.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes must be integers (bytes), got {args.sizes!r}")
    if not args.sizes or any(s < 4 or s % 4 for s in args.sizes):
        p.error("--sizes must be positive multiples of 4 bytes (float32 elements)")
    if args.iters < 1 or args.warmup < 0 or args.probe_iters < 0 or args.max_iters < 0 or args.budget_s < 0:
        p.error("--iters must be >= 1, --warmup, --probe-iters, --max-iters and --budget-s >= 0")
    if args.probe_size < 4 or args.probe_size % 4:
        p.error("--probe-size must be a positive multiple of 4 bytes (float32 elements)")
    return args


def more(times: list[float], iters: int, max_iters: int, budget_s: float) -> bool:
    """Time another iteration: fewer than `iters` so far, or fewer than `max_iters` within `budget_s`."""
    return len(times) < iters or (len(times) < max_iters and sum(times) < budget_s)


def time_size(size_bytes: int, iters: int, warmup: int, device: torch.device, max_iters: int = 0,
              budget_s: float = 0.0) -> list[float]:
    """Per-iteration times in seconds, each the maximum over ranks (so all ranks agree on `more`)."""
    tensor = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    cuda = device.type == "cuda"
    for _ in range(warmup):
        dist.all_reduce(tensor)
    times: list[float] = []
    while more(times, iters, max_iters, budget_s):
        dist.barrier()
        if cuda:  # nothing of the warm-up or the barrier still queued on the GPU when the clock starts
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        dist.all_reduce(tensor)
        if cuda:  # NCCL's all_reduce returns once queued: wait for the kernel itself
            torch.cuda.synchronize(device)
        # The reduction of the times is a collective too: on nccl its tensor must be on the GPU.
        elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    return times


def main(argv=None):
    args = parse_args(argv)
    is_ddp, rank, local_rank, world_size = get_dist_info()
    if not is_ddp:
        raise SystemExit("bench_allreduce needs a process group: run it under torchrun (or labctl bench allreduce)")
    c = compute_init(args.timeout_s, args.backend)
    device = c.device
    if rank == 0:
        println(f"bench_allreduce: backend {c.backend}, device {device}, world size {world_size} ({c.reason})")
    rows = []
    probe = [(args.probe_size, args.probe_iters, True)] if args.probe_iters else []
    for size, iters, is_probe in probe + [(size, args.iters, False) for size in args.sizes]:
        times = time_size(size, iters, args.warmup, device, 0 if is_probe else args.max_iters, args.budget_s)
        row = {"size": size, "count": size // 4, "type": "float", "world_size": world_size,
               "backend": c.backend, "device": device.type,
               "time_us": statistics.median(times) * 1e6, "times_us": [t * 1e6 for t in times]}
        if is_probe:
            row["probe"] = True
        rows.append(row)
        if rank == 0:
            println(("PROBE " if is_probe else "ALLREDUCE ") + json.dumps(row))
    if rank == 0:
        run_dir = Path(args.run_dir or os.environ.get("DDPLAB_RUN_DIR") or ".")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "allreduce.json").write_text(json.dumps(rows))
    compute_cleanup()


if __name__ == "__main__":
    from trainer.dist import exit_done

    main()
    exit_done()
