"""How each collective uses the links, per backend: the ring cost model's arithmetic, in one place.

Pure Python, no torch: the trainer's step model (trainer/stepmodel.py) prices each step's
collectives with it inside the nodes, and labctl (`labctl cost`, `bench collectives`) on the host.

A ring all-reduce over n ranks runs 2(n-1) steps and sends 2(n-1)/n of the message through each
rank's NIC; all-gather and reduce-scatter run n-1 steps and send (n-1)/n. Those are NCCL's
algorithms and nccl-tests' bus-bandwidth factors. gloo, the lab's CPU backend, differs in three:
it reduce-scatters by all-reducing a clone of the whole input and keeping its chunk
(ProcessGroupGloo's reduce_scatter_tensor_coalesced), it all-gathers into a buffer it allocates
and copies the result out, and it broadcasts down a binomial tree, the root sending the whole
message once a round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")  # nccl-tests' names


@dataclass(frozen=True)
class OpCost:
    """How one collective over n ranks uses the links, as its algorithm runs it on a backend."""

    hops: int  # latency steps one after another
    wire: float  # bytes through the busiest rank's NIC, over the message's bytes
    busbw: float  # nccl-tests' bus-bandwidth factor: busbw = algbw x busbw
    algorithm: str  # in words
    copies: float = 0.0  # bytes copied in memory besides the transfer, over the message's (gloo's extra buffers)


def ring_cost(op: str, n: int, backend: str = "nccl") -> OpCost:
    """The cost of `op` (one of OPS, which the caller has checked) over n ranks on `backend`."""
    if n <= 1:
        return OpCost(0, 0.0, 0.0, "one rank: nothing crosses a link")
    ring = (n - 1) / n
    if op == "all_reduce":
        return OpCost(2 * (n - 1), 2 * ring, 2 * ring, "ring: reduce-scatter, then all-gather")
    if op == "reduce_scatter" and backend == "gloo":  # the input cloned, all-reduced, this rank's chunk copied out
        return OpCost(2 * (n - 1), 2 * ring, ring, "gloo: an all-reduce of the whole input, its chunk kept", 1 + 1 / n)
    if op == "all_gather" and backend == "gloo":  # gathered into a buffer it allocates, then copied out
        return OpCost(n - 1, ring, ring, "gloo: ring into a fresh buffer, copied out", 1.0)
    if op in ("all_gather", "reduce_scatter"):
        return OpCost(n - 1, ring, ring, "ring")
    if op == "broadcast" and backend == "gloo":
        rounds = math.ceil(math.log2(n))
        return OpCost(rounds, float(rounds), 1.0, "gloo: binomial tree, the whole message once a round")
    if op == "broadcast":
        return OpCost(n - 1, 1.0, 1.0, "pipelined chain")
    return OpCost(1, ring, ring, "every pair at once")
