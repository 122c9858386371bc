"""The training script, top to bottom: flags, setup, the loop, the summary.

    main(): parse_args -> setup() -> train(), the loop -> finish(), the SUMMARY line

One loop trains both modes. A step is one optimizer step over this rank's micro-batches; the modes
differ only in which samples a step sees and what is logged between steps, and trainer/schedule.py
holds that part: global-batch mode picks step s's samples from (seed, G, s); epoch mode takes one
DistributedSampler batch a step and prints each rank's mean loss at every epoch's end.

Elsewhere: the flags in flags.py, the workloads in workloads.py, DDP or sharding in strategy.py
(DDP's levers and the replica checksum in ddp.py), the process group in dist.py, step timing in
instrument.py, the metrics records in metrics.py, checkpoints in checkpoint.py, the Run and Result
records in state.py.
"""

import copy
import json
import os
import socket
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from trainer import checkpoint, collectives, pipeline, pipepredict, strategy, tensorparallel, tppredict, wire
from trainer.calibrate import predict_run
from trainer.ddp import param_checksum
from trainer.dist import (all_gather, all_reduce_sum, compute_cleanup, compute_init, get_dist_info, print0,
                          rank_tag)
from trainer.flags import parse_args  # the tests import parse_args from here too
from trainer.instrument import (CommTimer, StepTiming, checked_line, prediction_line, profiler_for,
                                steady, step_model_fields, straggler_line, summarize, wall, wall_now)
from trainer.metrics import open_metrics, write_clock
from trainer.schedule import schedule_for
from trainer.state import Result, Run
from trainer.workloads import gpt_workload, toy_workload

CLOCK_BARRIERS = 32  # barriers stamped for each "clock" record (see log_clock)
# A finished run's DDP model, kept until the process leaves (by os._exit: dist.exit_done). Its
# Reducer holds the gloo process group; freed by Python as main() returns, the group's destructor
# joins gloo's worker thread while holding the GIL, and that thread, freeing the last barrier's work,
# waits for the GIL to free a tensor: a deadlock, in 1 bench straggler run of 4 here (gdb: the main
# thread in ~ProcessGroupGloo -> std::thread::join, pt_gloo_runloop in gil_scoped_acquire under
# ~AsyncBarrierWork). Kept, none hung in 10.
KEPT_UNTIL_EXIT = []


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    # I open this rank's metrics file before joining the process group, so that a bad run dir
    # fails fast here rather than leaving the peers waiting at rendezvous.
    _, rank, _, _ = get_dist_info()
    run_dir = resolve_run_dir(args.run_dir)
    with open_metrics(run_dir, rank, enabled=not args.no_metrics) as metrics:
        run, as_built = setup(args, run_dir, metrics)
        schedule = schedule_for(run)  # epochs or global batches; may resume from a checkpoint
        # The step model's prediction of every step, from a calibration before the first
        prediction, calibration = predict(run, schedule, as_built)
        del as_built  # fsdp's unsharded copy
        print0(f"{run.tag} {prediction_line(prediction, calibration)}")

        # Every rank leaves a barrier at almost the same moment, which makes it the mark that lines up
        # the ranks' clocks in the metrics; the end of the run has its twin, in compute_cleanup.
        log_clock(run, "start")
        metrics.log(kind="prediction", rank=run.c.rank, **prediction.record())  # labctl trace shows it per rank
        with run.prof:
            result = train(run, schedule)
        return finish(run, result, prediction, calibration)


