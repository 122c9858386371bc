"""Time the all-reduce of one large tensor across every rank: is it the network that sets the pace?

    torchrun --standalone --nproc-per-node 2 ddpci/allreduce.py --mib 4
    labctl run -- examples/ddp-ci/ddpci/allreduce.py --mib 4

After one warm-up, `--iters` all-reduces are timed between barriers; an iteration's time is the
slowest rank's (the collective is done when the last rank is) and the result is the median. A
ring all-reduce makes each rank send and receive 2(n-1)/n of the tensor, so the bytes each link
carries per second, the bus bandwidth, is that share of the tensor over the time: on a link-bound
lab, close to the link's rate. Rank 0 prints `SUMMARY {"bytes": ..., "seconds": ..., "busbw_Bps": ...}`.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="time the all-reduce of one large float32 tensor")
    p.add_argument("--mib", type=int, default=4, help="tensor size in MiB (default 4)")
    p.add_argument("--iters", type=int, default=3, help="timed all-reduces (default 3)")
    return p.parse_args(argv)


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    size_bytes = args.mib * 1024 * 1024
    tensor = torch.ones(size_bytes // 4, dtype=torch.float32)
    dist.all_reduce(tensor)  # warm-up: connections made, buffers allocated
    times = []
    for _ in range(args.iters):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time
        times.append(elapsed.item())
    if rank == 0:
        seconds = statistics.median(times)
        busbw = size_bytes * 2 * (world - 1) / world / seconds
        print("SUMMARY " + json.dumps({"bytes": size_bytes, "world_size": world, "seconds": seconds,
                                       "times": times, "busbw_Bps": busbw}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    os._exit(0)  # see train.py: leave before torch's gloo threads can abort Python's exit
