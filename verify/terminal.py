"""Progress lines on stderr, shared by the campaign runners and the command line."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


def progress_line(out: Console, show: bool) -> Any:
    """One transient progress line: spinner, description, elapsed time, live stats."""
    return Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), TimeElapsedColumn(),
                    TextColumn("{task.fields[stats]}"), console=out, transient=True,
                    disable=not show)


def progress_console(show: bool) -> tuple[Console, bool]:
    """Progress goes to stderr, and only to a terminal: a log file or a pipe gets the
    final report, not a progress line cut at 80 columns."""
    err = Console(stderr=True, highlight=False)
    return err, show and err.is_terminal
