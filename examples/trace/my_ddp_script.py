"""A DDP script of your own, with the few lines `labctl trace` reads: a torch.profiler trace and the
metrics records, both in the run folder labctl names in DDPLAB_RUN_DIR.

    labctl run -- examples/trace/my_ddp_script.py --steps 20
    labctl trace                      # the timeline, the merged trace (profiler events included), the table

On the host: DDPLAB_RUN_DIR=runs/mine PYTHONPATH=. torchrun --standalone --nproc_per_node=2
examples/trace/my_ddp_script.py, then `labctl trace runs/mine`. In a lab's nodes the trainer package
is on the path already (it is in the node image). It ends with os._exit(0), as my_fsdp_script.py
does and for the same reason (the comment at the end of its main()): under a plain torchrun, a
script that returns instead aborts now and then as Python exits, after all its work.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule

from trainer.ddp import param_checksum
from trainer.instrument import CommTimer, wall  # a DDP comm hook wrapper; the process's one clock, in unix seconds
from trainer.metrics import open_metrics, write_clock  # metrics-rank<RANK>.jsonl; its "clock" records

# Kineto, the profiler's engine, prints a line at each start and stop of a profile ("USDT: ...
# profiler_start"), at a level above its own errors, so only its highest level leaves them out. This
# script's own setting (setdefault: a KINETO_LOG_LEVEL of yours wins; 3 brings Kineto's errors back).
os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run_dir = os.environ.get("DDPLAB_RUN_DIR", "runs/mine")  # labctl run sets it to the run's folder
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                              torch.nn.Linear(1024, 10))
    model = DDP(net, bucket_cap_mb=1)  # 1 MB buckets: the first are all-reduced while backward goes on
    timer = CommTimer()
    model.register_comm_hook(None, timer.wrap(default_hooks.allreduce_hook))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trace = f"{run_dir}/trace-rank{rank}.json"  # the name labctl trace looks for
    # One profile (repeat=1) of steps 3 to 5: a schedule that repeats starts the profiler again every 5
    # steps, and each start after the first warns that the last one's events were cleared.
    with open_metrics(run_dir, rank) as metrics, profile(
            activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(trace)) as prof:
        write_clock(metrics, rank, "start", barriers=16)  # moments every rank shares: the clocks line up by them
        for step in range(1, args.steps + 1):
            timer.reset()
            t0 = time.perf_counter()
            loss = model(torch.randn(64, 256)).square().mean()
            loss.backward()  # DDP all-reduces inside backward
            backward_end = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad()
            wait_ms = timer.wait_ms(backward_end)
            metrics.log(kind="step", rank=rank, step=step, t_start=wall(t0), t_comm_start=wall(timer.first_launch),
                        t_comm_end=wall(timer.last_done), t_backward_end=wall(backward_end), t_end=wall(time.perf_counter()),
                        comm_wait_ms=wait_ms, compute_ms=(backward_end - t0) * 1e3 - wait_ms)
            prof.step()
        write_clock(metrics, rank, "end", barriers=16)  # and are checked by them
    checksums = [None] * dist.get_world_size()
    dist.all_gather_object(checksums, param_checksum(model))  # sha256 of the parameters: one value if DDP held
    if rank == 0:  # what it did, in one line: the replicas agree, or they do not
        agree = "on every rank" if len(set(checksums)) == 1 else f"DIFFERING between ranks: {checksums}"
        print(f"my_ddp_script: {args.steps} steps on {len(checksums)} ranks, last loss {loss.item():.6f}, "
              f"parameters {checksums[0]} {agree}", flush=True)
    dist.destroy_process_group()
    # Leave without Python's teardown, where a gloo thread still letting go of DDP's last all-reduce
    # can abort the process (pytorch/pytorch#190489). Everything is written and flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
