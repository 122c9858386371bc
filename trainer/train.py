"""The training script. Reads top to bottom: flags, setup, loop, summary."""

import argparse
import ctypes
import hashlib
import json
import os
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from trainer import checkpoint, gpt

from trainer.batching import BatchError, global_batch_indices, parse_rank_micro, plan_micro_batches, rank_share
from trainer.data import make_dataset
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
from trainer.instrument import CommTimer, StepTiming, straggler_line, summarize
from trainer.metrics import open_metrics
from trainer.model import MLP


def at_least(lo, kind=int):
    """argparse type: a `kind` number >= lo, with a message that says so."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {text}")
        return value

    return parse


def above_zero(text):
    """argparse type: a finite float > 0."""
    value = at_least(float("-inf"), float)(text)
    if not 0 < value < float("inf"):  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Train a small model (an MLP on synthetic data, or a character-level GPT); "
                    "DDP when launched by torchrun.",
    )
    add = p.add_argument
    add("--workload", choices=["toy", "gpt"], default="toy",
        help="toy: MLP on synthetic classes; gpt: character-level GPT on generated Python-like source "
             "(trainer/corpus.py), always in global-batch mode (default toy)")
    # data
    add("--samples", type=at_least(1), default=4096,
        help="dataset size in samples, shared out across ranks (default 4096)")
    add("--features", type=at_least(1), default=32, help="input features per sample (default 32)")
    add("--classes", type=at_least(2), default=4, help="number of classes (default 4)")
    add("--seed", type=int, default=0,
        help="seeds data, model init and shuffle; the same on every rank (default 0)")
    # model
    add("--hidden", type=at_least(1), default=64, help="MLP hidden width in units (default 64)")
    # gpt workload
    add("--n-layer", type=at_least(1), default=2, help="gpt: transformer blocks (default 2)")
    add("--n-embd", type=at_least(1), default=64, help="gpt: embedding width (default 64)")
    add("--n-head", type=at_least(1), default=4, help="gpt: attention heads; must divide --n-embd (default 4)")
    add("--block-size", type=at_least(2), default=64, help="gpt: sequence length in characters (default 64)")
    add("--corpus-chars", type=at_least(10_000), default=2_000_000,
        help="gpt: characters of the corpus to train on (default 2000000)")
    add("--data-dir", default=None,
        help="gpt: where rank 0 prepares the corpus; default $DDPLAB_DATA_DIR, else /shared/ddplab-data "
             "when /shared is writable (the lab's shared volume), else ~/.cache/ddplab")
    # optimization
    add("--epochs", type=at_least(1), default=3, help="passes over the dataset (default 3)")
    add("--batch-size", type=at_least(1), default=64,
        help="samples per step PER RANK; global batch = this x world size (default 64)")
    add("--lr", type=above_zero, default=3e-3, help="Adam learning rate (default 3e-3)")
    # global-batch mode (see trainer/batching.py): steps of G samples, the same G samples at every
    # step whatever the world size; replaces --epochs/--batch-size when --global-batch is given
    add("--global-batch", type=at_least(1), default=None,
        help="samples per optimizer step over all ranks; enables global-batch mode "
             "(default off; for gpt: --micro-batch x world size)")
    add("--micro-batch", type=at_least(1), default=8,
        help="samples per rank per micro-step in global-batch mode (default 8)")
    add("--steps", type=at_least(1), default=20, help="optimizer steps in global-batch mode (default 20)")
    add("--rank-micro-batch", default=None, metavar="RANK=M,...",
        help="per-rank micro-batch overrides, e.g. 0=10,1=6 to give a slow rank less work; "
             "gradients are weighted by sample count, so the step is still the global-batch mean")
    # DDP levers (no effect in a single process)
    add("--bucket-cap-mb", type=above_zero, default=25.0,
        help="DDP gradient bucket size in MiB: smaller buckets start communicating earlier (default 25)")
    add("--comm-hook", choices=["none", "fp16", "bf16", "powersgd"], default="none",
        help="DDP communication hook: compress gradients to fp16/bf16, or PowerSGD rank-1 (default none)")
    add("--static-graph", action="store_true", help="tell DDP the graph never changes between steps")
    # distributed
    add("--timeout-s", type=above_zero, default=float(os.environ.get("DDPLAB_PG_TIMEOUT_S") or 120),
        help="process-group timeout in seconds: rendezvous and every collective fail after this instead "
             "of hanging on a dead peer (default $DDPLAB_PG_TIMEOUT_S, which labctl run sets, else 120)")
    # checkpoints (global-batch mode)
    add("--ckpt-every", type=at_least(0), default=0,
        help="rank 0 checkpoints model and optimizer every N steps, atomically; a restarted run resumes "
             "from the newest one (default 0: off)")
    add("--ckpt-dir", default=None, help="where checkpoints go (default <run_dir>/checkpoints; shared by all nodes)")
    # One thread by default: these models are small enough that more threads only add overhead
    # (gpt here: 70K tokens/s with 1 thread, 21K with 2 on a 2-core machine), and intra-op threads
    # split floating-point sums differently, so a fixed count is what makes 1 process on the host
    # and N nodes in the lab end at the same loss.
    add("--threads", type=at_least(1), default=1,
        help="torch CPU threads per process (default 1, whatever OMP_NUM_THREADS says; more for bigger models)")
    # logging
    add("--run-dir", default=None,
        help="directory for metrics-rank<RANK>.jsonl; default $DDPLAB_RUN_DIR, "
             "else runs/<TORCHELASTIC_RUN_ID or 'local'> under the cwd")
    add("--log-every", type=at_least(0), default=0,
        help="also write a metrics record every N optimizer steps; 0 = per epoch only (default 0)")
    add("--no-metrics", action="store_true",
        help="write no metrics files (e.g. on a read-only filesystem)")
    add("--profile", action="store_true",
        help="write a torch.profiler Chrome trace of steps 3-5 per rank: <run_dir>/trace-rank<RANK>.json")
    return p.parse_args(argv)


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


def wrap_ddp(model, c, bucket_cap_mb=25.0, comm_hook="none", static_graph=False, timer=None):
    """DDP with the levers clusters tune: bucket size, a gradient-compression hook, static graph.

    With a CommTimer, the hook (plain all-reduce for "none") is wrapped to time the communication.
    """
    if comm_hook == "bf16" and c.backend != "nccl":
        # torch's bf16_compress_hook is built on NCCL's bf16 all-reduce; gloo has none.
        raise SystemExit("error: --comm-hook bf16 needs CUDA and NCCL; on CPU (gloo) use fp16 or powersgd")
    ddp = DDP(model, device_ids=[c.local_rank] if c.device.type == "cuda" else None,
              bucket_cap_mb=bucket_cap_mb, static_graph=static_graph)
    register_comm_hook(ddp, comm_hook, timer)
    return ddp


def register_comm_hook(ddp, name, timer=None):
    """PyTorch's DDP communication hooks: https://pytorch.org/docs/stable/ddp_comm_hooks.html"""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    state, hook = None, None  # state None = the default process group
    if name == "none":
        hook = default_hooks.allreduce_hook if timer else None  # DDP's own all-reduce when untimed
    elif name == "fp16":
        hook = default_hooks.fp16_compress_hook
    elif name == "bf16":
        hook = default_hooks.bf16_compress_hook
    elif name == "powersgd":
        # Rank-1 approximation with error feedback; plain all-reduce for the first steps, as the
        # PowerSGD paper warms up.
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
        hook = powerSGD_hook.powerSGD_hook
    else:
        raise ValueError(f"unknown comm hook {name!r}")
    if hook is not None:
        ddp.register_comm_hook(state, timer.wrap(hook) if timer else hook)


