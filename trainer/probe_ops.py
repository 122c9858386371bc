"""What the process group's backend can do, tried on every rank: each c10d operation called
synchronously, asynchronously then `wait()`, and asynchronously then `get_future().wait()`, and the
reducing ones with every reduce op. Each cell is `ok` (it ran and gave the right values on every
rank), `wrong` (it ran and gave other values), `n/a` (the call has no such form) or the first line
of the error it raised; then all_reduce of each dtype. `labctl doctor --ops` runs it on the lab's
nodes and prints the table.

    torchrun --standalone --nproc-per-node 2 -m trainer.probe_ops      # rank 0 prints OPS {...}
    labctl doctor --ops

Every rank calls the same things in the same order, so a refusal (raised before any byte moves, as
gloo's are) leaves the ranks in step; each case ends with a barrier. A refused `get_future()` comes
after its work has started: the work is waited for all the same. The ranks agree on a cell through
an all_reduce of its outcome (the worst rank's is kept), so a wrong value on one rank shows.
"""

from __future__ import annotations

import argparse
import functools
import json
import operator
import os
from datetime import timedelta
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from trainer.backend import backend_flag
from trainer.dist import compute_cleanup, compute_init, get_dist_info, println

MODES = ("sync", "async_wait", "get_future")
REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM", "BAND", "BOR", "BXOR")
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "bfloat16",
          "float32", "float64", "float8_e4m3fn", "float8_e5m2", "complex64", "complex128")
OK, WRONG, NA = "ok", "wrong", "n/a"


class OpCase:
    """One operation on this rank: `call(async_op)` issues it (returning its work, or a list of works
    for batch_isend_irecv), `check()` says whether its outputs are what every rank expects."""

    def __init__(self, call: Callable, check: Callable[[], bool], forms: tuple[str, ...] = MODES):
        self.call, self.check, self.forms = call, check, forms


def _values(rank: int, world: int, dtype=torch.float32) -> torch.Tensor:
    return torch.full((4 * world,), float(rank + 1), dtype=dtype)


# How each reduce op folds two values (AVG and PREMUL_SUM: a sum, then scaled; see reduced)
FOLDS = {"SUM": operator.add, "AVG": operator.add, "PREMUL_SUM": operator.add, "PRODUCT": operator.mul,
         "MIN": min, "MAX": max, "BAND": operator.and_, "BOR": operator.or_, "BXOR": operator.xor}
PREMUL_FACTOR = 0.5  # the factor the probe's PREMUL_SUM multiplies every input by


def reduced(op: str, world: int) -> float:
    """What each element of a reduction of the ranks' (rank + 1)s is, under `op`."""
    folded = functools.reduce(FOLDS[op], range(1, world + 1))
    return folded / world if op == "AVG" else folded * PREMUL_FACTOR if op == "PREMUL_SUM" else folded


def reduce_op(op: str):
    return dist._make_nccl_premul_sum(PREMUL_FACTOR) if op == "PREMUL_SUM" else getattr(dist.ReduceOp, op)


def reducing_cases(op: str, rank: int, world: int, device) -> dict[str, OpCase]:
    """all_reduce and reduce_scatter_tensor under reduce op `op` (integers for the bitwise ones)."""
    dtype = torch.int64 if op.startswith("B") else torch.float32
    expected = reduced(op, world)
    ar = _values(rank, world, dtype).to(device)
    rs_in, rs_out = _values(rank, world, dtype).to(device), torch.empty(4, dtype=dtype, device=device)
    return {
        "all_reduce": OpCase(lambda a: dist.all_reduce(ar, op=reduce_op(op), async_op=a),
                           lambda: bool((ar == expected).all())),
        "reduce_scatter_tensor": OpCase(lambda a: dist.reduce_scatter_tensor(rs_out, rs_in, op=reduce_op(op), async_op=a),
                                      lambda: bool((rs_out == expected).all())),
    }


def dtype_case(name: str, world: int, device) -> OpCase:
    """all_reduce (SUM) of ones of dtype `name`: `world` everywhere after (True for bool)."""
    dtype = getattr(torch, name)
    t = torch.ones(8, dtype=dtype, device=device)
    expected = torch.full((8,), world if dtype != torch.bool else 1).to(torch.float64)
    as_float = (lambda: t.real.to(torch.float64)) if t.is_complex() else (lambda: t.to(torch.float64))
    return OpCase(lambda a: dist.all_reduce(t, async_op=a), lambda: bool((as_float().cpu() == expected).all()))


def one_block_per_rank(out: torch.Tensor, world: int) -> bool:
    """Whether `out`, cut in `world` blocks, holds rank r's value (r + 1) at the start of block r, as
    an all-gather's or an all-to-all's output does."""
    return bool((out.view(world, -1)[:, 0].cpu() == torch.arange(1, world + 1, dtype=torch.float32)).all())


