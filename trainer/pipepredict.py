"""A pipeline's step, predicted before the first (--strategy pp): the step model's calibration, for stages.

Every stage runs a few steps of the run's own schedule on the first step's batch, their gradients
dropped (CALIBRATION_STEPS, after one to warm up), and times its optimizer's step on copies of its
parameters: the prediction is the sampled step (the mean of the slowest stage's) plus the slowest
optimizer. It is taken apart too: each stage's forward and backward of a micro-batch as the schedule
ran them (medians), each pair of neighbours timing a micro-batch's activations there and back (gloo's
send and recv), and the step played out from those (parallelcost.simulate_pipeline: each stage's
actions in its schedule's order, each waiting for what its neighbours send). What the sampled step
has beyond the played-out one is neither compute nor transfer: the schedule's own bookkeeping, ranks
descheduled while they wait (on a 2-core machine, 3 stages took 44 to 48% more than played out).
"""

from __future__ import annotations

import statistics
import time

import torch

from trainer import stepmodel
from trainer.calibrate import held_parameters, optimizer_copy
from trainer.dist import all_gather, barrier
from trainer.parallelcost import bubble, simulate_pipeline

PING_REPS, PING_WARMUP = 8, 2
CALIBRATION_STEPS = 4  # of the schedule itself, after one to warm up


def schedule_steps(pipe, x, y, steps: int = CALIBRATION_STEPS) -> tuple[list[list], list[float]]:
    """`steps` steps of the run's own schedule on (x, y), after one to warm up, their gradients
    dropped (no optimizer step: the run never sees them): (each action's [kind, micro-batch, t0, t1],
    as the run's step records have them; each step's wall time in ms). Collective: every stage runs
    its part, and a barrier starts each step together."""
    events, walls = [], []
    for step in range(1 + steps):
        barrier()
        t0 = time.perf_counter()
        pipe.step(x, y)
        wall = (time.perf_counter() - t0) * 1e3
        for p in pipe.module.parameters():
            p.grad = None
        if step:
            events, walls = events + pipe.events, walls + [wall]
    return events, walls


def ping_ms(pipe, activations: torch.Tensor) -> list[float]:
    """One way across each boundary between stages, in ms: half the median round trip of a
    micro-batch's activations between the two neighbours, the even boundaries first, then the odd
    (a rank is in one pair at a time). Collective: every rank calls it."""
    rank, stages = pipe.rank, pipe.stages
    mine = None
    for parity in (0, 1):
        partner = rank + 1 if rank % 2 == parity else rank - 1  # the pairs (r, r + 1) with r of this parity
        if 0 <= partner < stages:
            times = []
            for rep in range(PING_WARMUP + PING_REPS):
                t0 = time.perf_counter()
                if rank < partner:
                    torch.distributed.send(activations, partner)
                    torch.distributed.recv(activations, partner)
                else:
                    torch.distributed.recv(activations, partner)
                    torch.distributed.send(activations, partner)
                if rep >= PING_WARMUP:
                    times.append((time.perf_counter() - t0) * 1e3)
            if rank < partner:
                mine = statistics.median(times) / 2
        barrier()
    return [t for t in all_gather(mine) if t is not None]


def predict(run, schedule) -> tuple[stepmodel.Prediction, dict]:
    """This pipeline's step, predicted from its calibration: (the prediction, what it was calibrated
    on), as calibrate.predict_run gives them for the other strategies. Collective."""
    args, c, pipe = run.args, run.c, run.pipeline
    micro = schedule.global_batch // pipe.micro_batches
    x, y = schedule.batch(schedule.start).micros[0]
    barrier()  # every stage at once, as the steps will
    events, walls = schedule_steps(pipe, x.to(c.device), y.to(c.device))
    mine = [statistics.median((t1 - t0) * 1e3 for kind, _, t0, t1 in events if kind == which)
            for which in ("forward", "backward")]
    step = optimizer_copy(held_parameters(run.model, run.optimizer), args.lr).step
    # the sampled steps' mean, as the run reports its mean step: a node held by its CPU quota has a long tail
    mine += [statistics.median(timed(step) for _ in range(PING_REPS)), statistics.fmean(walls)]
    everyone = all_gather(mine)
    transfer = ping_ms(pipe, torch.zeros(micro, args.block_size, args.n_embd, device=c.device))
    stage_ms = [(f, b) for f, b, _, _ in everyone]
    played = simulate_pipeline(stage_ms, args.schedule, pipe.micro_batches, transfer)
    sampled, optimizer_ms = max(w for *_, w in everyone), max(o for _, _, o, _ in everyone)
    own = pipe.micro_batches * sum(stage_ms[c.rank])
    prediction = stepmodel.Prediction(step_ms=sampled + optimizer_ms, compute_ms=own, waiting_ms=sampled - own,
                                      optimizer_ms=optimizer_ms, comm_ms=2 * pipe.micro_batches * sum(transfer),
                                      exposed_comm_ms=sampled - own,
                                      terms={"bubble": bubble(pipe.stages, pipe.micro_batches), "played_out_ms": played})
    return prediction, {"stage_ms": [[round(f, 3), round(b, 3)] for f, b in stage_ms],
                        "transfer_ms": [round(t, 3) for t in transfer], "accum": pipe.micro_batches,
                        "sampled_ms": round(sampled, 3), "played_out_ms": round(played, 3),
                        "calibration_steps": CALIBRATION_STEPS, "pipeline": True}


def timed(fn) -> float:
    """fn()'s wall time, in ms."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3
