"""The two workloads the loop trains: an MLP on synthetic classes (toy), a character-level GPT (gpt).

A Workload is all the loop in train.py sees of them: samples by index, the model and the loss, so
epoch mode, global-batch mode, checkpoints and the SUMMARY work the same for both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from trainer import gpt
from trainer.data import make_dataset
from trainer.dist import all_gather, barrier, print0, println
from trainer.model import MLP


@dataclass
class Workload:
    """What the loop needs to know of a workload: samples by index, the model, the loss."""

    name: str  # "toy" or "gpt"
    model: torch.nn.Module  # the raw module, before DDP
    batch: Callable  # a tensor of sample indices -> (x, y) on the CPU
    n_samples: int
    tokens_per_sample: int  # 1 for toy, --block-size for gpt
    extra: dict = field(default_factory=dict)  # for the SUMMARY
    dataset: torch.utils.data.Dataset | None = None  # toy: what epoch mode's DistributedSampler walks

    def loss_sum(self, logits, y):
        """Summed (not averaged) over samples and tokens: the loop scales it to a mean."""
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")


def toy_workload(args, c):
    dataset = make_dataset(args.samples, args.features, args.classes, args.seed)
    x_all, y_all = dataset.tensors
    model = MLP(args.features, args.hidden, args.classes).to(c.device)
    return Workload("toy", model, lambda idx: (x_all[idx], y_all[idx]), len(y_all), 1, dataset=dataset)


def resolve_data_dir(data_dir_arg):
    if data_dir_arg:
        return Path(data_dir_arg)
    if os.environ.get("DDPLAB_DATA_DIR"):
        return Path(os.environ["DDPLAB_DATA_DIR"])
    if os.access("/shared", os.W_OK):  # the lab's shared volume, as a cluster's shared file system
        return Path("/shared/ddplab-data")
    return Path.home() / ".cache" / "ddplab"


def gpt_workload(args, c, tag):
    """Rank 0 prepares the corpus on the shared data dir; everyone waits, then reads the same file."""
    data_dir = resolve_data_dir(args.data_dir)
    try:
        if c.rank == 0:
            gpt.prepare_corpus(data_dir, args.corpus_chars)
        barrier()  # the MNIST-on-a-shared-disk race: nobody reads before rank 0 has finished writing
        path = gpt.corpus_path(data_dir, args.corpus_chars)
        if not path.exists():
            # A data dir that is not shared (separate machines, no shared file system): the recipe is
            # deterministic, so prepare a node-local copy; the hash check below catches any difference.
            println(f"{tag} {data_dir} is not shared with rank 0; preparing the corpus on this node")
            gpt.prepare_corpus(data_dir, args.corpus_chars)
        data = gpt.load_corpus(path)
    except OSError as e:
        raise SystemExit(f"error: cannot prepare the corpus under --data-dir '{data_dir}': {e.strerror or e}; "
                         "pass --data-dir or set DDPLAB_DATA_DIR to a writable path") from None
    hashes = all_gather(data["sha256"])
    if len(set(hashes)) > 1:
        raise SystemExit(f"error: the corpus differs between ranks (sha256 {sorted(set(hashes))}); a node runs another "
                         "trainer/corpus.py or its data dir holds a damaged file: sync the code, clear --data-dir")
    windows = gpt.TextWindows(data["tokens"], args.block_size)
    torch.manual_seed(args.seed)
    try:
        model = gpt.GPT(len(data["vocab"]), args.block_size, args.n_layer, args.n_embd, args.n_head).to(c.device)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    extra = {"params": gpt.param_count(model), "vocab": len(data["vocab"]), "corpus_chars": len(data["tokens"]),
             "corpus_sha256": data["sha256"], "block_size": args.block_size}
    print0(f"{tag} gpt: {extra['params']:,} parameters, vocab {extra['vocab']}, "
           f"{extra['corpus_chars']:,} characters from {path}")
    return Workload("gpt", model, windows.batch, windows.n_samples, args.block_size, extra)
