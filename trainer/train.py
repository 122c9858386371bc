"""The training script. Reads top to bottom: flags, setup, loop, summary.

The flags are in flags.py, the toy and gpt workloads in workloads.py, DDP wrapping and the
replica checksum in ddp.py; what is left here is the run itself.
"""

import json
import os
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.utils.data import DataLoader, DistributedSampler

from trainer import checkpoint
from trainer.batching import BatchError, global_batch_indices, parse_rank_micro, plan_micro_batches, rank_share
from trainer.ddp import param_checksum, wrap_ddp
from trainer.dist import (
    all_gather,
    all_reduce_sum,
    compute_cleanup,
    compute_init,
    get_dist_info,
    print0,
    println,
    rank_tag,
)
from trainer.flags import parse_args  # the tests import parse_args and wrap_ddp from here too
from trainer.instrument import CommTimer, StepTiming, straggler_line, summarize
from trainer.metrics import open_metrics
from trainer.workloads import gpt_workload, toy_workload


def resolve_run_dir(run_dir_arg):
    if run_dir_arg:
        return Path(run_dir_arg)
    if os.environ.get("DDPLAB_RUN_DIR"):
        return Path(os.environ["DDPLAB_RUN_DIR"])
    # torchrun gives all ranks of one job the same run id, so they share a dir.
    return Path("runs") / os.environ.get("TORCHELASTIC_RUN_ID", "local")


def build_loader(dataset, batch_size, seed, rank, world_size, device):
    # The sampler hands each rank a disjoint shard. drop_last=True evens the
    # shards out, so every rank takes the same number of steps; a rank with an
    # extra step would wait forever in DDP's gradient all-reduce.
    # Passing num_replicas/rank explicitly makes it work without a process group.
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    pin_memory = device.type == "cuda"  # faster host-to-GPU copies
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, pin_memory=pin_memory)
    return loader, sampler



def timed_step(model, optimizer, workload, micros, scale, timer, world_size, device, global_tokens):
    """One optimizer step over `micros` (this rank's micro-batches), gradients synchronised on the last.

    Returns (summed loss on this rank as a tensor, StepTiming)."""
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    timer.reset()
    loss_sum = torch.zeros((), device=device)
    for k, (x, y) in enumerate(micros):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        # no_sync on all but the last micro-step: one gradient all-reduce per step.
        sync = k == len(micros) - 1 or world_size == 1
        with (nullcontext() if sync else model.no_sync()):
            micro_loss = workload.loss_sum(model(x), y)
            (micro_loss * scale).backward()  # under DDP the last one also all-reduces the gradients
        loss_sum += micro_loss.detach()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    backward_end = time.perf_counter()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    step_end = time.perf_counter()
    wait_ms = timer.wait_ms(backward_end)
    timing = StepTiming(step=0, compute_ms=(backward_end - t0) * 1e3 - wait_ms, comm_ms=timer.comm_ms(),
                        comm_wait_ms=wait_ms, step_ms=(step_end - t0) * 1e3, tokens=global_tokens)
    return loss_sum, timing


def wall_since(last_end):
    """(now, milliseconds since last_end)."""
    now = time.perf_counter()
    return now, (now - last_end) * 1e3


def profiler_for(args, c, run_dir):
    """torch.profiler over steps 3-5 (after warm-up), one Chrome trace per rank, or a no-op."""
    if not args.profile:
        return nullcontext(None)
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if c.device.type == "cuda" else [])
    path = Path(run_dir) / f"trace-rank{c.rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                   on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)))


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    # Open this rank's metrics file before joining the process group, so a bad
    # run dir fails fast here rather than leaving peers waiting at rendezvous.
    _, rank, _, _ = get_dist_info()
    run_dir = resolve_run_dir(args.run_dir)
    metrics = open_metrics(run_dir, rank, enabled=not args.no_metrics)

    c = compute_init(args.timeout_s, args.backend)
    tag = rank_tag(c.rank, c.world_size)
    print0(f"{tag} backend {c.backend} world_size {c.world_size} device {c.device} "
           f"run_dir {run_dir} ({c.reason})")

    # Same seed on every rank: identical data and identical initial weights
    # (DDP broadcasts rank 0's weights anyway, this keeps single-process runs
    # reproducible too).
    torch.manual_seed(args.seed)
    if args.workload == "gpt":
        workload, dataset = gpt_workload(args, c, tag), None
    else:
        workload, dataset = toy_workload(args, c)

    timer = CommTimer()
    model = workload.model
    if c.world_size > 1:
        model = wrap_ddp(workload.model, c, args.bucket_cap_mb, args.comm_hook, args.static_graph, timer)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    with metrics, profiler_for(args, c, run_dir) as prof:
        if args.global_batch or args.workload == "gpt":
            result = run_global_batches(args, c, model, optimizer, workload, metrics, tag, timer, prof, run_dir)
        else:
            result = run_epochs(args, c, model, optimizer, workload, dataset, metrics, tag, timer, prof)
    return finish(args, c, workload, run_dir, *result)


