"""The host tests build on the unit tests' helpers, kept there once: hostrun.py (torchrun on this
machine) and what a split file's two halves share (`from test_wheelhouse import make_wheel`). pytest
puts tests/unit on sys.path only when it collects a file from there; here it is put there for any run,
`pytest tests/host` alone too. The unit files imported so are the very modules that pytest collects
when both tiers run in one session (the same name, the same file)."""

import sys
from pathlib import Path

UNIT = str(Path(__file__).resolve().parent.parent / "unit")
if UNIT not in sys.path:
    sys.path.insert(0, UNIT)
