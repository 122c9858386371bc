"""Which folder is the workspace: the nearest one, from where labctl runs upwards, that holds `.lab/`
(as git finds `.git` and Compose its project), else the folder labctl runs from, a fresh workspace.

So `labctl run`, `status` or `down` work from any subdirectory of a workspace, and `labctl up` in a
subdirectory of one brings the lab up for the whole workspace rather than starting a second one.
At the bottom of the package: it imports nothing of labctl's.
"""

from __future__ import annotations

from pathlib import Path

STATE_DIR = ".lab"  # labctl's folder in a workspace: env files, compose.yaml, runs, per lab


def find_workspace(start: Path) -> Path:
    """The nearest folder from `start` (itself included) upwards that holds STATE_DIR, else `start`."""
    start = Path(start).resolve()
    for folder in (start, *start.parents):
        if (folder / STATE_DIR).is_dir():
            return folder
    return start


def is_folder(path: Path) -> bool:
    """Whether `path` is a folder; False, not an OSError, for a name the OS refuses (a component over
    255 bytes: ENAMETOOLONG), as Path.is_dir() already gives for one that does not exist."""
    try:
        return Path(path).is_dir()
    except OSError:
        return False
