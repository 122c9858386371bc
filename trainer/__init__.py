"""ddplab's trainer: one PyTorch DDP training script that runs unchanged on a
laptop, under torchrun on one machine, or across the lab's containers."""
