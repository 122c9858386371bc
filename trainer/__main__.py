"""Train a small MLP on synthetic data with DistributedDataParallel.

The same code runs in every mode; only the launcher changes.

One process, no process group (world size 1):

    python -m trainer --epochs 1

Two processes on one machine:

    torchrun --standalone --nproc_per_node=2 -m trainer

(torchrun warns that it sets OMP_NUM_THREADS=1 unless you set it yourself.)

Across the lab's nodes, let labctl start torchrun in every container:

    labctl run -- -m trainer

or, by hand, on each node whose environment carries the PET_* variables
(torchrun reads PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, ... as defaults
for its flags):

    torchrun -m trainer

A "static" launcher may also set RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT itself and run `python -m trainer` in each process.

Every rank prints its mean loss per epoch; rank 0 ends with one line
`SUMMARY {...json...}`. Per-rank metrics go to
<run_dir>/metrics-rank<RANK>.jsonl. See `python -m trainer --help`.
"""

from trainer.dist import exit_done
from trainer.train import main

if __name__ == "__main__":
    main()
    exit_done()  # success only: an error has already left main() with its traceback
