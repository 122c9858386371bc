"""Process-group setup and teardown, read only from the launcher's environment.

torchrun (and the lab's static launcher) describe this process with
RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT. When those are
absent we run as a plain single process and never create a process group, so
`python -m trainer` works with no launcher at all.
"""

import os
import socket
import sys
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from trainer.backend import resolve as resolve_backend

_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


class Compute(NamedTuple):
    is_ddp: bool  # True iff we joined a process group
    rank: int  # global rank, 0..world_size-1
    local_rank: int  # rank on this node; picks the GPU
    world_size: int
    device: torch.device
    backend: str  # "nccl", "gloo", or "none" without a process group
    reason: str = ""  # why this backend and device (trainer/backend.py), for the start-up line


def get_dist_info():
    """(is_ddp, rank, local_rank, world_size) from the launcher's environment."""
    if all(var in os.environ for var in _RANK_VARS):
        return (
            True,
            int(os.environ["RANK"]),
            int(os.environ["LOCAL_RANK"]),
            int(os.environ["WORLD_SIZE"]),
        )
    return False, 0, 0, 1


def pick_backend(requested=None):
    """trainer.backend.resolve on this machine: NCCL needs a GPU per rank; gloo runs anywhere, so a
    CPU-only container still trains with real DDP instead of silently dropping to one process."""
    nccl = dist.is_available() and dist.is_nccl_available()
    return resolve_backend(requested, torch.cuda.is_available(), nccl)


def pick_device(local_rank, device_type="cuda"):
    if device_type == "cuda" and torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise SystemExit(
                f"error: LOCAL_RANK={local_rank} but this node has only "
                f"{torch.cuda.device_count()} CUDA device(s); lower --nproc_per_node "
                "(two ranks on one GPU: NCCL refuses with 'Duplicate GPU detected')"
            )
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def compute_init(timeout_s, requested_backend=None):
    """Join the process group if launched distributed; return a Compute.

    timeout_s bounds rendezvous and every collective, so a dead or
    unreachable peer surfaces as an error instead of a 30-minute hang.
    requested_backend is --backend (None: $DDPLAB_BACKEND, else auto; see trainer/backend.py).
    """
    is_ddp, rank, local_rank, world_size = get_dist_info()
    choice = pick_backend(requested_backend)
    device = pick_device(local_rank, choice.device_type)
    if device.type == "cuda":
        # Collectives and all_gather_object use the "current" device.
        torch.cuda.set_device(device)
    if not is_ddp:
        return Compute(False, rank, local_rank, world_size, device, "none", f"{choice.reason}; one process, no group")

    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise SystemExit(
            f"error: RANK/WORLD_SIZE are set but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not; "
            "launch with torchrun or set both"
        )
    backend = choice.backend
    try:
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
            # Binding the GPU up front lets NCCL set up eagerly and shut down cleanly.
            device_id=device if device.type == "cuda" else None,
        )
    except dist.DistError as e:
        # Usually a peer that never started or can't reach MASTER_ADDR; the
        # store's stack trace says nothing more than this line does.
        master = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        raise SystemExit(
            f"error: rank {rank} could not form a {backend} process group of "
            f"{world_size} at {master} within --timeout-s {timeout_s:g}: {e}"
        ) from None
    return Compute(True, rank, local_rank, world_size, device, backend, choice.reason)


def compute_cleanup(after_barrier=None):
    """Leave the process group, so torchrun sees a clean exit.

    The barrier first: every rank finishes its last collective before any rank tears down its gloo
    connections. Without it, a rank that destroys early closes sockets under a peer's gloo threads,
    and that peer occasionally aborts at exit ("terminate called without an active exception",
    exit code -6) after training succeeded: seen here about once in 20 three-node runs.

    after_barrier, if given, is called once this rank has left that barrier (at once without a
    process group): every rank leaves it at almost the same moment, which the trainer stamps as
    its "end" clock record for lining up the ranks' timelines.
    """
    if is_group():
        dist.barrier()
    if after_barrier is not None:
        after_barrier()
    if is_group():
        dist.destroy_process_group()


def is_group():
    """True iff this process has joined a process group."""
    return dist.is_available() and dist.is_initialized()


def barrier():
    """dist.barrier() in a process group; nothing to wait for without one."""
    if is_group():
        dist.barrier()


def barrier_times(n, clock):
    """Pass n barriers back to back and read clock() as each is left: n moments every rank shares to
    within a message's latency (without a process group, n readings that nobody shares)."""
    times = []
    for _ in range(n):
        barrier()
        times.append(clock())
    return times


def exit_done():
    """Leave the process at once, after a run that finished: every output written and flushed,
    the process group left.

    What remains after main() returns is torch's own teardown: C++ static destructors that stop the
    autograd engine's and gloo's threads. That races and aborts now and then ("terminate called
    without an active exception", SIGABRT) with no Python frame left to blame, as faulthandler
    shows: 3 runs in 82 of 3 ranks on a loaded 2-core machine here, after the SUMMARY line. A job
    that succeeded must not exit -6, and nothing is left to tear down, so skip that teardown.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def is_rank0():
    _, rank, _, _ = get_dist_info()
    return rank == 0


def println(*args):
    """print() as ONE write, flushed.

    Ranks on a node share torchrun's stdout; print() writes the text and the
    newline separately, so two ranks' lines could splice mid-line.
    """
    sys.stdout.write(" ".join(str(a) for a in args) + "\n")
    sys.stdout.flush()


def print0(*args):
    """println() on global rank 0 only."""
    if is_rank0():
        println(*args)


def rank_tag(rank, world_size):
    """'[rank 1/3 node0]': who is speaking, for lines every rank prints."""
    return f"[rank {rank}/{world_size} {socket.gethostname()}]"


def all_reduce_sum(value, device):
    """Sum a Python number over all ranks (identity without a process group)."""
    if not is_group():
        return value
    # float64 so summing sample counts stays exact; NCCL needs a GPU tensor.
    t = torch.tensor(float(value), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.item()


def all_gather(obj):
    """List of every rank's obj, in rank order ([obj] without a process group)."""
    if not is_group():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
