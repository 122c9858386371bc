"""--strategy pp: the gpt workload cut into stages, one per rank, run by torch.distributed.pipelining.

Rank r holds a contiguous share of the transformer blocks (--stage-layers, or an even split, or
`auto`: in proportion to what each rank computes, measured before the first step); the first stage
also holds the embeddings, the last the final norm and the output head. A step takes the whole global
batch, cut into --micro-batches pieces: the first stage feeds them in, each stage sends its
activations to the next and their gradients back, in GPipe's order (every forward, then every
backward) or 1F1B's (one forward, one backward, once the pipe is full). The last stage computes each
micro-batch's mean loss; the schedule scales the gradients by 1/M (scale_grads), so every parameter's
gradient is the mean over the global batch, as DDP's is.

gpt ties its output head to its token embedding. Here the first stage holds the one and the last the
other, so after each backward the two halves of that gradient are summed between those two ranks
(Megatron-LM's embedding group): both copies take the same Adam step and stay identical, which the
SUMMARY checks (replicas_consistent: the one parameter a pipeline replicates).

Each stage's forward and backward of each micro-batch are timed (their wall times on the process's
clock, in the step's record as `pipeline`); the rest of the step is the stage waiting for its
neighbours: the pipeline's bubble and the transfers.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from trainer.parallelcost import bubble

SCHEDULES = ("gpipe", "1f1b")  # --schedule
AUTO = "auto"
AUTO_BUDGET_S = 0.4  # `--stage-layers auto` times a block for this long: several periods of a CPU quota (100 ms)


class StageError(ValueError):
    """Stages that cannot be cut as asked; the message names the values and what is allowed."""


def parse_stage_layers(text: str | None):
    """'3,3,2' -> [3, 3, 2]; 'auto' -> 'auto'; None -> None (an even split)."""
    if text is None or text == AUTO:
        return text
    try:
        layers = [int(part) for part in text.split(",")]
    except ValueError:
        raise StageError(f"--stage-layers {text!r} is not a comma-separated list of layer counts (e.g. 3,3,2) "
                         "or auto") from None
    return layers


def plan_stages(n_layer: int, stages: int, given: list[int] | None = None,
                speeds: list[float] | None = None) -> list[int]:
    """How many blocks each stage holds: `given` as it is (checked), else to suit `speeds` (each rank's
    blocks a second), else as evenly as possible, the earlier stages one more. Every stage holds at
    least one block. By speed: one block each, then each next block to the stage that would finish
    its share soonest with it (the earlier on a tie), which leaves the slowest stage, the pipeline's
    pace, as fast as whole blocks allow."""
    if stages > n_layer:
        raise StageError(f"--strategy pp with {stages} stages (one per rank) needs at least as many transformer "
                         f"blocks, and --n-layer is {n_layer}: raise --n-layer to {stages} or more, or run fewer ranks")
    if given is not None:
        if len(given) != stages or min(given) < 1 or sum(given) != n_layer:
            raise StageError(f"--stage-layers {','.join(map(str, given))}: needs {stages} counts (one per rank), each "
                             f"1 or more, summing to --n-layer {n_layer}")
        return list(given)
    if speeds is None:
        return [n_layer // stages + (1 if s < n_layer % stages else 0) for s in range(stages)]
    layers = [1] * stages
    for _ in range(n_layer - stages):
        soonest = min(range(stages), key=lambda s: ((layers[s] + 1) / speeds[s], s))
        layers[soonest] += 1
    return layers


def refusal(args, world: int) -> str | None:
    """Why --strategy pp cannot run with these flags on `world` ranks, or None: before any process group."""
    if args.workload != "gpt":
        return "error: --strategy pp cuts gpt's transformer blocks into stages: add --workload gpt"
    if world < 2:
        return (f"error: --strategy pp needs 2 or more ranks, one stage each, and this run has {world}: "
                "run it under labctl run or torchrun")
    others = [(args.compile, "--compile"), (args.ckpt_every, "--ckpt-every"),
              (args.rank_micro_batch, "--rank-micro-batch"), (args.comm_hook != "none", "--comm-hook"),
              (args.static_graph, "--static-graph")]
    given = [flag for on, flag in others if on]
    if given:
        return (f"error: {given[0]} does not go with --strategy pp in this trainer (it compiles, checkpoints or "
                "balances DDP's replicas, and a pipeline has none): leave it out, or use --strategy ddp")
    micro = micro_batches(args, world)
    if args.global_batch and args.global_batch % micro:
        return (f"error: --global-batch {args.global_batch} does not split into --micro-batches {micro} of equal "
                "size: give a multiple of it")
    if args.schedule == "1f1b" and micro < world:
        return (f"error: --schedule 1f1b needs at least one micro-batch per stage: --micro-batches {micro} with "
                f"{world} stages; give {world} or more, or use --schedule gpipe")
    try:
        stages = parse_stage_layers(args.stage_layers)
        plan_stages(args.n_layer, world, None if stages in (None, AUTO) else stages)
    except StageError as exc:
        return f"error: {exc}"
    return None


class GPTStage(nn.Module):
    """Blocks [first, first + count) of a gpt model, with its embeddings on the first stage and its
    final norm and head on the last. The modules are the model's own (shared, not copied)."""

    def __init__(self, model, first: int, count: int, is_first: bool, is_last: bool):
        super().__init__()
        self.tok = model.tok if is_first else None
        self.pos = model.pos if is_first else None
        self.blocks = nn.ModuleList(model.blocks[first:first + count])
        self.ln_f = model.ln_f if is_last else None
        self.head = model.head if is_last else None

    def forward(self, x):
        if self.tok is not None:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)) if self.head is not None else x