def run_epochs(args, c, model, optimizer, workload, dataset, metrics, tag, timer, prof):
    """Epoch mode (toy): each rank walks its DistributedSampler shard, --batch-size per step."""
    if args.ckpt_every:
        raise SystemExit("error: --ckpt-every needs global-batch mode (--global-batch G, or --workload gpt): "
                         "there a resumed run sees exactly the samples the lost one would have")
    loader, sampler = build_loader(dataset, args.batch_size, args.seed, c.rank, c.world_size, c.device)
    if len(loader) == 0:
        raise SystemExit(f"error: --samples {args.samples} over {c.world_size} ranks "
                         "leaves none per rank; raise --samples")
    step = samples_seen = 0  # per rank, over the whole run
    timings = []
    t0 = last_end = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        # set_epoch reseeds the shuffle: a new order each epoch, same on all ranks.
        sampler.set_epoch(epoch)
        model.train()
        # Sum on the device: an .item() per step would stall a GPU pipeline.
        loss_sum = torch.zeros((), device=c.device)
        epoch_samples = 0
        for x, y in loader:
            # drop_last gives every rank the same batch size: DDP's average is the global mean.
            batch_loss, timing = timed_step(model, optimizer, workload, [(x, y)], 1 / len(y), timer,
                                            c.world_size, c.device, len(y) * c.world_size)
            step += 1
            timing.step = step
            timings.append(timing)
            epoch_samples += len(y)
            samples_seen += len(y)
            loss_sum += batch_loss
            if prof:
                prof.step()
            last_end, timing.wall_ms = wall_since(last_end)
            if args.log_every and step % args.log_every == 0:
                metrics.log(kind="step", rank=c.rank, epoch=epoch, step=step,
                            loss=batch_loss.item() / len(y), samples=samples_seen,
                            elapsed_s=time.perf_counter() - t0, **timing.record())
        epoch_loss = loss_sum.item() / epoch_samples
        metrics.log(kind="epoch", rank=c.rank, epoch=epoch, step=step, loss=epoch_loss,
                    samples=samples_seen, elapsed_s=time.perf_counter() - t0)
        println(f"{tag} epoch {epoch}/{args.epochs} loss {epoch_loss:.4f}")
    elapsed_s = time.perf_counter() - t0
    final_loss = all_reduce_sum(epoch_loss, c.device) / c.world_size  # a collective: every rank
    return step, final_loss, samples_seen, elapsed_s, timings, {"epochs": args.epochs}