def setup(args, run_dir, metrics):
    """Join the process group (if launched as one), then build the workload, model and optimizer:
    (the Run; the model as built, unwrapped and unsharded, which the step model calibrates on)."""
    c = compute_init(args.timeout_s, args.backend)
    tag = rank_tag(c.rank, c.world_size)
    print0(f"{tag} backend {c.backend} world_size {c.world_size} device {c.device} "
           f"run_dir {run_dir} ({c.reason})")

    # Same seed on every rank: identical data and identical initial weights (DDP broadcasts rank 0's
    # weights anyway; this keeps single-process runs reproducible too).
    torch.manual_seed(args.seed)
    workload = gpt_workload(args, c, tag) if args.workload == "gpt" else toy_workload(args, c)

    timer = CommTimer()
    log = collectives.CollectiveLog.install()  # every step's collectives, by kind (trainer/collectives.py)
    # fsdp and hsdp shard the module in place; DDP wraps it and leaves it as it is
    as_built = copy.deepcopy(workload.model) if args.strategy in strategy.SHARDED and c.world_size > 1 else workload.model
    pipe = pipeline.build(workload.model, args, c) if args.strategy == "pp" else None  # this rank's stage
    model = pipe.module if pipe else strategy.wrap_model(workload.model, c, args, timer)  # DDP, or sharded
    optimizer = strategy.build_optimizer(model, args, c.world_size)
    prof = profiler_for(args.profile, c.device.type, Path(run_dir) / f"trace-rank{c.rank}.json")
    return Run(args=args, c=c, tag=tag, run_dir=run_dir, workload=workload, model=model, optimizer=optimizer,
               timer=timer, collectives=log, metrics=metrics, prof=prof, pipeline=pipe), as_built


def predict(run, schedule, as_built):
    """The step model's prediction of every step, from a calibration before the first: (prediction,
    calibration). Sampled from the run's own steps for a pipeline (trainer/pipepredict.py) and for
    tensor parallelism (trainer/tppredict.py); modelled from its parts for the others (calibrate.py)."""
    if run.pipeline:
        return pipepredict.predict(run, schedule)
    if run.args.strategy in tensorparallel.TP_STRATEGIES and run.c.world_size > 1:
        return tppredict.predict(run, schedule)
    return predict_run(run, schedule, as_built)


def train(run, schedule):
    """The loop: every step from the schedule's first to its last, the same in both modes."""
    args, c = run.args, run.c
    timings, samples = [], 0  # this rank's, over the steps it runs
    run.model.train()  # no dropout or batch norm in these models: it changes nothing, but says what we do
    t0 = last_end = time.perf_counter()
    sent_before = None
    for step in range(schedule.start, schedule.steps + 1):
        batch = schedule.batch(step)  # which samples this step trains on: the mode's to say
        loss_sum, timing = train_step(run, batch)
        timing.step = step
        timings.append(timing)
        samples += batch.samples
        run.prof.step()
        last_end, timing.wall_ms = wall_since(last_end)

        record = {"kind": "step", "rank": c.rank, "step": step, "samples": samples,
                  "elapsed_s": time.perf_counter() - t0, **timing.record()}
        schedule.log(step, batch, loss_sum, timing, record)  # the mode's loss fields, printed lines, epoch ends
        if args.ckpt_every and step % args.ckpt_every == 0 and step < schedule.steps:
            # Global-batch mode only (epoch mode refuses --ckpt-every): there a resumed run sees
            # exactly the samples the lost one would have.
            checkpoint.save_step(run, step, schedule.global_batch)
        if step == 1:
            schedule.after_first_step()  # global-batch mode: are the replicas identical after one step?
            last_end = time.perf_counter()  # that check is no part of step 2's wall time
        if step == schedule.start:
            sent_before = wire.tx_bytes()  # the link counters over the steady steps (trainer/wire.py)
    elapsed_s = time.perf_counter() - t0
    sent_after = wire.tx_bytes()
    return Result(steps=schedule.steps, final_loss=schedule.final_loss(), samples=samples, elapsed_s=elapsed_s,
                  timings=timings, extra=schedule.summary(),
                  wire_tx_bytes=sent_after - sent_before if None not in (sent_before, sent_after) else None)


