#!/usr/bin/env bash
# The trainer and the allreduce bench on NCCL, on a GPU machine with PyTorch + CUDA and nothing else:
# no Docker, no labctl, no install. Only this checkout's trainer/ package and the Python given.
#
#   examples/gpu-check.sh              # python3
#   PYTHON=/opt/venv/bin/python examples/gpu-check.sh
#   BACKEND=gloo examples/gpu-check.sh  # the same on the CPU, to compare (or to try it without a GPU)
#
# Prints torch/CUDA/NCCL versions and the GPUs, then tokens/s of the GPT workload on nccl with 1 and
# 2 processes (2 only with 2+ GPUs: two ranks on one GPU is what NCCL refuses, "Duplicate GPU
# detected"; with one GPU the trainer's own refusal is shown instead), then an allreduce sweep
# (time, algbw, busbw). Exits non-zero on the first failure; logs stay in the folder it names.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
out=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" DDPLAB_DATA_DIR="$out/data" PYTHONUNBUFFERED=1
unset RANK LOCAL_RANK WORLD_SIZE MASTER_ADDR MASTER_PORT DDPLAB_BACKEND DDPLAB_RUN_DIR
steps=${STEPS:-40}
backend=${BACKEND:-nccl}
echo "logs: $out"

"$py" - <<'EOF'
import torch, torch.distributed as dist
nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else "-"  # a tuple (2, 27, 3), an int on old torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"NCCL {'.'.join(map(str, nccl)) if isinstance(nccl, tuple) else nccl}, nccl backend built: {dist.is_nccl_available()}")
import os
if not torch.cuda.is_available() and os.environ.get("BACKEND", "nccl") == "nccl":
    raise SystemExit("no CUDA device visible to this torch: nothing to check (nvidia-smi? CUDA_VISIBLE_DEVICES?)")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"GPU {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, compute capability {p.major}.{p.minor}")
EOF
ngpu=$("$py" -c 'import torch; print(torch.cuda.device_count())')

summary() {  # the SUMMARY line of log $1, as one line of figures
  "$py" - "$1" <<'EOF'
import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("SUMMARY ")][-1]
s = json.loads(line[len("SUMMARY "):])
print(f"  {s['backend']} on {s['device']}, world size {s['world_size']}: {s['tokens_per_s']:,.0f} tokens/s, "
      f"step {s['step_ms']:.1f} ms (compute {s['compute_ms_per_step']:.1f}, all-reduce {s['allreduce_ms_per_step']:.1f}), "
      f"final loss {s['final_loss']:.4f}, replicas consistent: {s['replicas_consistent']}")
EOF
}

train() {  # train NPROC: the GPT workload on $backend, NPROC processes
  local log="$out/train-x$1.log"
  echo "trainer, $backend, $1 process(es), $steps steps:"
  "$py" -m torch.distributed.run --standalone --nproc_per_node "$1" -m trainer --backend "$backend" --workload gpt \
    --corpus-chars 500000 --micro-batch 32 --steps "$steps" --run-dir "$out/run-x$1" >"$log" 2>&1 \
    || { tail -20 "$log"; exit 1; }
  summary "$log"
}

train 1
if [ "$backend" != nccl ] || [ "$ngpu" -ge 2 ]; then
  train 2
else
  echo "trainer, nccl, 2 processes: 1 GPU here, so 2 ranks would share it; expecting the trainer to refuse:"
  if "$py" -m torch.distributed.run --standalone --nproc_per_node 2 -m trainer --backend nccl --steps 2 \
      --global-batch 8 --run-dir "$out/run-refused" >"$out/train-refused.log" 2>&1; then
    echo "  UNEXPECTED: 2 ranks on 1 GPU ran"; exit 1
  fi
  echo "  refused: $(grep -m1 -o 'error: LOCAL_RANK=.*' "$out/train-refused.log" || tail -1 "$out/train-refused.log")"
fi

nproc=1
if [ "$backend" != nccl ] || [ "$ngpu" -ge 2 ]; then nproc=2; fi  # gloo: 2 CPU processes
echo "allreduce sweep, $backend, $nproc process(es) (busbw = algbw x 2(n-1)/n: 0 for one process):"
"$py" -m torch.distributed.run --standalone --nproc_per_node "$nproc" -m trainer.bench_allreduce --backend "$backend" \
  --sizes 1024,65536,1048576,16777216,268435456 --iters 10 --run-dir "$out/allreduce" >"$out/allreduce.log" 2>&1 \
  || { tail -20 "$out/allreduce.log"; exit 1; }
"$py" - "$out/allreduce/allreduce.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
print(f"  {'size(B)':>10} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}  backend/device")
for r in rows:
    n, algbw = r["world_size"], r["size"] / (r["time_us"] / 1e6) / 1e9
    print(f"  {r['size']:>10} {r['time_us']:>10.1f} {algbw:>12.3f} {algbw * 2 * (n - 1) / n:>12.3f}  {r['backend']}/{r['device']}")
EOF
echo "ok"
