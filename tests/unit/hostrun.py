"""How the unit tests run the trainer, or a script, under torchrun on this machine: in this
process's environment without a launcher's variables (which would make an in-process run a DDP one,
or move its run folder or its kernels), one thread a process (which also keeps torchrun from
warning about it) and no GPU (the CPU/gloo path, even on a GPU box)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
               "DDPLAB_RUN_DIR", "DDPLAB_CPU_KERNELS")


def host_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **extra)
    return env


def torchrun(log_dir: Path, *args, nproc: int = 2, env: dict[str, str] | None = None, cwd: Path = REPO,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=nproc --log-dir log_dir ARGS` (its logs there, not in a
    /tmp/torchelastic_* left behind), its output captured."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "--log-dir", str(log_dir), *map(str, args)]
    return subprocess.run(argv, cwd=cwd, env=env or host_env(), capture_output=True, text=True, timeout=timeout)
