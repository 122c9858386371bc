"""Rank given by argv[1] raises after the group forms; the others wait in a collective."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == int(sys.argv[1]):
    raise ValueError(f"deliberate failure on rank {dist.get_rank()}")
dist.all_reduce(torch.ones(1))