def plain_cases(rank: int, world: int, device) -> dict[str, OpCase]:
    """Every operation of the table with SUM where it reduces, each with fresh buffers."""
    peer_to, peer_from = (rank + 1) % world, (rank - 1) % world
    x = _values(rank, world).to(device)
    gathered = torch.empty(4 * world * world, device=device)
    a2a_out = torch.empty(4 * world, device=device)
    bcast = _values(rank, world).to(device)
    sent, got = _values(rank, world).to(device), torch.empty(4 * world, device=device)
    cases = reducing_cases("SUM", rank, world, device)

    def send_recv(async_op):
        if async_op:
            return [dist.isend(sent, peer_to), dist.irecv(got, peer_from)]
        for first in ((rank % 2 == 0), (rank % 2 != 0)):  # even ranks send first: no cycle of waits
            dist.send(sent, peer_to) if first else dist.recv(got, peer_from)

    def batch(async_op):
        return dist.batch_isend_irecv([dist.P2POp(dist.isend, sent, peer_to), dist.P2POp(dist.irecv, got, peer_from)])

    cases.update({
        "all_gather_into_tensor": OpCase(lambda a: dist.all_gather_into_tensor(gathered, x, async_op=a),
                                       lambda: one_block_per_rank(gathered, world)),
        "all_to_all_single": OpCase(lambda a: dist.all_to_all_single(a2a_out, x, async_op=a),
                                  lambda: one_block_per_rank(a2a_out, world)),
        "broadcast": OpCase(lambda a: dist.broadcast(bcast, 0, async_op=a), lambda: bool((bcast == 1).all())),
        "send/recv": OpCase(send_recv, lambda: bool((got == peer_from + 1).all())),
        "batch_isend_irecv": OpCase(batch, lambda: bool((got == peer_from + 1).all()), ("async_wait", "get_future")),
        "barrier": OpCase(lambda a: dist.barrier(async_op=a), lambda: True),
        "monitored_barrier": OpCase(lambda a: dist.monitored_barrier(timeout=timedelta(seconds=30)), lambda: True,
                                  ("sync",)),
    })
    return cases


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def attempt(case: OpCase, mode: str) -> str:
    """The cell for one case in one mode, on this rank."""
    if mode not in case.forms:
        return NA
    works = []
    try:
        works = case.call(mode != "sync")
        works = works if isinstance(works, list) else [works] if works is not None else []
        if mode == "get_future":
            for work in works:
                work.get_future().wait()
        elif mode == "async_wait":
            for work in works:
                work.wait()
        return OK if case.check() else WRONG
    except Exception as exc:  # the cell is what it raised
        for work in works:  # a refused future: the work itself still has to finish
            try:
                work.wait()
            except Exception:
                pass
        return first_line(exc)


def agreed(cell: str, device) -> str:
    """The cell every rank reports: `ok` only if it was ok everywhere; else this rank's own word, which
    (all ranks calling the same thing) is every failing rank's."""
    bad = torch.tensor([0 if cell in (OK, NA) else 1], device=device)
    dist.all_reduce(bad)
    return cell if cell != OK or bad.item() == 0 else WRONG


def probe(rank: int, world: int, device) -> list[dict]:
    """The table's rows: each operation in each mode, then the reducing ones under each reduce op,
    every attempt on buffers of its own (an in-place all_reduce tried twice would reduce twice)."""
    rows: dict[str, dict] = {}
    for mode in MODES:
        for name, case in plain_cases(rank, world, device).items():
            rows.setdefault(name, {"op": name})[mode] = agreed(attempt(case, mode), device)
            dist.barrier()
    for op in REDUCE_OPS:
        for name, case in reducing_cases(op, rank, world, device).items():
            rows[name][op] = agreed(attempt(case, "sync"), device)
            dist.barrier()
    return list(rows.values())


def probe_dtypes(world: int, device) -> dict[str, str]:
    """all_reduce's cell for each dtype of DTYPES."""
    cells = {}
    for name in DTYPES:
        cells[name] = agreed(attempt(dtype_case(name, world, device), "sync"), device)
        dist.barrier()
    return cells


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m trainer.probe_ops", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", type=backend_flag, default=None, help="default: $DDPLAB_BACKEND, else auto")
    p.add_argument("--timeout-s", type=float, default=60.0, help="a collective that hangs fails after this")
    p.add_argument("--run-dir", default=None, help="where rank 0 writes ops.json (default $DDPLAB_RUN_DIR or .)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not get_dist_info()[0]:
        raise SystemExit("probe_ops needs a process group: run it under torchrun (or labctl doctor --ops)")
    c = compute_init(args.timeout_s, args.backend)
    rows = probe(c.rank, c.world_size, c.device)
    dtypes = probe_dtypes(c.world_size, c.device)
    if c.rank == 0:
        report = {"backend": c.backend, "device": c.device.type, "torch": torch.__version__,
                  "world_size": c.world_size, "modes": list(MODES), "reduce_ops": list(REDUCE_OPS), "rows": rows,
                  "all_reduce_dtypes": dtypes}
        println("OPS " + json.dumps(report))
        run_dir = Path(args.run_dir or os.environ.get("DDPLAB_RUN_DIR") or ".")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "ops.json").write_text(json.dumps(report))
    compute_cleanup()


if __name__ == "__main__":
    from trainer.dist import exit_done

    main()
    exit_done()
