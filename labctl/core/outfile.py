"""Files a user names on the command line (`slurm export -o`, `bench allreduce --plot`): `-` is
standard output, as it is to every Unix tool, so `labctl slurm export -o - -- -m trainer | head`
works and nothing named `-` appears in the folder."""

from __future__ import annotations

import sys
from pathlib import Path

STDOUT = "-"


def is_stdout(path: str | Path | None) -> bool:
    return path is not None and str(path) == STDOUT


def write_text(path: str | Path, text: str, mode: int | None = None) -> None:
    """`text` to the file at `path` (with `mode`, e.g. 0o755), or to standard output for `-`."""
    if is_stdout(path):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    path = Path(path)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)


def save_figure(figure, path: str | Path) -> None:
    """A matplotlib figure as a PNG file, or as PNG bytes on standard output for `-`."""
    if is_stdout(path):
        figure.savefig(sys.stdout.buffer, format="png")
        sys.stdout.buffer.flush()
        return
    figure.savefig(path)
