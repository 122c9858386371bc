"""The lab as a Slurm cluster (`labctl up --scheduler slurm`) and the jobs it runs (`labctl slurm`).

- conf.py: slurm.conf for the lab's nodes (pure)
- script.py: the batch script that `slurm export` writes and `slurm run`/`submit` run (pure)
- jobs.py: submitting, following and cancelling jobs through the controller node (side effects)
"""
