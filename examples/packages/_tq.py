import os
import torch.distributed as dist
import tqdm
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} tqdm {tqdm.__version__}")
dist.destroy_process_group()