def train_step(run, batch):
    """One optimizer step over this rank's micro-batches, gradients synchronised on the last.

    Returns (the summed loss on this rank, as a tensor; the step's StepTiming)."""
    if run.pipeline:
        return pipeline.train_step(run, batch)  # a stage's forwards and backwards, in the schedule's order
    model, c, timer = run.model, run.c, run.timer
    t0 = time.perf_counter()
    run.optimizer.zero_grad(set_to_none=True)
    timer.reset()
    run.collectives.start_step()
    loss_sum = torch.zeros((), device=c.device)
    for k, (x, y) in enumerate(batch.micros):
        x, y = x.to(c.device, non_blocking=True), y.to(c.device, non_blocking=True)
        # no_sync on all but the last micro-step: one gradient all-reduce per step.
        with strategy.micro_step(model, last=k == len(batch.micros) - 1 or c.world_size == 1):
            micro_loss = run.workload.loss_sum(model(x), y)
            (micro_loss * batch.scale).backward()  # under DDP the last one also all-reduces the gradients
        loss_sum += micro_loss.detach()
    sync_device(c.device)
    backward_end = time.perf_counter()
    run.optimizer.step()
    sync_device(c.device)
    step_end = time.perf_counter()
    calls = run.collectives.end_step()
    first, last, wait_ms = comm_times(timer, calls, backward_end)
    timing = StepTiming(step=0, compute_ms=(backward_end - t0) * 1e3 - wait_ms,
                        comm_ms=(last - first) * 1e3 if first is not None and last is not None else 0.0, comm_wait_ms=wait_ms,
                        step_ms=(step_end - t0) * 1e3, tokens=batch.tokens, t_start=wall(t0), t_comm_start=wall(first),
                        t_comm_end=wall(last), t_backward_end=wall(backward_end), t_end=wall(step_end),
                        collectives=calls)
    return loss_sum, timing


def comm_times(timer, calls, backward_end):
    """(first collective launched, last finished, ms this rank sat waiting) of a step's gradient
    communication: DDP's comm hook's when it ran, else (fsdp) the collectives' (trainer/collectives.py)."""
    if timer.first_launch is not None:
        return timer.first_launch, timer.last_done, timer.wait_ms(backward_end)
    return collectives.span(calls, backward_end)