def mean_loss(logits, y):
    """A micro-batch's mean token loss: the schedule's loss_fn (it scales the gradients by 1/M itself)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


class Pipeline:
    """This rank's stage and the schedule that runs it, plus the tied embedding's group."""

    def __init__(self, model, layers: list[int], rank: int, args, device, speeds: list[float] | None = None):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.layers, self.rank, self.stages = layers, rank, len(layers)
        self.first_layer = sum(layers[:rank])
        self.is_first, self.is_last = rank == 0, rank == self.stages - 1
        self.module = GPTStage(model, self.first_layer, layers[rank], self.is_first, self.is_last)
        self.micro_batches, self.schedule_name = args.micro_batches, args.schedule
        self.speeds = speeds  # each rank's blocks a second, where --stage-layers auto measured them
        self.stage = PipelineStage(self.module, rank, self.stages, device)
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[args.schedule]
        self.schedule = kind(self.stage, n_microbatches=self.micro_batches, loss_fn=mean_loss)
        # every rank makes the group (new_group is collective); only the two ends use it
        self.tied_group = torch.distributed.new_group([0, self.stages - 1])
        self.events: list[list] = []  # this step's ["forward"|"backward", micro-batch, t0, t1]
        self._time("forward_one_chunk", "forward")
        self._time("backward_one_chunk", "backward")

    def _time(self, method: str, kind: str):
        """Time each call of the stage's own compute (its method, on this instance only)."""
        inner = getattr(self.stage, method)

        def timed(chunk, *args, **kwargs):
            t0 = time.perf_counter()
            out = inner(chunk, *args, **kwargs)
            self.events.append([kind, chunk, t0, time.perf_counter()])
            return out

        setattr(self.stage, method, timed)

    def tied(self):
        """The tied embedding on this rank (the token embedding's weight, or the head's), or None."""
        if self.is_first:
            return self.module.tok.weight
        return self.module.head.weight if self.is_last else None

    def step(self, x, y) -> list[torch.Tensor]:
        """One step's forwards and backwards: the last stage's micro-batch losses ([] elsewhere)."""
        self.events = []
        losses: list[torch.Tensor] = []
        if self.is_first:
            self.schedule.step(x)
        elif self.is_last:
            self.schedule.step(target=y, losses=losses)
        else:
            self.schedule.step()
        weight = self.tied()
        if weight is not None:  # the embedding's gradient is the sum of both uses
            torch.distributed.all_reduce(weight.grad, group=self.tied_group)
        return losses

    def describe(self) -> dict:
        """This stage, for the SUMMARY: its blocks, and what it holds beside them."""
        parts = [name for name, on in (("embeddings", self.is_first), ("head", self.is_last)) if on]
        last = self.first_layer + self.layers[self.rank] - 1
        return {"rank": self.rank, "blocks": [self.first_layer, last], "also": parts,
                "params": sum(p.numel() for p in self.module.parameters())}


