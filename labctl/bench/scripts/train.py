"""A typical DDP tutorial `train.py`, as people copy it from PyTorch's docs: a small model, a
synthetic dataset behind a DistributedSampler, one epoch, rank 0 prints the loss. It knows nothing
of ddplab: only torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    torchrun --nproc_per_node=2 train.py          # one machine
    labctl run -- train.py                        # the lab's nodes
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(2048, 20), torch.randint(0, 2, (2048,)))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(1):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
    total = torch.tensor([loss.item()])
    dist.all_reduce(total)
    if rank == 0:
        print(f"TRAIN epoch 1 world {dist.get_world_size()} mean last loss {total.item() / dist.get_world_size():.4f}",
              flush=True)
    print(f"TRAIN rank {rank} local_rank {os.environ['LOCAL_RANK']} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
