"""Terminal output: tables, progress and per-node colours, all through rich, which is imported
when the first line is printed (importing labctl's modules stays cheap: `labctl.api` in a notebook,
the pytest plugin in any test session)."""

from __future__ import annotations

import os
import sys
from functools import cache
from typing import Callable

# Where a long call's progress lines go, one at a time: labctl's stderr (cli), a test's list.append,
# a notebook's print, or nowhere. The one spelling every layer takes it by.
Report = Callable[[str], None]

PIPED_WIDTH = 200  # columns for output that is not a terminal, unless COLUMNS says otherwise


def piped_width(stream, environ=None) -> int | None:
    """None on a terminal (rich asks it, or takes COLUMNS); piped or captured output (CI logs,
    tests) gets COLUMNS where it is a positive number, else PIPED_WIDTH: wide lines instead of
    rich's 80-column default, so tables are not cut to "…"."""
    if stream.isatty():
        return None
    columns = (os.environ if environ is None else environ).get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPED_WIDTH


@cache
def stdout_console():
    """rich's Console on stdout, `piped_width` wide when not on a terminal."""
    from rich.console import Console

    return Console(highlight=False, width=piped_width(sys.stdout))


@cache
def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, width=piped_width(sys.stderr))


def __getattr__(name: str):
    """`from labctl.core.ui import console, err_console`, for the renderers, which import rich anyway."""
    if name == "console":
        return stdout_console()
    if name == "err_console":
        return stderr_console()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

NODE_COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta",
                "bright_green", "bright_yellow", "bright_blue", "bright_red"]


def node_colour(index: int) -> str:
    return NODE_COLOURS[index % len(NODE_COLOURS)]


def info(message: str) -> None:
    stderr_console().print(f"[dim]•[/dim] {message}", markup=True)


def error(message: str, hint: str | None = None) -> None:
    """An error on stderr: its headline in red, then any further lines of it, then the hint.
    Messages quote torch and gloo, whose [file:line] tags rich would read as markup: escaped."""
    from rich.markup import escape

    err_console = stderr_console()
    headline, *details = message.splitlines() or [""]
    err_console.print(f"[bold red]{escape(headline)}[/bold red]", markup=True, soft_wrap=True)
    for line in details:
        err_console.print(f"  {escape(line)}", markup=True, soft_wrap=True)
    if hint:
        err_console.print(f"  [yellow]hint:[/yellow] {escape(hint)}", markup=True, soft_wrap=True)


class BuildProgress:
    """A progress bar over the Dockerfile's steps; the current step's text as its description."""

    def __init__(self, verbose: bool = False):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.verbose = verbose
        self.progress = Progress(TextColumn("[bold]build[/bold]"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.description}"), TimeElapsedColumn(), console=stderr_console(),
                                 transient=False)
        self.task = None

    def __enter__(self):
        self.progress.__enter__()
        self.task = self.progress.add_task("starting", total=None)
        return self

    def __exit__(self, *exc):
        if self.task is not None and exc[0] is None:
            total = self.progress.tasks[0].total
            self.progress.update(self.task, completed=total, description="done")
        return self.progress.__exit__(*exc)

    def step(self, n: int, total: int, text: str) -> None:
        self.progress.update(self.task, completed=n - 1, total=total, description=text[:60])

    def detail(self, line: str) -> None:
        if self.verbose:
            self.progress.console.print(f"[dim]{line}[/dim]", markup=True)
