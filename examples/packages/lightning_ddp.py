"""PyTorch Lightning's DDP on every node of a lab: a tiny regression, then each replica's parameters compared.

    labctl up --nodes 3 --requirements examples/packages/requirements.txt
    labctl run -- examples/packages/lightning_ddp.py --epochs 2

Lightning reads torchrun's environment (its TorchElastic cluster environment), which every labctl
launcher gives a worker, so the script says only how many nodes and processes the job has: the
GROUP_WORLD_SIZE and LOCAL_WORLD_SIZE torchrun sets. After training, rank 0 gathers every rank's
parameter checksum and prints `SUMMARY {"world_size", "checksums", "replicas_consistent", "lightning"}`.
"""

import argparse
import hashlib
import json
import os

import lightning as L
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def checksum(model: nn.Module) -> str:
    data = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    return hashlib.sha256(data).hexdigest()[:16]


def main():
    p = argparse.ArgumentParser(description="Lightning DDP on CPU across the lab's nodes")
    p.add_argument("--epochs", type=int, default=2, help="passes over the data (default 2)")
    p.add_argument("--samples", type=int, default=1536, help="samples in the data set, shared out by rank (default 1536)")
    args = p.parse_args()
    torch.manual_seed(0)  # the same data and initial weights on every rank
    x = torch.randn(args.samples, 16)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32)
    model = Regression()
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
                        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), max_epochs=args.epochs,
                        enable_progress_bar=False, enable_checkpointing=False, logger=False, enable_model_summary=False)
    trainer.fit(model, data)
    sums = [None] * dist.get_world_size()
    dist.all_gather_object(sums, checksum(model))
    if dist.get_rank() == 0:
        print("SUMMARY " + json.dumps({"world_size": dist.get_world_size(), "checksums": sums,
                                       "replicas_consistent": len(set(sums)) == 1, "lightning": L.__version__}),
              flush=True)


if __name__ == "__main__":
    main()
