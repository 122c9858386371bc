"""A DDP script of one's own that compiles its model, as the field's training code does: every rank
trains the same small MLP under torch.compile for a few steps and prints one line,

    compiled_ddp.py [STEPS [WIDTH]]    # WIDTH: the hidden layer's (default 64): another graph
    COMPILED rank=R compile_s=S step_ms=M checksum=C cache_hits=H cache_misses=N

compile_s: the first step's time less a later step's (the compilation, which happens in the first
call), step_ms: the median of the later steps, checksum: the sum of the parameters at the end
(the same on every rank when DDP kept them in step), cache_hits and cache_misses: the graphs
inductor loaded from its cache and those it compiled (torch._dynamo's counters).
"""

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel as DDP

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
width = int(sys.argv[2]) if len(sys.argv) > 2 else 64
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.GELU(), torch.nn.Linear(width, 8))
compiled = DDP(torch.compile(model))  # nanoGPT's order: compile, then wrap
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(16, 32, generator=torch.Generator().manual_seed(rank))
times = []
for _ in range(steps):
    start = time.perf_counter()
    opt.zero_grad()
    compiled(data).pow(2).mean().backward()
    opt.step()
    times.append(time.perf_counter() - start)
later = statistics.median(times[1:])
checksum = sum(p.detach().double().sum().item() for p in model.parameters())
# Inductor's own count of the compiled graphs it found in the cache and those it had to compile.
cached = counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"]["fxgraph_cache_hit"]
compiled_afresh = counters["inductor"]["fxgraph_cache_miss"]
sys.stdout.write(f"COMPILED rank={rank} compile_s={times[0] - later:.3f} step_ms={later * 1e3:.2f} "
                 f"checksum={checksum:.10f} cache_hits={cached} cache_misses={compiled_afresh}\n")
sys.stdout.flush()
dist.destroy_process_group()
os._exit(0)
