"""Every collective a training step calls, by kind: when it was launched, when it finished, its size.

DDP's all-reduce, FSDP2's all-gathers and reduce-scatters and ZeroRedundancyOptimizer's broadcasts
all go through torch.distributed's Python functions (FSDP2 calls `dist.all_gather_single` and
`dist.reduce_scatter_single`, DDP's comm hooks `dist.all_reduce`, ZeRO `dist.broadcast`), looked up
on the module at every call. CollectiveLog.install() replaces those functions with ones that note
the call and then call the original, so whatever strategy, and a script of your own, is recorded
without a profiler. Between start_step() and end_step() each call becomes one Call:

  kind      all_reduce, all_gather, reduce_scatter, broadcast or all_to_all
  launched  when it was called (perf_counter seconds)
  done      when it finished: its return for a blocking call; for an async one (async_op=True, what
            FSDP2's prefetching all-gathers and DDP's buckets are) when its future completed, on the
            backend's thread; None where the backend's Work has no future (gloo's async
            reduce-scatter, which FSDP2 does not use)
  bytes     the message's size as nccl-tests counts it: the tensor for all_reduce and broadcast, the
            whole gathered output for all_gather, the whole input for reduce_scatter and all_to_all

Tensor parallelism's all-reduces (--strategy tp: DTensor's, inside a node) go through torch's
functional collectives instead, `_functional_collectives.all_reduce`, which hands back a tensor whose
result is waited for where it is first used; recorded, it is waited for at once (the next layer
needs it anyway), as kind tp_all_reduce, apart from the gradients' all-reduce across nodes.

Outside a step (the summary's own gathers, checkpoints) nothing is recorded. On NCCL a blocking
call returns once its kernel is queued on the GPU's stream, so there its time is the launch's, not
the transfer's; the lab's CPU nodes run gloo, whose blocking calls return when the data is there.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass

import torch.distributed as dist

# torch.distributed's function -> (kind, the argument holding the message: its name, its position)
RECORDED = {
    "all_reduce": ("all_reduce", "tensor", 0),
    "broadcast": ("broadcast", "tensor", 0),
    "all_gather_single": ("all_gather", "output_tensor", 0),
    "all_gather_into_tensor": ("all_gather", "output_tensor", 0),
    "reduce_scatter_single": ("reduce_scatter", "input", 1),
    "reduce_scatter_tensor": ("reduce_scatter", "input", 1),
    "all_to_all_single": ("all_to_all", "input", 1),
}
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "tp_all_reduce")


@dataclass
class Call:
    kind: str
    launched: float
    bytes: int
    blocking: bool = True  # the caller waited for it: the time launched -> done was not hidden
    done: float | None = None

    @property
    def ms(self) -> float | None:
        return None if self.done is None else (self.done - self.launched) * 1e3


def message_bytes(args: tuple, kwargs: dict, name: str, position: int) -> int:
    tensor = kwargs.get(name, args[position] if len(args) > position else None)
    return tensor.numel() * tensor.element_size() if hasattr(tensor, "numel") else 0


class CollectiveLog:
    """The collectives of the current step (see the module's docstring). One per process."""

    _installed: "CollectiveLog | None" = None

    def __init__(self):
        self._lock = threading.Lock()  # futures complete on the backend's threads
        self.calls: list[Call] = []
        self.active = False

    @classmethod
    def install(cls) -> "CollectiveLog":
        """The process's log, wrapping torch.distributed's collectives the first time it is asked for."""
        if cls._installed is None:
            log = cls()
            for name, (kind, arg, position) in RECORDED.items():
                if hasattr(dist, name):
                    setattr(dist, name, log.wrap(getattr(dist, name), kind, arg, position))
            import torch.distributed._functional_collectives as funcol

            funcol.all_reduce = log.wrap_functional(funcol.all_reduce)
            cls._installed = log
        return cls._installed

    def wrap(self, fn, kind: str, arg: str, position: int):
        @functools.wraps(fn)
        def recorded(*args, **kwargs):
            if not self.active:
                return fn(*args, **kwargs)
            call = Call(kind, time.perf_counter(), message_bytes(args, kwargs, arg, position))
            work = fn(*args, **kwargs)
            call.blocking = work is None  # torch returns a Work only for async_op=True
            with self._lock:
                self.calls.append(call)
            if call.blocking:  # it has finished
                call.done = time.perf_counter()
            else:
                self._stamp_when_done(work, call)
            return work

        return recorded

    def wrap_functional(self, fn):
        """A functional all-reduce (DTensor's, for tensor parallelism), waited for at once and recorded."""

        @functools.wraps(fn)
        def recorded(tensor, *args, **kwargs):
            if not self.active:
                return fn(tensor, *args, **kwargs)
            call = Call("tp_all_reduce", time.perf_counter(), tensor.numel() * tensor.element_size())
            out = fn(tensor, *args, **kwargs)
            out = out.wait() if hasattr(out, "wait") else out  # an AsyncCollectiveTensor: its result
            call.done = time.perf_counter()
            with self._lock:
                self.calls.append(call)
            return out

        return recorded

    @staticmethod
    def _stamp_when_done(work, call: Call) -> None:
        def done(_future):
            call.done = time.perf_counter()

        try:
            work.get_future().then(done)
        except RuntimeError:  # a Work without a future: its end is not known
            pass

    def start_step(self) -> None:
        with self._lock:
            self.calls = []
        self.active = True

    def end_step(self) -> list[Call]:
        """The step's calls, in the order they were launched; recording stops until the next step."""
        self.active = False
        with self._lock:
            return list(self.calls)


def in_flight_ms(calls: list[Call]) -> float:
    """The time at least one of `calls` was in flight (launched, not done), in ms: calls launched
    together and finishing one after another (ZeRO's 28 async broadcasts a step) count once."""
    spans = sorted((c.launched, c.done) for c in calls if c.done is not None)
    total, reach = 0.0, float("-inf")
    for start, end in spans:
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total * 1e3


def totals(steps: list[list[Call]]) -> dict:
    """One rank's steps summed by kind: {kind: [calls, bytes, ms in flight]} and "steps", what the
    ranks gather (small, however long the run) for summarize_calls."""
    out: dict = {"steps": len(steps)}
    for kind in KINDS:
        mine = [[c for c in step if c.kind == kind] for step in steps]
        if any(mine):
            out[kind] = [sum(map(len, mine)), sum(c.bytes for step in mine for c in step),
                         sum(in_flight_ms(step) for step in mine)]
    return out


def summarize_calls(per_rank: list[dict]) -> dict:
    """{kind: {"calls", "bytes", "ms"}} per step from every rank's totals(): calls and message bytes
    as rank 0 made them (every rank makes the same), ms the time a call of that kind was in flight
    (in_flight_ms: it may overlap compute), the mean over ranks. Empty without collectives."""
    first = per_rank[0] if per_rank else {}
    if not first.get("steps"):
        return {}
    out = {}
    for kind in KINDS:
        if kind not in first:
            continue
        calls, size, _ = first[kind]
        times = [r[kind][2] / r["steps"] for r in per_rank if kind in r and r["steps"]]
        out[kind] = {"calls": round(calls / first["steps"], 2), "bytes": round(size / first["steps"]),
                     "ms": round(sum(times) / len(times), 3)}
    return out


def span(calls: list[Call], backward_end: float) -> tuple[float | None, float | None, float]:
    """For a step without DDP's comm hook (fsdp): (first launched, last done, ms blocked) of the calls
    made by the end of backward. Blocked: summed over the blocking calls, which the rank could not
    hide behind compute; an async call's time counts as overlapped."""
    before = [c for c in calls if c.launched <= backward_end]
    if not before:
        return None, None, 0.0
    done = [c.done for c in before if c.done is not None]
    return (min(c.launched for c in before), max(done) if done else None,
            sum(c.ms for c in before if c.blocking and c.ms is not None))


def records(calls: list[Call], wall) -> list[dict]:
    """A step's calls for its metrics record, times on the process's one clock (`wall`, unix seconds)."""
    return [{"kind": c.kind, "bytes": c.bytes, "t_launch": round(wall(c.launched), 6),
             "t_done": None if c.done is None else round(wall(c.done), 6), "blocking": c.blocking} for c in calls]
