"""Synthetic classification data that a small MLP can actually learn."""

import torch
from torch.utils.data import TensorDataset


def make_dataset(samples, features, classes, seed):
    """TensorDataset of (x float32 [samples, features], y int64 [samples]).

    Labels come from a fixed random linear "teacher": y = argmax(x @ W + b).
    Being a deterministic function of x, the loss can fall well below
    log(classes). Everything is drawn from one torch.Generator seeded with
    `seed`, so every rank builds the identical dataset without any
    communication, and the global RNG (model init) is left untouched.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    teacher_w = torch.randn(features, classes, generator=g)
    teacher_b = torch.randn(classes, generator=g)
    y = (x @ teacher_w + teacher_b).argmax(dim=1)
    return TensorDataset(x, y)
