"""Checkpoints that survive the crash they are for.

Rank 0 writes step-<N>.pt to a temporary name in the same directory, fsyncs it, renames it into
place (atomic on POSIX) and fsyncs the directory, so a reader sees a whole checkpoint or none: a
crash mid-write leaves only a temporary file, which is never loaded. Loading takes the newest
checkpoint that loads, so even a file damaged some other way falls back to the one before. The
oldest are pruned, keeping `keep`.

With global-batch semantics (trainer/batching.py) the samples of step N depend only on the seed,
the global batch and N, so model and optimizer state are all a resumed run needs to continue
exactly where the lost one was, even on a different number of ranks.

Per strategy (trainer/strategy.py): ddp's state is whole on every rank, and rank 0 saves it;
zero's optimizer state is sharded, so every rank first sends its shard to rank 0
(ZeroRedundancyOptimizer.consolidate_state_dict) and rank 0 saves the whole; fsdp's is sharded
and stays so: every rank writes its shards with torch.distributed.checkpoint into a folder
step-<N>/ (through a temporary one that rank 0 renames when all have written, beside meta.pt),
and a resumed run reads them back resharded for its own world size.

The bottom half is the trainer's use of them: which directory, what goes in, and resuming, which
needs every rank to agree on the checkpoint it starts from.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch

from trainer.dist import all_gather, barrier, print0, println
from trainer.strategy import SHARDED

_NAME = re.compile(r"^step-(\d+)(\.pt)?$")  # a whole checkpoint's file, or a sharded one's folder
META = "meta.pt"  # in a sharded checkpoint's folder: what a resumed run must match


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
    prune(directory, keep)
    return final


def prune(directory: Path, keep: int) -> None:
    for _, old in checkpoints(directory)[keep:]:
        if old.is_dir():  # a sharded checkpoint's folder
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


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
    """A whole checkpoint; a sharded one's meta.pt (its shards are read by load_sharded)."""
    path = Path(path)
    return torch.load(path / META if path.is_dir() else path, weights_only=True)


# --- the trainer's checkpoints --------------------------------------------------------------------

def directory(run) -> Path:
    """--ckpt-dir, else <run dir>/checkpoints."""
    return Path(run.args.ckpt_dir) if run.args.ckpt_dir else Path(run.run_dir) / "checkpoints"


def save_step(run, step: int, global_batch: int) -> None:
    """Model and optimizer after `step`, with what a resumed run must match. Every rank calls it:
    zero's and fsdp's saves are collectives."""
    meta = {"workload": run.workload.name, "global_batch": global_batch, "seed": run.args.seed,
            "strategy": run.args.strategy}
    if run.args.strategy in SHARDED and run.c.world_size > 1:
        save_sharded(run, step, meta)
        return
    if run.args.strategy == "zero" and run.c.world_size > 1:
        run.optimizer.consolidate_state_dict(to=0)  # every rank's shard of Adam's state, to rank 0
    if run.c.rank == 0:
        save(directory(run), step, {"model": run.workload.model.state_dict(), "optimizer": run.optimizer.state_dict(),
                                    **meta})


def save_sharded(run, step: int, meta: dict, keep: int = 2) -> Path:
    """Every rank's shards into step-<step>/ with torch.distributed.checkpoint: written to a temporary
    folder, which rank 0 renames once all have written, so a folder named step-<N> is whole."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = directory(run)
    tmp, final = folder / f".step-{step}.tmp", folder / f"step-{step}"
    if run.c.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # what a crash mid-write left
        tmp.mkdir(parents=True)
    barrier()
    model_state, optimizer_state = get_state_dict(run.model, run.optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(tmp))
    barrier()
    if run.c.rank == 0:
        torch.save({**meta, "step": step}, tmp / META)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        prune(folder, keep)
    barrier()
    return final


def load_sharded(run, path: Path) -> None:
    """A sharded checkpoint into this run's model and optimizer, resharded for its world size."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(run.model, run.optimizer)  # Adam's state made, to be filled
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(run.model, run.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def resume(run, global_batch: int) -> int:
    """The step to start from: 1, or one past the newest checkpoint rank 0 can load."""
    args, c, workload = run.args, run.c, run.workload
    chosen = None
    if c.rank == 0:
        state, path, problems = load_latest(directory(run))
        for problem in problems:
            println(f"{run.tag} skipping a damaged checkpoint: {problem}")
        chosen = str(path) if path else None
    chosen = all_gather(chosen)[0]  # every rank resumes from the checkpoint rank 0 chose
    if chosen is None:
        return 1
    state = load(chosen)
    if (state.get("workload"), state.get("global_batch"), state.get("seed")) != (workload.name, global_batch, args.seed):
        raise SystemExit(f"error: checkpoint {chosen} is of workload {state.get('workload')}, global batch "
                         f"{state.get('global_batch')}, seed {state.get('seed')}; this run is {workload.name}, "
                         f"{global_batch}, {args.seed}. Use another --ckpt-dir or remove it")
    if state["step"] >= args.steps:
        raise SystemExit(f"error: checkpoint {chosen} is at step {state['step']}, not before --steps {args.steps}: "
                         "nothing left to train")
    sharded = Path(chosen).is_dir()
    if sharded != (args.strategy in SHARDED and c.world_size > 1):
        raise SystemExit(f"error: checkpoint {chosen} holds {'sharded' if sharded else 'whole'} state (--strategy "
                         f"{state.get('strategy', 'ddp')}); this run is --strategy {args.strategy} on {c.world_size} "
                         "rank(s). Resume it with its own strategy, or use another --ckpt-dir")
    if sharded:
        load_sharded(run, Path(chosen))
    else:
        workload.model.load_state_dict(state["model"])
        run.optimizer.load_state_dict(state["optimizer"])
    print0(f"{run.tag} resuming from step {state['step']} ({chosen}), restart "
           f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}, world size {c.world_size}")
    return state["step"] + 1
