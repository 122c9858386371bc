"""DDP's communication hooks on a real gloo group of one, in a process of its own, for
tests/unit/test_trainer.py: trains an MLP 5 steps under each hook, tries bf16's refusal, prints one
JSON line ({"losses": {hook: [...]}, "bf16": the refusal}) and leaves with os._exit(0).

Why a process of its own, left without a teardown: a PowerSGD hook chains futures whose callbacks
hold the group. Where the last of them is released on gloo's own worker thread after the group was
destroyed, ~ProcessGroupGloo joins that thread from itself, std::thread throws "Resource deadlock
avoided" and the process aborts. In the pytest worker that ran these tests in-process it did, twice
(2026-11-26, 2026-12-07), during the test after them. Here nothing is torn down: the answer is out
before the process ends, and nothing of torch's runs after it.
"""

import json
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist

from trainer.ddp import wrap_ddp
from trainer.model import MLP

HOOKS = ("none", "fp16", "powersgd")


def losses(c, hook: str) -> list[float]:
    torch.manual_seed(0)
    ddp = wrap_ddp(MLP(8, 16, 3), c, bucket_cap_mb=1.0, comm_hook=hook, static_graph=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    seen = []
    for _ in range(5):
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen.append(loss.item())
    return seen


def main() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    c = SimpleNamespace(local_rank=0, device=torch.device("cpu"), backend="gloo")
    answer = {"losses": {hook: losses(c, hook) for hook in HOOKS}, "bf16": None}
    try:
        wrap_ddp(MLP(8, 16, 3), c, comm_hook="bf16")
    except SystemExit as exc:
        answer["bf16"] = str(exc.code)
    print(json.dumps(answer), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
