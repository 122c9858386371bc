"""Train a small model with DistributedDataParallel: an MLP on synthetic classes (--workload toy,
the default) or a character-level GPT on generated Python-like source (--workload gpt).

The same code runs in every mode; only the launcher changes. Rank information comes from the
launcher's environment alone (trainer/dist.py).

One process, no process group (world size 1):

    python -m trainer --epochs 1
    python -m trainer --workload gpt --steps 20

One node, N processes (here 2):

    torchrun --standalone --nproc_per_node=2 -m trainer

(torchrun warns that it sets OMP_NUM_THREADS=1 unless you set it yourself.)

N nodes (here 3), P processes each: run this on every node, NODE_RANK being 0, 1 and 2, and
NODE0_ADDR the address of node 0, where rendezvous happens:

    torchrun --nnodes=3 --node_rank=NODE_RANK --nproc_per_node=P \
        --master_addr=NODE0_ADDR --master_port=29500 -m trainer

Across the lab's nodes, let labctl start torchrun in every container:

    labctl run -- -m trainer

which runs a bare `torchrun -m trainer` on each node: the node's environment carries PET_*
variables (PET_NNODES, PET_NPROC_PER_NODE, PET_RDZV_BACKEND=c10d, PET_RDZV_ENDPOINT, ...), which
torchrun reads as the defaults of its flags.

A "static" launcher may also set RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT itself and run `python -m trainer` in each process.

Every rank prints its mean loss per epoch (epoch mode) or the global loss on the steps that log
(global-batch mode: gpt, or --global-batch); rank 0 ends with one line `SUMMARY {...json...}`.
Per-rank metrics go to <run_dir>/metrics-rank<RANK>.jsonl (records described in
trainer/metrics.py). See `python -m trainer --help`.
"""

from trainer.dist import exit_done
from trainer.train import main

if __name__ == "__main__":
    main()
    exit_done()  # success only: an error has already left main() with its traceback
