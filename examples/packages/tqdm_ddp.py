"""A DDP script whose one import beyond torch is tqdm: it runs on a lab that has tqdm, and on a
plain lab it fails on every rank with ModuleNotFoundError, as it would on a cluster whose nodes
lack it.

    labctl up --nodes 3 --with tqdm
    labctl run -- examples/packages/tqdm_ddp.py --steps 20

Each rank trains a few steps behind a progress bar (rank 0's alone is shown) and says which tqdm it
imported; rank 0 then prints `SUMMARY {"world_size", "tqdm": [each rank's version], "same_tqdm"}`.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import tqdm
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser(description="DDP with a tqdm progress bar on every node")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # The bar on stdout, where the lines below go too: one stream keeps them in order in the node's log.
    for _ in tqdm.trange(args.steps, disable=rank != 0, desc="steps", mininterval=1.0, file=sys.stdout):
        x = torch.randn(16, 8)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"rank {rank}/{world}: tqdm {tqdm.__version__}", flush=True)
    versions = [None] * world
    dist.all_gather_object(versions, tqdm.__version__)
    if rank == 0:
        print("SUMMARY " + json.dumps({"world_size": world, "tqdm": versions, "same_tqdm": len(set(versions)) == 1}),
              flush=True)
    dist.destroy_process_group()
    # Python's own exit can abort (SIGABRT) while a gloo thread still frees the last collective's
    # tensors, a few runs in a hundred on a busy machine (pytorch/pytorch#179291): everything is
    # written, so the process ends here, as `python -m trainer` does.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
