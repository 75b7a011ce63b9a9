"""The one console and the one progress component every command prints through.

`console()`: on a terminal, the terminal's width; piped or redirected (a log file, `| less`,
CI), no width limit, so a table is as wide as its content and never cut at 80 columns
(`COLUMNS` set by the caller still wins).

`Progress`: a status line on stderr for work that can take longer than a few seconds. On a
terminal it is a `rich.progress` live line; off one it is plain lines (no carriage-return
redraws) at most one every `PLAIN_EVERY_S` seconds, so a log file shows the run is alive
without filling up. The most telling field goes first in `stats` (fuzz: failures), so a
narrow terminal cuts the least telling one.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

PIPED_WIDTH = 10_000  # "no limit": a piped table is as wide as its widest row
PLAIN_EVERY_S = 10.0  # piped progress: at most one line this often
LIVE_EVERY_S = 0.2  # terminal: at most this many redraws of the live line


def console(stderr: bool = False) -> Console:
    """The console for a command's output (stdout, or stderr with `stderr`)."""
    # rich at run time only: `kvpocket --help` imports this module and prints no table
    from rich.console import Console

    probe = Console(stderr=stderr)
    width = None if probe.is_terminal or os.environ.get("COLUMNS") else PIPED_WIDTH
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


class Progress:
    """One progress display for one piece of work: `update(stats)` as it goes, `note(line)`
    for a line that stays (a phase begins or ends). Silent when `show` is False. `out` (a
    console on stderr by default) decides between the live line and plain lines.

    Plain lines: the first figures at once, then the latest ones at most every
    `plain_every_s` seconds, printed by a timer thread, so figures from a step that then
    runs for minutes still show; with `final_line`, the last figures once at the end."""

    def __init__(self, what: str, show: bool = True, out: Console | None = None,
                 plain_every_s: float = PLAIN_EVERY_S, live: bool | None = None,
                 final_line: bool = True) -> None:
        self.what, self.show, self.final_line = what, show, final_line
        self.out = out or console(stderr=True)
        # `live=False`: plain lines even on a terminal (several processes share stderr)
        self.live = self.out.is_terminal if live is None else live and self.out.is_terminal
        self.plain_every_s = plain_every_s
        self.stats = self.shown = ""
        self.start = self.last = 0.0
        self._bar: Any = None
        self._task: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None

    def __enter__(self) -> Progress:
        self.start = time.monotonic()
        self.last = -float("inf")
        if self.show and self.live:
            # rich.progress at run time only: `kvpocket --help` never loads it
            from rich.progress import Progress as Bar
            from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

            self._bar = Bar(SpinnerColumn(), TextColumn("[bold]{task.description}", markup=False),
                            TimeElapsedColumn(), TextColumn("{task.fields[stats]}", markup=False),
                            console=self.out, transient=True)
            self._task = self._bar.add_task(self.what, total=None, stats="")
            self._bar.__enter__()
        elif self.show:
            self._timer = threading.Thread(target=self._tick, daemon=True,
                                           name=f"progress {self.what}")
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
            self._timer = None
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None
        elif self.show and self.final_line and self.stats != self.shown:  # the last figures
            self._plain(f"{self.stats} (done)")

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def update(self, stats: str, force: bool = False) -> None:
        """New live statistics, shown at a bounded rate (`force`: now, on a terminal)."""
        self.stats = stats
        if not self.show:
            return
        if self._bar is not None:
            now = time.monotonic()
            if force or now - self.last >= LIVE_EVERY_S:
                self.last = now
                self._bar.update(self._task, stats=stats)
            return
        self._flush(time.monotonic())

    def note(self, line: str) -> None:
        """A line that stays on screen above the live line (or a plain line)."""
        if not self.show:
            return
        if self._bar is not None:
            self._bar.console.print(f"{self.what}: {line}", markup=False, highlight=False)
        else:
            self._plain(line)

    def _flush(self, now: float) -> None:
        """Print the latest figures if they are new and the last print is old enough."""
        with self._lock:
            if self.stats == self.shown or now - self.last < self.plain_every_s:
                return
            self.last, self.shown = now, self.stats
            self._plain(self.stats)

    def _tick(self) -> None:
        while not self._stop.wait(min(1.0, self.plain_every_s)):
            self._flush(time.monotonic())

    def _plain(self, text: str) -> None:
        self.out.print(f"{self.what}: {text} [{self.elapsed():.0f} s]", markup=False,
                       highlight=False, soft_wrap=True)
