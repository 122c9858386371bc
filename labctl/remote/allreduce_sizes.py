"""The mtu-blackhole scenario's job (labctl/diagnose/traps.py): all_reduce of growing sizes, each
timed, run as `python -c TEXT` with a static launch's environment.

Every rank joins a gloo group (its timeout: DDPLAB_PG_TIMEOUT_S seconds, else 60) and all-reduces
a tensor of each size in turn. Rank 0 prints a line per size. Where an all_reduce gets no answer
before the timeout, every rank that saw it prints `all_reduce of SIZE stalled` with what passed
before it, and exits 1: the symptom of a path that loses large packets, which torch itself only
reports as a timeout.
"""

import datetime
import os
import time

import torch
import torch.distributed as dist

SIZES = (256, 1024, 4096, 65536, 1 << 20)  # bytes: a barrier's worth up to a gradient bucket's


def human(n):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return "%d %s" % (n // scale, unit)
    return "%d B" % n


def main():
    timeout = float(os.environ.get("DDPLAB_PG_TIMEOUT_S", "60"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    rank, passed = dist.get_rank(), []
    for size in SIZES:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(size // 4))
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            print("all_reduce of %s stalled: no answer in %.0f s on rank %d (%s passed): %s"
                  % (human(size), time.monotonic() - t0, rank, ", ".join(passed) or "nothing", first), flush=True)
            os._exit(1)  # the group is broken: leaving it cleanly would wait again
        passed.append(human(size))
        if rank == 0:
            print("all_reduce of %s: %.1f ms" % (human(size), (time.monotonic() - t0) * 1000), flush=True)
    if rank == 0:
        print("every size passed: %s" % ", ".join(passed), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
