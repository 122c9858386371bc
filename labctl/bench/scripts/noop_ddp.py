"""The smallest DDP job: join the process group, pass one barrier, leave. What `labctl bench start`
times: everything a run costs before a user's first line of real work, and after its last."""

import torch.distributed as dist

dist.init_process_group("gloo")  # env:// from torchrun, the static launcher or the warm path
dist.barrier()
dist.destroy_process_group()
