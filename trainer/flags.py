"""The command-line flags of `python -m trainer`, and the argparse types that check them.

Bad values fail here, before any process group exists, with a message that names the flag,
rather than as a stack trace on every rank once training has started.
"""

import argparse
import os

from trainer.backend import backend_flag


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
    from trainer.pipeline import SCHEDULES
    from trainer.strategy import STRATEGIES, refusal  # with torch: the parser is made where the run is

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
    add("--strategy", choices=STRATEGIES, default="ddp",
        help="how the model's state is spread over the ranks (trainer/strategy.py): ddp replicates it; zero "
             "shards the optimizer state (ZeroRedundancyOptimizer); fsdp shards parameters, gradients and "
             "optimizer state (FSDP2 fully_shard per block); hsdp shards within a node's processes and replicates "
             "across nodes (--nproc-per-node 2 or more); pp cuts gpt's blocks into a pipeline of stages, one per "
             "rank (--schedule, --micro-batches, --stage-layers); tp splits each of gpt's blocks over a node's "
             "processes (--nproc-per-node 2 or more) and replicates them across nodes, fsdp+tp shards them across "
             "nodes. Same data, same loss (default ddp)")
    # pipeline parallelism (trainer/pipeline.py)
    add("--schedule", choices=SCHEDULES, default="1f1b",
        help="--strategy pp: the pipeline's order: gpipe runs every micro-batch's forward, then every backward; "
             "1f1b alternates them once the pipe is full, holding fewer activations (default 1f1b)")
    add("--micro-batches", type=at_least(1), default=None,
        help="--strategy pp: micro-batches a step's global batch is cut into; the bubble is (p-1)/(M+p-1) of a "
             "step for p stages (default 2 per stage)")
    add("--stage-layers", default=None, metavar="N,N,...|auto",
        help="--strategy pp: transformer blocks per stage, one count per rank, summing to --n-layer; auto sizes "
             "them to what each rank computes, measured before the first step (default: as even as can be)")
    add("--compile", action="store_true",
        help="torch.compile the model before DDP wraps it, as nanoGPT does (inductor: the first step compiles, "
             "and SUMMARY's compile_s says for how long); with --strategy ddp or zero (default off)")
    # DDP levers (no effect in a single process)
    add("--bucket-cap-mb", type=above_zero, default=25.0,
        help="DDP gradient bucket size in MiB: smaller buckets start communicating earlier (default 25)")
    add("--comm-hook", choices=["none", "fp16", "bf16", "powersgd"], default="none",
        help="DDP communication hook: compress gradients to fp16/bf16, or PowerSGD rank-1 (default none)")
    add("--static-graph", action="store_true", help="tell DDP the graph never changes between steps")
    # distributed
    add("--backend", type=backend_flag, default=None,
        help="collective backend: nccl (CUDA tensors, one GPU per rank), gloo (CPU tensors, even on a GPU machine) "
             "or auto (nccl where CUDA is available, else gloo); default $DDPLAB_BACKEND, which labctl writes "
             "for labs with GPU nodes so that every rank agrees, else auto")
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
        help="epoch mode: also write a step record to the metrics every N optimizer steps (0 = epoch records "
             "only); global-batch mode, where every step has a record: print the global loss every N steps "
             "as well as after the last (default 0)")
    add("--no-metrics", action="store_true",
        help="write no metrics files (e.g. on a read-only filesystem)")
    add("--profile", action="store_true",
        help="write a torch.profiler Chrome trace of steps 3-5 per rank: <run_dir>/trace-rank<RANK>.json")
    args = p.parse_args(argv)
    why = refusal(args)  # flags that do not go together fail here, before any process group exists
    if why:
        p.exit(2, f"{p.prog}: {why}\n")
    if args.strategy == "pp":
        from trainer.pipeline import resolve

        resolve(args, int(os.environ.get("WORLD_SIZE", 1)))
    return args
