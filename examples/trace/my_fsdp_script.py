"""An FSDP2 script of your own, with the few lines `labctl trace` reads: the metrics records, each
step's collectives in them, in the run folder labctl names in DDPLAB_RUN_DIR.

    labctl run -- examples/trace/my_fsdp_script.py --steps 20
    labctl trace                      # the timeline, and a merged trace naming every all-gather and reduce-scatter

On the host: DDPLAB_RUN_DIR=runs/mine PYTHONPATH=. torchrun --standalone --nproc_per_node=2
examples/trace/my_fsdp_script.py, then `labctl trace runs/mine`. The trainer package is in the node
image; trainer.collectives wraps torch.distributed's collectives, so FSDP2's calls are recorded
as they happen (my_ddp_script.py has the torch.profiler lines, which work here the same way).

It ends with os._exit(0), not by returning (the comment at the end of main() says why). Under
`labctl run` every script ends so anyway; under a plain torchrun, a script written without it
aborts now and then as Python exits (SIGABRT, "terminate called without an active exception"),
after all its work.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from trainer.collectives import CollectiveLog, records, span  # every collective of a step: kind, bytes, times
from trainer.instrument import wall  # the process's one clock, in unix seconds
from trainer.metrics import open_metrics, write_clock  # metrics-rank<RANK>.jsonl; its "clock" records


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run_dir = os.environ.get("DDPLAB_RUN_DIR", "runs/mine")  # labctl run sets it to the run's folder
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU()) for _ in range(3)]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(512, 10))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh)  # one unit each: gathered before its forward and its backward
    fully_shard(model, mesh=mesh)  # the root: what is left
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    log = CollectiveLog.install()
    with open_metrics(run_dir, rank) as metrics:
        write_clock(metrics, rank, "start", barriers=16)  # moments every rank shares: the clocks line up by them
        for step in range(1, args.steps + 1):
            log.start_step()
            t0 = time.perf_counter()
            model(torch.randn(64, 512)).square().mean().backward()  # all-gathers and reduce-scatters inside
            backward_end = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad()
            calls = log.end_step()
            first, last, blocked_ms = span(calls, backward_end)
            metrics.log(kind="step", rank=rank, step=step, t_start=wall(t0), t_comm_start=wall(first),
                        t_comm_end=wall(last), t_backward_end=wall(backward_end), t_end=wall(time.perf_counter()),
                        comm_wait_ms=blocked_ms, compute_ms=(backward_end - t0) * 1e3 - blocked_ms,
                        collectives=records(calls, wall))
        write_clock(metrics, rank, "end", barriers=16)  # and are checked by them
    dist.destroy_process_group()
    # Leave without Python's teardown. destroy_process_group does not stop gloo's worker threads,
    # and the one that ran a collective drops its references to it after waking this thread: the
    # tensors, and the autograd context every collective launched in backward keeps, Python
    # objects that need the GIL to let go. If that thread gets its turn only once the interpreter
    # is finalizing (a busy machine), Python 3.11 ends it with pthread_exit, whose unwind through
    # a C++ destructor aborts the process: torch's race at exit, pytorch/pytorch#190489 and #179291.
    # Everything is written and flushed, so nothing is lost.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
