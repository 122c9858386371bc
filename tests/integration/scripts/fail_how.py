"""The rank given fails the way given once the group has formed; the others wait in a collective.

    fail_how.py MODE RANK [ARG]
    MODE: exit (sys.exit(ARG, default 3)), raise (ValueError), kill (SIGKILL itself),
          segv (SIGSEGV itself), hang (sleeps forever; the others too),
          loop (every rank all-reduces forever: for a node killed from outside; RANK -1)
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

mode, bad_rank = sys.argv[1], int(sys.argv[2])
arg = sys.argv[3] if len(sys.argv) > 3 else None
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
# One write for the whole line: print() writes the text and its newline separately, and with the
# output unbuffered a traceback on stderr (relayed by another thread) can land between the two.
sys.stdout.write(f"FAIL_HOW rank={rank} world={dist.get_world_size()} ready\n")
sys.stdout.flush()
if rank == bad_rank:
    if mode == "exit":
        sys.exit(int(arg or 3))
    if mode == "raise":
        raise ValueError(f"deliberate failure on rank {rank}")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "hang":
        time.sleep(3600)
while mode == "loop":
    dist.all_reduce(torch.ones(1))
    time.sleep(0.1)
dist.all_reduce(torch.ones(1))
if mode == "hang":
    time.sleep(3600)
sys.stdout.write(f"FAIL_HOW rank={rank} done\n")
sys.stdout.flush()
