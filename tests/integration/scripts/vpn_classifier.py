"""A two-machine DDP script as people write one for a home lab on a mesh VPN: a small classifier,
a DistributedSampler, gloo, started by torchrun with the c10d rendezvous. It reads only torchrun's
environment; the interface gloo uses is GLOO_SOCKET_IFNAME's (tailscale0 on the VPN).

    torchrun ... vpn_classifier.py [EPOCHS]
    VPN_DDP rank=R world=W iface=I grad_bytes=B steps=S loss=L replicas_equal=True

grad_bytes: what each rank's gradients weigh (float32), steps: the optimizer steps it took, so
grad_bytes * steps is what DDP all-reduced; a ring sends about that much from every rank.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(0)  # the same data set on every machine
    features = torch.randn(1024, 32, generator=generator)
    labels = (features[:, :4].sum(dim=1) > 0).long()
    data = TensorDataset(features, labels)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps, loss = 0, torch.tensor(0.0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"VPN_DDP rank={rank} world={world} iface={os.environ.get('GLOO_SOCKET_IFNAME', '-')} "
          f"grad_bytes={grad_bytes} steps={steps} loss={loss.item():.4f} replicas_equal={same}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    os._exit(0)  # as plain_ddp.py: leave before a gloo thread can abort the interpreter's exit
