"""Checkpoints that survive the crash they are for.

Rank 0 writes step-<N>.pt to a temporary name in the same directory, fsyncs it, renames it into
place (atomic on POSIX) and fsyncs the directory, so a reader sees a whole checkpoint or none: a
crash mid-write leaves only a temporary file, which is never loaded. Loading takes the newest
checkpoint that loads, so even a file damaged some other way falls back to the one before. The
oldest are pruned, keeping `keep`.

With global-batch semantics (trainer/batching.py) the samples of step N depend only on the seed,
the global batch and N, so model and optimizer state are all a resumed run needs to continue
exactly where the lost one was, even on a different number of ranks.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

_NAME = re.compile(r"^step-(\d+)\.pt$")


def checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, newest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found, reverse=True)


def save(directory: Path, step: int, state: dict, keep: int = 2) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step}.pt"
    tmp = directory / f".step-{step}.pt.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        torch.save({**state, "step": step}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself is durable
    finally:
        os.close(fd)
    for _, old in checkpoints(directory)[keep:]:
        old.unlink(missing_ok=True)
    return final


def load_latest(directory: Path) -> tuple[dict | None, Path | None, list[str]]:
    """(state, path, problems): the newest checkpoint that loads, and why newer ones did not."""
    problems = []
    for _, path in checkpoints(directory):
        try:
            return load(path), path, problems
        except Exception as exc:  # a damaged file: say so and fall back to the one before
            problems.append(f"{path.name}: {str(exc).splitlines()[0][:120]}")
    return None, None, problems


def load(path: str | Path) -> dict:
    return torch.load(path, weights_only=True)
