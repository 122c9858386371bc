"""The renderers, each imported when a command first uses it: the one place the CLI imports them.

The renderers (render*.py) import rich. `labctl` imports only the module of the command it runs,
and importing that module must not import rich (tests/unit/test_layers.py): a usage error or
--help prints without it, and `labctl up` prints nothing until Compose is done. So a command module
takes its renderers from here, at its top, as it takes anything else:

    from labctl.cli.lazy import render

and `render.print_nodes(...)` imports labctl.cli.render at that first call. A new renderer gets a
line below, and its commands take it from here too.
"""

from __future__ import annotations

import importlib


class LazyModule:
    """A module named now and imported at the first use of one of its attributes."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attribute: str):
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)

    def __repr__(self) -> str:
        return f"<{self._name}, imported at first use>"


render = LazyModule("labctl.cli.render")
render_bench = LazyModule("labctl.cli.render_bench")
render_ops = LazyModule("labctl.cli.render_ops")
render_slurm = LazyModule("labctl.cli.render_slurm")
render_trace = LazyModule("labctl.cli.render_trace")
