"""Joins the process group, then sleeps: the target of the Ctrl-C test."""

import time

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"SLEEPER_READY rank={dist.get_rank()}", flush=True)
time.sleep(600)
