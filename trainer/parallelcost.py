"""Pipeline and tensor parallelism, priced by hand: what each sends in an optimizer step, over which
link, and what it leaves idle. Pure Python, no torch, beside ring.py: `labctl cost --strategy pp|tp`
prices with it, and so can the trainer's step model inside the nodes.

Pipeline (pp), p stages, one a rank, m micro-batches a step, A bytes of activations a micro-batch at
each boundary between stages (micro-batch x sequence x hidden x dtype bytes):
  - every boundary carries each micro-batch's activations forward and their gradients back: a stage
    in the middle sends 2 x m x A a step, the first and the last m x A;
  - GPipe and 1F1B both run m + p - 1 slots a step; in each, a stage computes one micro-batch's
    forward and backward (its 1/p of the model: compute / p) and waits for its two transfers, one
    in and one out, A x 8 / (rate x efficiency) plus a hop's latency each, none hidden (gloo sends
    and receives one tensor at a time):  step = (m + p - 1) x (compute / p + 2 x transfer);
  - the bubble, the share of a step a stage has nothing to do: (p - 1) / (m + p - 1).
    1F1B does not shrink it; it holds p micro-batches' activations at most instead of m.

Tensor (tp, Megatron's split), t ranks inside a node sharing each layer: each transformer block
all-reduces the activations twice in forward (after attention, after the MLP) and twice in backward,
A bytes each: 4 x layers x m all-reduces of A a step among the t ranks, priced by the ring model.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.ring import ring_cost


@dataclass(frozen=True)
class ParallelStep:
    """What both price: a step's micro-batches, one micro-batch's activations at a boundary (bytes),
    the share of a link's rate the stack reaches, one micro-batch's forward and backward through the
    whole model on one rank (seconds; None: not known), and whose algorithms (ring.py's backends)."""

    micro_batches: int
    activation_bytes: float
    efficiency: float = 1.0
    compute_s: float | None = None
    backend: str = "nccl"


@dataclass(frozen=True)
class PipelineCost:
    stages: int
    micro_batches: int
    bytes_per_rank: float  # the busiest stage's sends a step
    transfer_s: float  # one micro-batch's activations (or their gradients) across one boundary
    comm_s: float  # the transfers on the pipeline's critical path, a step
    bubble: float  # (p - 1) / (m + p - 1)
    step_s: float | None  # with the compute: (m + p - 1) x (compute / p + 2 x transfer)


@dataclass(frozen=True)
class TensorCost:
    ranks: int
    all_reduces: int  # a step's, among the t ranks: 4 x layers x micro-batches
    bytes_per_rank: float
    comm_s: float
    step_s: float | None  # with the compute: m x compute / t + comm, nothing overlapped


def transfer_s(nbytes: float, link, efficiency: float) -> float:
    """One point-to-point send of `nbytes` on `link` (a stepmodel.Link): its bytes and one hop."""
    return nbytes * 8 / (link.rate_bps * efficiency) + link.stack_s + link.delay_s


def bubble(stages: int, micro_batches: int) -> float:
    return (stages - 1) / (micro_batches + stages - 1)


def pipeline_cost(stages: int, step: ParallelStep, link) -> PipelineCost:
    """One optimizer step of a pipeline of `stages` on `link` (a stepmodel.Link)."""
    m, act = step.micro_batches, step.activation_bytes
    slots = m + stages - 1
    one = transfer_s(act, link, step.efficiency) if stages > 1 else 0.0
    sends = 0 if stages == 1 else (1 if stages == 2 else 2)  # per micro-batch, the busiest stage's
    total = slots * (step.compute_s / stages + 2 * one) if step.compute_s is not None else None
    return PipelineCost(stages, m, sends * m * act, one, slots * 2 * one, bubble(stages, m), total)


def tensor_cost(ranks: int, layers: int, step: ParallelStep, link) -> TensorCost:
    """One optimizer step's activation all-reduces among `ranks` sharing each of `layers` blocks, on
    `link`, the link inside a node."""
    count = tp_all_reduces(layers, step.micro_batches)
    act = step.activation_bytes
    sent = count * ring_cost("all_reduce", ranks, step.backend).wire * act
    comm = count * link.textbook_s("all_reduce", act, ranks, step.backend, step.efficiency)
    total = step.micro_batches * step.compute_s / ranks + comm if step.compute_s is not None else None
    return TensorCost(ranks, count, sent, comm, total)


def tp_all_reduces(layers: int, micro_batches: int) -> int:
    """A step's all-reduces of activations under tensor parallelism: two a block in forward (after
    attention's output projection and the MLP's second layer), two in backward (the input gradients
    of the qkv projection and the MLP's first layer), for each micro-batch."""
    return 4 * layers * micro_batches


def stage_order(schedule: str, stages: int, rank: int, micro_batches: int) -> list[tuple[str, int]]:
    """The order in which stage `rank` runs its forwards and backwards: GPipe's every forward, then
    every backward; 1F1B's (torch.distributed.pipelining's Schedule1F1B) as many forwards as there
    are stages from it to the last (the pipe filling), then a backward and a forward in turn, then
    the backwards left."""
    if schedule == "gpipe":
        return [("forward", i) for i in range(micro_batches)] + [("backward", i) for i in range(micro_batches)]
    warm = min(micro_batches, stages - rank)
    order, forwards = [("forward", i) for i in range(warm)], warm
    for i in range(micro_batches):
        order.append(("backward", i))
        if forwards < micro_batches:
            order.append(("forward", forwards))
            forwards += 1
    return order


def simulate_pipeline(stage_ms: list[tuple[float, float]], schedule: str, micro_batches: int,
                      transfer_ms: list[float]) -> float:
    """A pipeline step's forwards and backwards, played out: stage r takes stage_ms[r] (forward,
    backward) for each micro-batch, in stage_order's order, a forward once the stage before it has
    sent that micro-batch's activations, a backward once the stage after it has sent the gradients
    (transfer_ms[r]: one way across the boundary between stages r and r + 1). The time until the
    last stage to finish has run its last backward, in ms."""
    stages = len(stage_ms)
    orders = [stage_order(schedule, stages, r, micro_batches) for r in range(stages)]
    done: dict[tuple[str, int, int], float] = {}
    clock, at = [0.0] * stages, [0] * stages
    while any(at[r] < len(orders[r]) for r in range(stages)):
        moved = False
        for r in range(stages):
            while at[r] < len(orders[r]):
                kind, i = orders[r][at[r]]
                if kind == "forward":
                    ready = 0.0 if r == 0 else done.get(("forward", r - 1, i), None)
                    ready = ready if ready is None or r == 0 else ready + transfer_ms[r - 1]
                else:
                    ready = (done.get(("forward", r, i)) if r == stages - 1
                             else done.get(("backward", r + 1, i)))
                    ready = ready if ready is None or r == stages - 1 else ready + transfer_ms[r]
                if ready is None:
                    break
                clock[r] = max(clock[r], ready) + stage_ms[r][0 if kind == "forward" else 1]
                done[(kind, r, i)] = clock[r]
                at[r] += 1
                moved = True
        if not moved:
            raise ValueError(f"the {schedule} schedule of {stages} stages and {micro_batches} micro-batches cannot go on")
    return max(clock)
