"""Rendering `labctl doctor --ops`: the backend's operations as a table, then what it refused."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from labctl.cli.render import emit_json
from labctl.core.ui import stdout_console
from labctl.diagnose.ops import NCCL_DIFFERS, OK, WRONG, OpsReport

MODE_TITLES = {"sync": "sync", "async_wait": "async, wait()", "get_future": "async, get_future()"}


def shown(cell: str, numbers: dict[str, int]) -> str:
    """A cell as the table shows it: ok, n/a, wrong, or `no (N)`, N the refusal listed below it."""
    return f"no ({numbers[cell]})" if cell in numbers else cell


def cells_table(report: OpsReport, title: str, columns: list[str], ops: list[str], numbers: dict[str, int]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("operation")
    for column in columns:
        table.add_column(MODE_TITLES.get(column, column))
    for op in ops:
        table.add_row(op, *(escape(shown(report.cell(op, c), numbers)) for c in columns))
    return table


def print_ops(report: OpsReport, as_json: bool) -> None:
    if as_json:
        emit_json(report.to_dict())
        return
    out = stdout_console()
    refusals = [(error, places) for error, places in report.refusals() if error != WRONG]
    numbers = {error: i for i, (error, _) in enumerate(refusals, 1)}
    title = f"{report.backend} on {report.world_size} ranks ({report.device}), torch {report.torch}"
    out.print(cells_table(report, title, report.modes, [r["op"] for r in report.rows], numbers))
    reducing = [r["op"] for r in report.rows if report.reduce_ops[0] in r]
    out.print(cells_table(report, "each reduce op, sync", report.reduce_ops, reducing, numbers))
    taken = [d for d, cell in report.dtypes.items() if cell == OK]
    others: dict[str, list[str]] = {}
    for dtype, cell in report.dtypes.items():
        if cell != OK:
            others.setdefault(shown(cell, numbers).removeprefix("no "), []).append(dtype)
    refused = "".join(f"; not {', '.join(dtypes)} {why}" for why, dtypes in others.items())
    out.print(f"all_reduce takes {', '.join(taken)}{refused}", soft_wrap=True)
    for error, places in refusals:
        out.print(f"({numbers[error]}) {escape(error)} ({', '.join(places)})", soft_wrap=True)
    if report.backend != "nccl":
        out.print(f"unlike {NCCL_DIFFERS}", soft_wrap=True)
    out.print(f"logs: {report.run_dir}", soft_wrap=True)