def param_checksum(model):
    """First 16 hex chars of sha256 over every parameter's name, shape and bytes.

    Identical iff the replicas hold bit-identical weights, which is what DDP
    promises after every step.
    """
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        t = p.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        # The tensor's raw bytes, read via ctypes so NumPy isn't required.
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()[:16]




class Workload:
    """What the loops need to know of a workload: samples by index, the model, the loss."""

    def __init__(self, name, model, batch, n_samples, tokens_per_sample, extra):
        self.name = name
        self.model = model  # the raw module, before DDP
        self.batch = batch  # indices -> (x, y) on the CPU
        self.n_samples = n_samples
        self.tokens_per_sample = tokens_per_sample
        self.extra = extra  # for the SUMMARY

    def loss_sum(self, logits, y):
        """Summed (not averaged) over samples and tokens: the loops scale it to a mean."""
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")


def toy_workload(args, c):
    dataset = make_dataset(args.samples, args.features, args.classes, args.seed)
    x_all, y_all = dataset.tensors
    model = MLP(args.features, args.hidden, args.classes).to(c.device)
    return Workload("toy", model, lambda idx: (x_all[idx], y_all[idx]), len(y_all), 1, {}), dataset


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


def barrier():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


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

    c = compute_init(args.timeout_s)
    tag = rank_tag(c.rank, c.world_size)
    print0(f"{tag} backend {c.backend} world_size {c.world_size} device {c.device} "
           f"run_dir {run_dir}")

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
