"""A small DDP project, tested on a ddplab lab by its own test suite (`tests/`, the ddp_lab fixture).

- `train.py`: a tiny model trained with DDP over gloo; rank 0 prints `SUMMARY {...}` with every
  rank's parameter checksum.
- `allreduce.py`: times the all-reduce of one large tensor; rank 0 prints `SUMMARY {...}`.

Both are plain torchrun scripts that know nothing of ddplab (they read torchrun's environment):
`torchrun --standalone --nproc-per-node 2 ddpci/train.py` runs them on one machine.
"""
