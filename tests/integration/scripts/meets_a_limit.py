"""Code written for NCCL, for a GPU or for a machine with a compiler, as the field writes it, run
on CPU nodes: every rank meets the same known limit of the node's torch (labctl/run/known.py).

    meets_a_limit.py NAME
NAME: gloo-no-future, gloo-premul-sum, gloo-dtype, cuda-set-device, cuda-device-id, no-nccl,
      no-cuda, no-compiler (the names of labctl.run.known.LIMITS; no-compiler where CXX names no
      compiler, the lab's image having g++)
"""

import os
import sys

import torch
import torch.distributed as dist

name = sys.argv[1]
local_rank = int(os.environ["LOCAL_RANK"])

if name == "no-nccl":  # the backend hard-coded for GPUs
    dist.init_process_group("nccl")
elif name == "cuda-device-id":  # torchtitan's and the docs' newer form: the group bound to the rank's GPU
    dist.init_process_group("gloo", device_id=torch.device("cuda", local_rank))
else:
    dist.init_process_group("gloo")
world = dist.get_world_size()

if name == "cuda-set-device":  # nanoGPT's DDP branch
    device = f"cuda:{local_rank}"
    torch.cuda.set_device(device)
elif name == "no-cuda":
    model = torch.nn.Linear(8, 8).cuda()
elif name == "gloo-no-future":  # an optimizer that overlaps its reduce-scatter with the next step
    grad = torch.ones(4 * world)
    grad_slice = torch.empty(4)
    future = dist.reduce_scatter_tensor(grad_slice, grad, op=dist.ReduceOp.AVG, async_op=True).get_future()
    future.wait()
elif name == "gloo-premul-sum":  # gradients averaged as NCCL does it, in the sum
    grad = torch.ones(16)
    dist.all_reduce(grad, op=dist._make_nccl_premul_sum(1.0 / world))
elif name == "gloo-dtype":  # a step counter kept as uint64
    steps = torch.zeros(1, dtype=torch.uint64)
    dist.all_reduce(steps)
elif name == "no-compiler":  # a pointwise op after the matmul: a kernel inductor writes in C++
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()))
    model(torch.ones(2, 8))
else:
    sys.exit(f"meets_a_limit.py: no limit named {name!r}")
print(f"rank {dist.get_rank()}: {name} did not fail", flush=True)
dist.destroy_process_group()
