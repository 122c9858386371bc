"""The trainer and the allreduce bench on nccl, on this machine's GPU (no Docker, no lab): torchrun
--standalone, world size 1. Skipped only where `nvidia-smi -L` finds no GPU; a machine with a GPU
whose torch cannot use it fails, since that is what this test is for."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
               "DDPLAB_RUN_DIR", "DDPLAB_BACKEND", "CUDA_VISIBLE_DEVICES")


def gpus_listed() -> tuple[list[str], str]:
    """(the `GPU n: ...` lines of `nvidia-smi -L`, why there are none)."""
    if not shutil.which("nvidia-smi"):
        return [], "nvidia-smi is not installed"
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return [], f"nvidia-smi -L did not run: {exc}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("GPU ")]
    return lines, f"nvidia-smi -L exited {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}"


GPUS, WHY_NONE = gpus_listed()
pytestmark = pytest.mark.skipif(not GPUS, reason=f"no GPU on this machine: {WHY_NONE}")


def torchrun(module_args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH")))), PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", *module_args]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_this_torch_can_use_the_gpu():
    import torch

    assert torch.cuda.is_available(), (f"nvidia-smi lists {GPUS} but torch {torch.__version__} sees no CUDA "
                                       f"(torch.version.cuda={torch.version.cuda}): install a CUDA build of torch")


def test_the_trainer_trains_on_nccl(tmp_path):
    done = torchrun(["-m", "trainer", "--backend", "nccl", "--steps", "20", "--global-batch", "64",
                     "--run-dir", str(tmp_path / "run")], tmp_path)
    [line] = [line for line in done.stdout.splitlines() if line.startswith("SUMMARY ")]
    summary = json.loads(line[len("SUMMARY "):])
    assert (summary["backend"], summary["device"], summary["world_size"], summary["steps"]) == ("nccl", "cuda", 1, 20)
    assert summary["replicas_consistent"] is True and summary["tokens_per_s"] > 0
    assert "backend nccl world_size 1 device cuda:0" in done.stdout


def test_the_allreduce_bench_times_cuda_tensors_on_nccl(tmp_path):
    done = torchrun(["-m", "trainer.bench_allreduce", "--backend", "nccl", "--sizes", "1024,1048576", "--iters", "3",
                     "--run-dir", str(tmp_path)], tmp_path)
    rows = json.loads((tmp_path / "allreduce.json").read_text())
    assert [(r["size"], r["backend"], r["device"], r["world_size"]) for r in rows] == [
        (1024, "nccl", "cuda", 1), (1048576, "nccl", "cuda", 1)]
    assert all(r["time_us"] > 0 for r in rows)
    assert "backend nccl, device cuda:0" in done.stdout
