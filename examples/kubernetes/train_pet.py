"""A DDP script written for Kubeflow Trainer's torch runtime started with plain `python`, not
torchrun: it forms its process group from the PET_* variables the runtime gives every pod
(PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT), one process per pod.

    labctl up --nodes 2
    labctl k8s run examples/kubernetes/trainjob.yaml

Without torchrun nothing sets RANK and WORLD_SIZE: a script that calls init_process_group() with
no arguments fails in every pod, and one that falls back to a world of 1 trains N separate models.
Rank 0 prints `SUMMARY {"world_size", "final_loss", "replicas_consistent"}` at the end.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    rank, world = int(os.environ["PET_NODE_RANK"]), int(os.environ["PET_NNODES"])
    address = f"tcp://{os.environ['PET_MASTER_ADDR']}:{os.environ['PET_MASTER_PORT']}"
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
    print(f"rank {rank} of {dist.get_world_size()}, LEARNING_RATE={os.environ.get('LEARNING_RATE')}", flush=True)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=float(os.environ.get("LEARNING_RATE", "0.05")))
    data = torch.Generator().manual_seed(1 + rank)
    for _ in range(args.steps):
        x = torch.randn(32, 16, generator=data)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    total = torch.tensor([loss.item()])
    dist.all_reduce(total)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    spread = flat.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    if rank == 0:
        summary = {"world_size": world, "final_loss": total.item() / world,
                   "replicas_consistent": bool(torch.equal(spread, flat))}
        print("SUMMARY " + json.dumps(summary), flush=True)
    dist.destroy_process_group()
    # Python's own exit can abort (SIGABRT) while a gloo thread still frees the last collective's
    # tensors, a few runs in a hundred on a busy machine (pytorch/pytorch#179291): everything is
    # written, so the process ends here, as `python -m trainer` does.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
