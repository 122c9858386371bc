"""Programs that run inside the nodes and on the hosts, not in labctl's own process.

Each file here is shipped as text: `python -c TEXT ARGS...` on the node's Python, or
`sh -c TEXT NAME ARGS...`, through `docker exec` or an SSH session. So each one is a whole program
that needs nothing but the standard library and the node's own Python (3.9 or newer: no labctl
import, no newer syntax; the store also needs the node's torch), or a POSIX sh. Constants they
share with labctl (DDPLAB_RUN_ID, the store's markers, the workspace marker) are written out in
each, and tests/unit/test_remote.py checks that they equal labctl's. The Python ones a run uses
keep their work under `if __name__ == "__main__":` (true under `python -c` too), so tests can import
them as modules; python_target.py, run once per base image by `labctl build`, is a plain script.
One program is made of several files (PARTS): the fork server, whose request side and shared pieces
have files of their own; load() joins their texts into the one text that is shipped.

tests/unit/test_remote.py runs each of them here the way labctl runs them there (the store, which
needs torch, in tests/host/test_remote.py).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
# A program whose text is these files' texts one after another, its own file last: each file after the
# first uses the names of those before it, and imports them as a module only under
# `if __name__ != "__main__":`, which the shipped text skips (forkcommon.py says more).
PARTS = {"forkserver.py": ("forkcommon.py", "forkrequest.py", "forkserver.py")}


@lru_cache(maxsize=None)
def load(name: str) -> str:
    """The text of one script in this folder, e.g. load("stop.py"): what goes after `-c` (for one of
    PARTS, its files' texts joined)."""
    return "".join((HERE / part).read_text(encoding="utf-8") for part in PARTS.get(name, (name,)))


def name_of(text: str) -> str | None:
    """Which script of this folder `text` is (one that was loaded), for showing a command line."""
    if len(text) < 200:  # not one of ours: spare the comparison
        return None
    return next((name for name in ("worker.py", "forkserver.py", "forkchild.py", "store.py", "stop.py", "port_check.py", "crash.py",
                                   "node_info.py", "probe.py", "mtu_probe.py") if load(name) == text), None)
