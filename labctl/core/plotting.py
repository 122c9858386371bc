"""matplotlib, for the PNGs only (the benches' plots, `labctl trace`'s timeline): an optional extra
(`pip install 'ddplab[plot]'`), since bringing a lab up, running and shaping need none of it.
Imported here, when a plot is drawn."""

from __future__ import annotations

import importlib.util

from labctl.errors import StateError

INSTALL_HINT = "pip install 'ddplab[plot]' (or `pip install matplotlib`) into labctl's environment; `make venv` does"


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def require_matplotlib(what: str) -> None:
    """A StateError, before any work, when `what` needs a plot and matplotlib is missing."""
    if not have_matplotlib():
        raise StateError(f"{what} draws with matplotlib, which is not installed in labctl's environment",
                         hint=INSTALL_HINT)


def pyplot():
    """matplotlib.pyplot on the Agg backend (PNG files; no display needed)."""
    require_matplotlib("a plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