def run_global_batches(args, c, model, optimizer, workload, metrics, tag, timer, prof, run_dir):
    """Global-batch mode: K micro-steps per step, gradients synchronised only on the last."""
    global_batch = args.global_batch or args.micro_batch * c.world_size
    try:
        accum, sizes = plan_micro_batches(global_batch, args.micro_batch, c.world_size,
                                          parse_rank_micro(args.rank_micro_batch))
        global_batch_indices(workload.n_samples, global_batch, args.seed, 1)  # too big a batch fails here
    except BatchError as exc:
        raise SystemExit(f"error: {exc}") from None
    start = resume(args, c, model, optimizer, workload, global_batch, run_dir, tag) if args.ckpt_every else 1
    tokens_per_step = global_batch * workload.tokens_per_sample
    # Scale so that DDP's average over ranks is the mean over the step's tokens (see batching.py).
    scale = c.world_size / tokens_per_step
    print0(f"{tag} global batch {global_batch} = {accum} accumulation steps x micro-batches {sizes}"
           + (f" x {workload.tokens_per_sample} tokens" if workload.tokens_per_sample > 1 else ""))
    samples_seen = 0
    timings = []
    t0 = last_end = time.perf_counter()
    step1_consistent = None  # unknown when resuming past step 1
    for step in range(start, args.steps + 1):
        indices = global_batch_indices(workload.n_samples, global_batch, args.seed, step)
        micros = [workload.batch(m) for m in rank_share(indices, sizes, accum, c.rank)]
        loss_sum, timing = timed_step(model, optimizer, workload, micros, scale, timer, c.world_size, c.device,
                                      tokens_per_step)
        timing.step = step
        timings.append(timing)
        rank_tokens = accum * sizes[c.rank] * workload.tokens_per_sample
        samples_seen += accum * sizes[c.rank]
        if prof:
            prof.step()
        last_end, timing.wall_ms = wall_since(last_end)
        record = {"kind": "step", "rank": c.rank, "step": step, "rank_loss": loss_sum.item() / rank_tokens,
                  "samples": samples_seen, "elapsed_s": time.perf_counter() - t0, **timing.record()}
        if step == args.steps or (args.log_every and step % args.log_every == 0):
            # The global loss is a collective; only on the steps that print, to keep steps comm-clean.
            step_loss = all_reduce_sum(loss_sum.item(), c.device) / tokens_per_step
            record["loss"] = step_loss
            println(f"{tag} step {step}/{args.steps} loss {step_loss:.6f} "
                    f"({timing.step_ms:.0f} ms: compute {timing.compute_ms:.0f}, comm wait {timing.comm_wait_ms:.0f})")
        metrics.log(**record)
        if args.ckpt_every and step % args.ckpt_every == 0 and step < args.steps and c.rank == 0:
            checkpoint.save(ckpt_dir(args, run_dir), step, {
                "model": workload.model.state_dict(), "optimizer": optimizer.state_dict(),
                "workload": workload.name, "global_batch": global_batch, "seed": args.seed})
        if step == 1:
            # The check people are told to do by hand: after the first step every replica is identical.
            step1_consistent = len(set(all_gather(param_checksum(workload.model)))) == 1
            last_end = time.perf_counter()  # the check is not part of step 2's wall time
    extra = {"global_batch": global_batch, "accum_steps": accum, "micro_batches": sizes,
             "replicas_consistent_after_step1": step1_consistent, "resumed_from_step": start - 1,
             "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
    return args.steps, step_loss, samples_seen, time.perf_counter() - t0, timings, extra


def ckpt_dir(args, run_dir):
    return Path(args.ckpt_dir) if args.ckpt_dir else Path(run_dir) / "checkpoints"


def resume(args, c, model, optimizer, workload, global_batch, run_dir, tag):
    """The step to start from: 1, or one past the newest checkpoint rank 0 can load."""
    chosen = None
    if c.rank == 0:
        state, path, problems = checkpoint.load_latest(ckpt_dir(args, run_dir))
        for problem in problems:
            println(f"{tag} skipping a damaged checkpoint: {problem}")
        chosen = str(path) if path else None
    chosen = all_gather(chosen)[0]  # every rank resumes from the checkpoint rank 0 chose
    if chosen is None:
        return 1
    state = checkpoint.load(chosen)
    if (state.get("workload"), state.get("global_batch"), state.get("seed")) != (workload.name, global_batch, args.seed):
        raise SystemExit(f"error: checkpoint {chosen} is of workload {state.get('workload')}, global batch "
                         f"{state.get('global_batch')}, seed {state.get('seed')}; this run is {workload.name}, "
                         f"{global_batch}, {args.seed}. Use another --ckpt-dir or remove it")
    if state["step"] >= args.steps:
        raise SystemExit(f"error: checkpoint {chosen} is at step {state['step']}, not before --steps {args.steps}: "
                         "nothing left to train")
    workload.model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    print0(f"{tag} resuming from step {state['step']} ({chosen}), restart "
           f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}, world size {c.world_size}")
    return state["step"] + 1


def finish(args, c, workload, run_dir, steps, final_loss, samples_seen, elapsed_s, timings, extra):
    """The SUMMARY line (rank 0) and a clean exit. Collectives: every rank must get here."""
    import socket

    total_samples = int(all_reduce_sum(samples_seen, c.device))
    checksum = param_checksum(workload.model)
    checksums = all_gather(checksum)
    gathered = all_gather((socket.gethostname(), timings))
    perf = summarize([t for _, t in gathered], [h for h, _ in gathered])
    summary = {
        "workload": workload.name,
        "steps": steps,
        "final_loss": final_loss,  # unrounded: runs are compared to the last digits float32 has
        "world_size": c.world_size,
        "param_checksum": checksum,
        "replicas_consistent": len(set(checksums)) == 1,
        "backend": c.backend,
        "device": c.device.type,
        "threads": torch.get_num_threads(),
        **extra,
        **workload.extra,
        "elapsed_s": round(elapsed_s, 3),
        "samples_per_s": round(total_samples / elapsed_s, 1),
        "samples": total_samples,
        **perf,
        "run_dir": str(run_dir),
    }
    line = straggler_line(summary)
    if line:
        print0(f"{rank_tag(c.rank, c.world_size)} {line}")
    print0("SUMMARY " + json.dumps(summary))
    compute_cleanup()
    return summary
