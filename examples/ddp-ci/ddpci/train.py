"""Train a tiny regression model with DDP over gloo and check that every replica ends the same.

    torchrun --standalone --nproc-per-node 2 ddpci/train.py --steps 20     # one machine
    labctl run -- examples/ddp-ci/ddpci/train.py --steps 20                 # every node of a lab

Each rank draws its own data; DDP averages the gradients, so every replica must hold the same
parameters after every step. Rank 0 gathers each rank's parameter checksum and prints one line,
`SUMMARY {"world_size": ..., "checksums": [...], "replicas_consistent": ...}`.
`--fail-node NODE --fail-step S` makes the rank on host NODE raise at step S (with `--hang`, stop
answering instead): the failing examples of tests/ (by host, not by rank: torchrun's rendezvous
gives out ranks in the order nodes join).
"""

import argparse
import hashlib
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="train a tiny model with DDP (gloo) and compare the replicas")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--step-s", type=float, default=0.0, help="seconds to sleep after each step, to make a run "
                                                              "long enough to interrupt (default 0)")
    p.add_argument("--fail-node", default="", help="the ranks on this host raise at --fail-step (default: none)")
    p.add_argument("--fail-step", type=int, default=0, help="the step at which --fail-node's ranks raise (default 0)")
    p.add_argument("--hang", action="store_true", help="--fail-node's ranks hang at --fail-step instead of raising")
    return p.parse_args(argv)


def checksum(model: nn.Module) -> str:
    data = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    return hashlib.sha256(data).hexdigest()[:16]


def main():
    args = parse_args()
    dist.init_process_group("gloo")  # env:// from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    where = f"[rank {rank}/{world} {socket.gethostname()}]"
    torch.manual_seed(0)  # the same initial weights everywhere (DDP would broadcast rank 0's anyway)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own samples
    for step in range(args.steps):
        x = torch.randn(args.batch, 16, generator=data)
        y = x.sum(dim=1, keepdim=True)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if socket.gethostname() == args.fail_node and step == args.fail_step:
            if args.hang:  # the others wait for this rank's gradients in the next all-reduce
                time.sleep(3600)
            raise ValueError(f"deliberate failure on {args.fail_node} (rank {rank}) at step {step}")
        print(f"{where} step {step + 1}/{args.steps} loss {loss.item():.4f}", flush=True)
        time.sleep(args.step_s)
    sums = [None] * world
    dist.all_gather_object(sums, checksum(model.module))
    if rank == 0:
        summary = {"world_size": world, "steps": args.steps, "final_loss": loss.item(), "checksums": sums,
                   "replicas_consistent": len(set(sums)) == 1,
                   "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
        print("SUMMARY " + json.dumps(summary), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13 with gloo can abort as Python exits while a gloo thread still frees the last
    # collective's tensors (pytorch/pytorch#179291): everything is printed and flushed, so leave now.
    os._exit(0)
