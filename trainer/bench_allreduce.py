"""The allreduce sweep: trainer.bench_collectives with one op, all_reduce, the spelling `labctl bench
allreduce` runs. Rank 0 prints `ALLREDUCE {...}` per size and writes `<run_dir>/allreduce.json`.

    torchrun --standalone --nproc_per_node=2 -m trainer.bench_allreduce --sizes 1024,1048576
"""

from trainer.bench_collectives import more
from trainer.bench_collectives import main as sweep
from trainer.bench_collectives import parse_args as parse_collective_args

__all__ = ["main", "more", "parse_args"]  # more: its tests import it from here


def parse_args(argv=None):
    return parse_collective_args(argv, ops_flag=False, prog="python -m trainer.bench_allreduce")


def main(argv=None):
    sweep(argv, one_op=True)


if __name__ == "__main__":
    from trainer.dist import exit_done

    main()
    exit_done()