def measure_speed(model, args, device) -> float:
    """Blocks a second this rank computes, forward and backward of one micro-batch's activations
    through one of gpt's blocks, for AUTO_BUDGET_S of wall time: a node held to a fraction of a CPU
    by its quota is seen at the rate it sustains. Every rank measures at once (the caller's barrier),
    sharing the cores as the steps will."""
    micro = args.global_batch // args.micro_batches
    block = model.blocks[0]
    x = torch.randn(micro, args.block_size, args.n_embd, device=device, requires_grad=True)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < AUTO_BUDGET_S:
        block(x).sum().backward()
        done += 1
    for p in block.parameters():
        p.grad = None
    return done / (time.perf_counter() - t0)


def stage_layers(model, args, world: int, device) -> tuple[list[int], list[float] | None]:
    """(each stage's blocks, each rank's measured speed or None): --stage-layers as given, an even
    split, or `auto` from every rank's measure_speed. Collective under `auto`."""
    from trainer.dist import all_gather, barrier

    given = parse_stage_layers(args.stage_layers)
    if given != AUTO:
        return plan_stages(args.n_layer, world, given), None
    barrier()
    speeds = all_gather(measure_speed(model, args, device))
    return plan_stages(args.n_layer, world, speeds=speeds), speeds


def micro_batches(args, world: int) -> int:
    """--micro-batches, or its default: two a stage."""
    return args.micro_batches or 2 * world


def resolve(args, world: int) -> None:
    """--micro-batches' default and --global-batch's (--micro-batch samples in each), in place."""
    args.micro_batches = micro_batches(args, world)
    args.global_batch = args.global_batch or args.micro_batch * args.micro_batches


def build(model, args, c):
    """This rank's Pipeline over the gpt `model` as built (every rank builds the whole model from one
    seed and keeps its stage), its stages sized by stage_layers. Collective."""
    layers, speeds = stage_layers(model, args, c.world_size, c.device)
    return Pipeline(model, layers, c.rank, args, c.device, speeds)


def train_step(run, batch):
    """One optimizer step through the pipeline (train.train_step's for pp): (the summed token loss on
    the last stage, zero elsewhere; the step's StepTiming). The step's time not spent in this stage's
    own forwards and backwards is its waiting: the bubble and the transfers."""
    from trainer.instrument import StepTiming, wall

    pipe, (x, y) = run.pipeline, batch.micros[0]
    t0 = time.perf_counter()
    run.optimizer.zero_grad(set_to_none=True)
    run.collectives.start_step()
    losses = pipe.step(x.to(run.c.device), y.to(run.c.device))
    backward_end = time.perf_counter()
    run.optimizer.step()
    step_end = time.perf_counter()
    calls = run.collectives.end_step()
    tokens_per_micro = y.numel() // pipe.micro_batches
    loss_sum = (torch.stack(losses).detach().sum() * tokens_per_micro if losses
                else torch.zeros((), device=run.c.device))
    compute_ms = sum(t1 - t0_ for _, _, t0_, t1 in pipe.events) * 1e3
    waiting_ms = max((backward_end - t0) * 1e3 - compute_ms, 0.0)
    timing = StepTiming(step=0, compute_ms=compute_ms, comm_ms=waiting_ms, comm_wait_ms=waiting_ms,
                        step_ms=(step_end - t0) * 1e3, tokens=batch.tokens, t_start=wall(t0),
                        t_backward_end=wall(backward_end), t_end=wall(step_end), collectives=calls,
                        pipeline=[[kind, micro, round(wall(a), 6), round(wall(b), 6)]
                                  for kind, micro, a, b in pipe.events])
    return loss_sum, timing


def summary(pipe, held: list[dict]) -> dict:
    """The SUMMARY's pipeline fields: every stage with its blocks and the state it holds (`held`, each
    rank's strategy.state_bytes), the schedule, and the bubble its shape leaves. Collective."""
    from trainer.ddp import param_checksum
    from trainer.dist import all_gather

    stages = all_gather(pipe.describe())
    tied = pipe.tied()
    ends = [h for h in all_gather(param_checksum(nn.ParameterList([tied])) if tied is not None else None) if h]
    return {"stages": [{**s, "state_bytes": sum(h.values())} for s, h in zip(stages, held)],
            "stage_layers": pipe.layers, "stage_speeds": [round(v, 1) for v in pipe.speeds] if pipe.speeds else None,
            "schedule": pipe.schedule_name, "pipeline_micro_batches": pipe.micro_batches,
            "bubble_fraction": round(bubble(pipe.stages, pipe.micro_batches), 4),
            "tied_embedding_consistent": len(ends) == 2 and ends[0] == ends[1]}
