"""A tensor-parallel step, predicted before the first (--strategy tp, fsdp+tp): the step model's
calibration, for blocks split over a node's processes.

Every rank runs a few steps of the run's own model on the first step's micro-batches, after one to
warm up, their gradients dropped (the optimizer steps copies: the run never sees them): forward and
backward through the split blocks with their all-reduces inside the node, and the gradients'
all-reduce (or FSDP2's gathers and reduce-scatters) across nodes, as the steps will. The prediction
is the sampled step (the trimmed mean of the slowest rank's), with those steps' 10th to 90th
percentile for its band. It is taken apart from the sample's own collectives: the blocks'
all-reduces (tp_all_reduce), which the cost model counts too (parallelcost.tp_all_reduces: 4 a
block and micro-batch), the rest of the communication across nodes, and the optimizer timed alone.
"""

from __future__ import annotations

import statistics
import time

from trainer import parallelcost, stepmodel, strategy
from trainer.calibrate import held_parameters, optimizer_copy
from trainer.collectives import in_flight_ms
from trainer.dist import all_gather, barrier
from trainer.instrument import deciles  # the spread the run's measured steps are given, the same way
from trainer.pipepredict import PING_REPS, timed
from trainer.tensorparallel import tp_size

# Steps sampled, after one to warm up: a node's processes share its cores, and one sampled step in
# eight now and then takes two to four times the others (descheduled), which a mean of a few steps
# takes in whole and a run's mean of many dilutes: the prediction is their mean without the longest
# and the shortest (docs/explanation/cost-model.md, "Tensor parallelism's step").
CALIBRATION_STEPS = 8


def sample_steps(run, micros, optimizer_step, steps: int = CALIBRATION_STEPS) -> tuple[list[float], list[list]]:
    """`steps` steps of the run's model on `micros`, after one to warm up, gradients dropped, each
    with `optimizer_step` (Adam on copies of what this rank holds: nothing the run trains): (each
    step's wall time in ms, each step's collectives). Collective: a barrier starts each step together."""
    walls, calls = [], []
    for step in range(1 + steps):
        barrier()
        run.collectives.start_step()
        t0 = time.perf_counter()
        for k, (x, y) in enumerate(micros):
            with strategy.micro_step(run.model, last=k == len(micros) - 1):
                run.workload.loss_sum(run.model(x), y).backward()
        made = run.collectives.end_step()
        optimizer_step()
        wall = (time.perf_counter() - t0) * 1e3
        for p in run.model.parameters():
            p.grad = None
        if step:
            walls, calls = walls + [wall], calls + [made]
    return walls, calls


def trimmed_mean(values: list[float]) -> float:
    """The mean without the longest and the shortest (of three or more)."""
    kept = sorted(values)[1:-1] if len(values) > 2 else values
    return statistics.fmean(kept)


def predict(run, schedule) -> tuple[stepmodel.Prediction, dict]:
    """This run's step, predicted from its sample: (the prediction, what it was calibrated on), as
    calibrate.predict_run gives them for DDP and the sharded strategies. Collective."""
    args, c = run.args, run.c
    micros = [(x.to(c.device), y.to(c.device)) for x, y in schedule.batch(schedule.start).micros]
    optimizer_step = optimizer_copy(held_parameters(run.model, run.optimizer), args.lr).step
    walls, calls = sample_steps(run, micros, optimizer_step)
    block = statistics.median(in_flight_ms([k for k in step if k.kind == "tp_all_reduce"]) for step in calls)
    across = statistics.median(in_flight_ms([k for k in step if k.kind != "tp_all_reduce"]) for step in calls)
    mine = [trimmed_mean(walls), statistics.median(timed(optimizer_step) for _ in range(PING_REPS)), block, across,
            len([k for k in calls[0] if k.kind == "tp_all_reduce"]), deciles(walls)]
    everyone = all_gather(mine)
    sampled, optimizer_ms = max(w for w, *_ in everyone), max(o for _, o, *_ in everyone)
    band = max(everyone, key=lambda m: m[0])[-1]  # the slowest rank's sampled steps, p10 to p90
    _, _, block_ms, across_ms, made, _ = everyone[c.rank]
    comm = block_ms + across_ms
    # the sample holds the optimizer's step; it is shown apart, timed alone
    prediction = stepmodel.Prediction(step_ms=sampled, compute_ms=sampled - comm - optimizer_ms, waiting_ms=0.0,
                                      optimizer_ms=optimizer_ms, comm_ms=comm, exposed_comm_ms=comm,
                                      terms={"tp_all_reduce_ms": block_ms, "across_nodes_ms": across_ms})
    return prediction, {"sampled_ms": round(sampled, 3), "sampled_steps_ms": [round(w, 3) for w in walls],
                        "band_ms": [round(edge, 3) for edge in band],
                        "tp_all_reduce_ms": round(block_ms, 3), "across_nodes_ms": round(across_ms, 3), "tp_all_reduces": made,
                        "tp_all_reduces_priced": parallelcost.tp_all_reduces(args.n_layer, len(micros)),
                        "tp_size": tp_size(), "accum": len(micros),
                        "calibration_steps": CALIBRATION_STEPS, "tensor_parallel": True}
