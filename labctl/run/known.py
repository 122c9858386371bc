"""What a rank's error means when it is a known limit of the nodes' torch, not a bug of the script:
a gap of the gloo backend that code written for NCCL meets, a CUDA-only call on a CPU node, a
compiled model on a node without a compiler. Each entry says what the limit is, where it holds
(the backend, the torch release it was met on) and the usual fix; `labctl run`'s failure report
ends with them (RunResult.explain), `--json` gives them as the root cause's `known`.

Every entry is met on a real lab by tests/integration/test_known_limits.py, through
tests/integration/scripts/meets_a_limit.py, which makes each failure as a user's script would.
Checked on torch 2.13.0 (the lab's pinned release) with gloo. Not in the table, because gloo in
that release never says it: `Backend gloo does not support <op>` (ProcessGroupGloo implements every
collective c10d's Backend declares), and `Cannot use ReduceOp.AVG with Gloo` (older releases said
it; 2.13 averages on gloo).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

MET_ON = "torch 2.13.0"  # the release the tests meet every entry on

DEVICE_FIX = ("choose the device and the backend from what the node has: "
              "`device = \"cuda\" if torch.cuda.is_available() else \"cpu\"`, "
              "`backend = \"nccl\" if device == \"cuda\" else \"gloo\"`, and make CUDA-only calls "
              "(`torch.cuda.set_device`, `device_id=` in `init_process_group`) only when the device is cuda")


@dataclass(frozen=True)
class Limit:
    name: str  # a short id, as --json gives it
    pattern: re.Pattern  # searched in the failed rank's error, then in its node's output
    what: str  # the limit, in a sentence
    where: str  # the backend or build that has it
    fix: str
    context: re.Pattern | None = None  # for a generic message: must also be in the node's output

    def lines(self) -> list[str]:
        """The report's last lines: why, then the fix."""
        return [f"why: {self.what} ({self.where}, met on {MET_ON})", f"fix: {self.fix}"]

    def to_dict(self) -> dict:
        return {"name": self.name, "what": self.what, "where": self.where, "met_on": MET_ON, "fix": self.fix}


LIMITS = (
    Limit("gloo-no-future", re.compile(r"Work::getFuture not implemented"),
          "gloo's reduce_scatter_tensor (any reduce op) and its point-to-point works (isend, irecv) have no "
          "future: `work.get_future()` raises where NCCL's works return one; gloo's all_reduce, "
          "all_gather_into_tensor, broadcast and all_to_all_single do have one",
          "gloo",
          "wait for the work itself (`work.wait()`, then use the output) instead of chaining on "
          "`work.get_future()`, or run the code on NCCL (GPU nodes: `labctl up --gpus`)"),
    Limit("gloo-premul-sum", re.compile(r"Cannot use ReduceOp\.PREMUL_SUM with Gloo"),
          "gloo refuses ReduceOp.PREMUL_SUM, NCCL's sum of inputs each multiplied by a factor first "
          "(`dist._make_nccl_premul_sum`)",
          "gloo",
          "reduce with ReduceOp.SUM and multiply the result by the factor, or use ReduceOp.AVG (gloo takes it) "
          "where the factor is one over the world size"),
    Limit("gloo-dtype", re.compile(r"Invalid scalar type"),
          "gloo's collectives take no int16, uint16, uint32, uint64 or float8 tensors (it takes bool, uint8, "
          "int8, int32, int64, float16, bfloat16, float32, float64 and complex; `labctl doctor --ops` lists them)",
          "gloo",
          "cast to a type gloo takes before the collective and back after (`t.to(torch.int64)`, `t.float()`)",
          context=re.compile(r"distributed_c10d|ProcessGroupGloo")),
    Limit("cuda-set-device", re.compile(r"module 'torch\._C' has no attribute '_cuda_setDevice'"),
          "`torch.cuda.set_device` was called on a node whose torch has no CUDA: it is a CUDA-only call",
          "a CPU build of torch", DEVICE_FIX),
    Limit("cuda-device-id", re.compile(r"device_id \S+ does not match the current compilation's accelerator support"),
          "`init_process_group(device_id=...)` named a CUDA device on a node whose torch has no accelerator",
          "a CPU build of torch", DEVICE_FIX),
    Limit("no-nccl", re.compile(r"Distributed package doesn't have NCCL built in"),
          "the nccl backend was asked for on a node whose torch has none: NCCL needs a CUDA build and a GPU",
          "a CPU build of torch", DEVICE_FIX),
    Limit("no-cuda", re.compile(r"Torch not compiled with CUDA enabled"),
          "CUDA was asked for (`.cuda()`, `device=\"cuda\"`, a `torch.cuda` call) on a node whose torch has none",
          "a CPU build of torch", DEVICE_FIX),
    Limit("no-compiler", re.compile(r"InvalidCxxCompiler|No working C\+\+ compiler found"),
          "torch.compile's CPU backend (inductor) writes C++ and builds it with $CXX (else g++) against the "
          "Python headers; this node has no working compiler by that name",
          "inductor on the CPU",
          "set CXX to a compiler the node has, or run the nodes on the lab's image (`labctl build` puts g++ and "
          "python3-dev in it; an image of your own needs them too, `labctl doctor` says which node lacks them), "
          "or run the model eager (`labctl run -e TORCHDYNAMO_DISABLE=1 ...`)"),
)


def known_limit(error: str | None, lines: Iterable[str]) -> Limit | None:
    """The entry that explains a failed rank: its `error` line (`Type: message`) first, else the
    output of its node (`lines`), where torch printed the message inside a longer one."""
    text = "\n".join(lines)
    for source in (error or "", text):
        for limit in LIMITS:
            if limit.pattern.search(source) and (limit.context is None or limit.context.search(text)):
                return limit
    return None
