"""`labctl cost --strategy pp|tp`: a pipeline's or a tensor-parallel step, priced on each link by
trainer/parallelcost.py (the arithmetic, and why), a row per link as `labctl cost` shows them.

pp puts one stage on each of the --nodes ranks and sends activations of --activations B,S,H (a
micro-batch's sequences, their length, the hidden size) across every boundary, --grad-accum
micro-batches a step. tp shares each of --layers blocks among a node's --nproc-per-node ranks: each
row's link is then the one inside a node, where those all-reduces go. Across nodes each rank's share
of the gradients is all-reduced with its peers, as DDP's are: `labctl cost --strategy ddp` with
--params divided by the ranks a node prices that on the links between nodes.
"""

from __future__ import annotations

from labctl.bench.cost import DTYPE_BYTES, CostQuery, CostReport, check_query, report_of, resolve, state_bytes_per_rank
from labctl.errors import ConfigError
from labctl.session import LabSession
from trainer.parallelcost import ParallelStep, pipeline_cost, tensor_cost
from trainer.stepmodel import Link

PARALLEL = ("pp", "tp")  # the strategies this module prices


def estimate_parallel(query: CostQuery, lab: LabSession | None = None) -> CostReport:
    """`labctl cost --strategy pp|tp`: resolved and checked as `labctl cost` does, a row per link."""
    n, links, notes = resolve(query, lab)
    check_query(query, n)
    check_parallel(query, n)
    return report_of(query, n, parallel_rows(query, n, links), notes=notes)


def activation_shape(text: str | None, strategy: str) -> tuple[int, int, int]:
    """--activations B,S,H as three positive whole numbers."""
    example = f"labctl cost --params 124M --strategy {strategy} --activations 8,1024,768 --nodes 4"
    if text is None:
        raise ConfigError("--activations", None, f"is needed with --strategy {strategy}: a micro-batch's sequences, "
                          "their length and the hidden size, B,S,H", hint=example)
    parts = str(text).split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ConfigError("--activations", text, "must be three positive whole numbers B,S,H (sequences a "
                          "micro-batch, sequence length, hidden size)", hint=example)
    b, s, h = (int(p) for p in parts)
    return b, s, h


def check_parallel(query: CostQuery, n: int) -> None:
    """What pp and tp need besides labctl cost's own checks: the activations, and for tp the layers and
    a node of two ranks or more."""
    activation_shape(query.activations, query.strategy)
    if query.strategy == "tp":
        if not query.layers or query.layers < 1:
            raise ConfigError("--layers", query.layers, "is needed with --strategy tp: the transformer blocks, each "
                              "all-reducing its activations 4 times a micro-batch", hint="--layers 12")
        if query.nproc_per_node < 2:
            raise ConfigError("--nproc-per-node", query.nproc_per_node, "must be 2 or more with --strategy tp, which "
                              "shares each layer among a node's ranks", hint="--nodes 8 --nproc-per-node 4")


def parallel_rows(query: CostQuery, n: int, links: list[Link]) -> list[dict]:
    """A row per link: one optimizer step of `query.strategy` over n ranks."""
    b, s, h = activation_shape(query.activations, query.strategy)
    act = b * s * h * DTYPE_BYTES[query.dtype]
    payload, m = query.params * DTYPE_BYTES[query.dtype], query.grad_accum
    step = ParallelStep(m, act, query.efficiency, query.compute_s, query.backend)
    rows = []
    for link in links:
        row = {"link": link.name, "rate_bps": link.rate_bps, "payload_bytes": payload, "strategy": query.strategy,
               "activation_bytes": act, "micro_batches": m}
        if query.strategy == "pp":
            c = pipeline_cost(n, step, link)
            row.update(stages=n, bubble=c.bubble, transfer_s=c.transfer_s, bytes_per_rank=c.bytes_per_rank,
                       comm_s=c.comm_s, state_bytes_per_rank=state_bytes_per_rank(query.params / n, query.dtype, 1, "ddp"),
                       step_s=c.step_s)
        else:
            c = tensor_cost(query.nproc_per_node, query.layers, step, link)
            row.update(tp_ranks=c.ranks, all_reduces=c.all_reduces, bytes_per_rank=c.bytes_per_rank, comm_s=c.comm_s,
                       state_bytes_per_rank=state_bytes_per_rank(query.params / c.ranks, query.dtype, 1, "ddp"),
                       step_s=c.step_s)
        if query.compute_s is not None:
            row["comm_over_compute"] = row["comm_s"] / (m * query.compute_s)
        rows.append(row)
    return rows
