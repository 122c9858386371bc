"""What a training run holds, as the loop and its helpers receive it.

train.setup() builds one Run; the loop hands finish() one Result. Two small records instead of
functions of ten parameters and a 6-tuple unpacked by position.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.collectives import CollectiveLog
from trainer.dist import Compute
from trainer.instrument import CommTimer, NoProfiler, StepTiming
from trainer.metrics import MetricsWriter, NullMetrics
from trainer.workloads import Workload


@dataclass(frozen=True, kw_only=True)
class Run:
    """Everything one run is made of, set up once before the first step."""

    args: argparse.Namespace  # the flags (trainer/flags.py)
    c: Compute  # rank, world size, device, backend (trainer/dist.py)
    tag: str  # "[rank R/W host]": how every line this rank prints begins
    run_dir: Path  # metrics, profiler traces, and checkpoints unless --ckpt-dir
    workload: Workload  # samples, the raw model, the loss
    model: torch.nn.Module  # workload.model as --strategy wraps it (DDP, sharded, or pp's stage) in a world of more than one
    optimizer: torch.optim.Optimizer
    timer: CommTimer  # inside DDP's comm hook: when each step's gradients were communicated
    collectives: CollectiveLog  # every collective of the current step, by kind (trainer/collectives.py)
    metrics: MetricsWriter | NullMetrics  # this rank's metrics-rank<R>.jsonl
    prof: torch.profiler.profile | NoProfiler  # --profile's Chrome trace of steps 3-5, or a no-op
    pipeline: object = None  # --strategy pp: this rank's trainer.pipeline.Pipeline (its stage, its schedule)


@dataclass(kw_only=True)
class Result:
    """What the loop hands finish() for the SUMMARY."""

    steps: int  # the last step's number (a resumed run counts the steps before it too)
    final_loss: float  # mean loss per sample (per token for gpt) over all ranks, at the end
    samples: int  # this rank's samples over the steps it ran
    elapsed_s: float  # the loop's wall time on this rank, in seconds
    timings: list[StepTiming]  # one per step this rank ran
    extra: dict  # the mode's own SUMMARY fields (trainer/schedule.py)
    wire_tx_bytes: int | None = None  # what this node's links sent over the steps after the first (trainer/wire.py)
