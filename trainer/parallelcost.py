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
class Step:
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


def pipeline_cost(stages: int, step: Step, link) -> PipelineCost:
    """One optimizer step of a pipeline of `stages` on `link` (a stepmodel.Link)."""
    m, act = step.micro_batches, step.activation_bytes
    slots = m + stages - 1
    one = transfer_s(act, link, step.efficiency) if stages > 1 else 0.0
    sends = 0 if stages == 1 else (1 if stages == 2 else 2)  # per micro-batch, the busiest stage's
    total = slots * (step.compute_s / stages + 2 * one) if step.compute_s is not None else None
    return PipelineCost(stages, m, sends * m * act, one, slots * 2 * one, bubble(stages, m), total)


def tensor_cost(ranks: int, layers: int, step: Step, link) -> TensorCost:
    """One optimizer step's activation all-reduces among `ranks` sharing each of `layers` blocks, on
    `link`, the link inside a node."""
    count = 4 * layers * step.micro_batches
    act = step.activation_bytes
    sent = count * ring_cost("all_reduce", ranks, step.backend).wire * act
    comm = count * link.textbook_s("all_reduce", act, ranks, step.backend, step.efficiency)
    total = step.micro_batches * step.compute_s / ranks + comm if step.compute_s is not None else None
    return TensorCost(ranks, count, sent, comm, total)
