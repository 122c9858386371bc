"""A DDP script that knows nothing of ddplab: it reads only the standard torchrun environment
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), as in PyTorch's own DDP tutorial.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")  # env:// from torchrun (or a static launcher)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Linear(10, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1000 + rank)  # each rank sees different data
    for _ in range(5):
        x, y = torch.randn(16, 10), torch.randn(16, 1)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    # Replicas must agree after DDP's gradient averaging.
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    print(f"PLAIN_DDP rank={rank} world={world} local_rank={os.environ['LOCAL_RANK']} "
          f"rank_sum={int(total.item())} replicas_equal={same}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # With torch 2.13, gloo and Python 3.11, a process can abort as Python exits (SIGABRT, "terminate
    # called without an active exception") while a gloo thread still frees the last collective's
    # tensors: a few runs in a hundred here. Everything is done and flushed, so leave at once.
    os._exit(0)
