"""How wide labctl's output is: a terminal's own width, else COLUMNS, else 200 columns."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from labctl.core.ui import PIPED_WIDTH, piped_width


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("columns, width", [(None, PIPED_WIDTH), ("100", 100), ("0", PIPED_WIDTH),
                                            ("wide", PIPED_WIDTH), (" 90 ", 90), ("-5", PIPED_WIDTH)])
def test_piped_output_is_as_wide_as_columns_says_else_200(columns, width):
    environ = {} if columns is None else {"COLUMNS": columns}
    assert piped_width(io.StringIO(), environ) == width


def test_a_terminal_is_left_to_rich():
    assert piped_width(Tty(), {"COLUMNS": "100"}) is None


def test_a_piped_table_wraps_at_columns():
    code = ("from labctl.core.ui import console; from rich.table import Table; t = Table('node', 'note');"
            "t.add_row('node0', 'x ' * 100); console.print(t)")
    for columns, widest in (("60", 60), ("", PIPED_WIDTH)):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"COLUMNS": columns, "PATH": ""}).stdout
        assert max(len(line) for line in out.splitlines()) == widest, out