def finish(run, result, prediction, calibration):
    """The SUMMARY line (rank 0) and a clean exit. Collectives: every rank must get here.
    `prediction` and `calibration`: the step model's, from before the first step."""
    c = run.c
    total_samples = int(all_reduce_sum(result.samples, c.device))
    checksum = param_checksum(run.model if run.pipeline else run.workload.model)  # pp: this rank's stage
    checksums = all_gather(checksum)
    # Each rank's collectives go summed (a few numbers), not call by call: the step records have those.
    mine = collectives.totals([t.collectives for t in steady(result.timings)])
    timings = [replace(t, collectives=[], pipeline=[]) for t in result.timings]
    gathered = all_gather((socket.gethostname(), timings, result.wire_tx_bytes, mine))
    perf = summarize([t for _, t, _, _ in gathered], [h for h, _, _, _ in gathered])
    perf["collectives_per_step"] = collectives.summarize_calls([calls for _, _, _, calls in gathered])
    perf["wire_tx_bytes_per_step"] = wire.per_node_per_step([(h, sent) for h, _, sent, _ in gathered],
                                                            len(result.timings) - 1)
    compiled = compile_report(run, result.timings)
    held = all_gather(strategy.state_bytes(run.model, run.optimizer))  # each rank's, after the last step
    fullest = max(held, key=lambda h: sum(h.values()))
    staged = pipeline.summary(run.pipeline, held) if run.pipeline else {}
    summary = {
        "workload": run.workload.name,
        "steps": result.steps,
        "final_loss": result.final_loss,  # unrounded: runs are compared to the last digits float32 has
        "world_size": c.world_size,
        "strategy": run.args.strategy,
        "param_checksum": checksum,  # of the whole parameters: a sharded run's are gathered first (pp: rank 0's stage)
        # pp: its stages differ by design; the one parameter it replicates, the tied embedding, must not
        "replicas_consistent": staged["tied_embedding_consistent"] if staged else len(set(checksums)) == 1,
        # Parameters, gradients and optimizer state on the rank that holds the most, and what they are.
        "state_bytes_per_rank": sum(fullest.values()),
        "state_bytes": fullest,
        "backend": c.backend,
        "device": c.device.type,
        "threads": torch.get_num_threads(),
        # Which kernels did the arithmetic: the same sums in other kernels (AVX512 or AVX2, or torch
        # told by labctl's DDPLAB_CPU_KERNELS=avx2 to use AVX2) end on other last digits, so two
        # final losses compare to the last digit only when these agree.
        "cpu_kernels": os.environ.get("DDPLAB_CPU_KERNELS", "native"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        **compiled,
        **staged,
        **tensorparallel.summary(run.args, c),
        **result.extra,
        **run.workload.extra,
        "elapsed_s": round(result.elapsed_s, 3),
        "samples_per_s": round(total_samples / result.elapsed_s, 1),
        "samples": total_samples,
        **perf,
        **step_model_fields(prediction, calibration, perf.get("step_ms"), steady(result.timings)),
        "run_dir": str(run.run_dir),
    }
    for line in (straggler_line(summary), checked_line(summary)):
        if line:
            print0(f"{run.tag} {line}")
    print0("SUMMARY " + json.dumps(summary))
    compute_cleanup(after_barrier=lambda: log_clock(run, "end", left_at=wall_now()))  # after the last collective
    KEPT_UNTIL_EXIT.append(run.model)
    return summary


# --- small helpers ----------------------------------------------------------------------------------

def compile_report(run, timings):
    """--compile: each rank says how long its compilation took (the first step's time less a steady
    step's: inductor compiles in the first call), and SUMMARY gets compile_s (the slowest rank's)
    and compile_s_per_rank. Without --compile both are None. Collective: every rank calls it."""
    if not run.args.compile:
        return {"compile_s": None, "compile_s_per_rank": None}
    mine = None
    if len(timings) > 1:
        mine = max(0.0, (timings[0].step_ms - statistics.median(t.step_ms for t in steady(timings))) / 1e3)
        print(f"{run.tag} compiled in {mine:.2f} s (its first step less a steady one)", flush=True)
    every = all_gather(mine)
    known = [s for s in every if s is not None]
    return {"compile_s": round(max(known), 3) if known else None,
            "compile_s_per_rank": [None if s is None else round(s, 3) for s in every]}


def resolve_run_dir(run_dir_arg):
    if run_dir_arg:
        return Path(run_dir_arg)
    if os.environ.get("DDPLAB_RUN_DIR"):
        return Path(os.environ["DDPLAB_RUN_DIR"])
    # torchrun gives all ranks of one job the same run id, so they share a dir.
    return Path("runs") / os.environ.get("TORCHELASTIC_RUN_ID", "local")


def log_clock(run, event, left_at=None):
    """A "clock" record: this rank's times, on the clock of its step records, as it leaves
    CLOCK_BARRIERS barriers back to back (`left_at`: it has just left one, which counts as the first).

    Several, not one: a rank that is descheduled just as it leaves a barrier stamps it late. On a node
    limited to a quarter of a CPU that happened to the start barrier in one run of three here, 68 ms
    late, when the ranks' clocks (one kernel's) agreed to the microsecond. Whoever lines up the ranks
    (labctl trace) keeps the barrier that explains the others with the least lateness. Why 32: on a
    2-core machine under a load of 20, 5 once left no barrier undisturbed (3 ms off), and 16 once
    left 1.004 ms (a fresh `make test`, node2 at a quarter of a CPU); in a simulation of 3 ranks whose
    stamps are each late with probability 0.5 (exponential, mean 2 ms), the residual was over 1 ms in
    0.05% of runs with 32, 0.3% with 24, 2% with 16, 10% with 10, 40% with 5. A barrier costs about
    half a millisecond."""
    write_clock(run.metrics, run.c.rank, event, CLOCK_BARRIERS, left_at)


def sync_device(device):
    """Wait for the GPU's queued work, so the clock measures it; the CPU has none queued."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_since(last_end):
    """(now, milliseconds since last_end)."""
    now = time.perf_counter()
    return now, (now - last_end) * 1e3
