"""`trace check --follow`: an event log checked while its manager writes it.

A manager streams its events one of three ways (docs/adapter-guide.md, "Checking a log
as it is written"):

* a file it appends to: `kvpocket trace check --follow FILE` reads each line as soon as
  it is complete (a part-written last line waits for its newline), and at the end of what
  is written so far waits `POLL_S` and reads again. It ends at the end marker (the
  manager's `shutdown` writes it), or on Ctrl-C, which reports how far the check got and
  is no verdict (exit 130);
* a pipe: `manager | kvpocket trace check -` reads standard input line by line as it
  arrives and ends at end of input (without the end marker the log is truncated, as a
  file is);
* a socket: the same through a pipe (`socat -u TCP-LISTEN:9000 - | kvpocket trace check -`,
  or `nc -l 9000 | ...`), or a named pipe (`mkfifo`) read as `-`.

Each event is checked when its line is read, so a bad event is reported as soon as it is
read (the wait between reads is `POLL_S`, 50 ms). Nothing is kept per event: the checker
holds the model's state and a bounded history per location (`tracecheck.HISTORY`), so a
run of any length is checked in bounded memory.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from kvpocket.verify.traces.trace import (
    MAX_LINE_BYTES,
    EventStream,
    RawRow,
    TraceError,
    line_too_long,
    stream_rows,
)

POLL_S = 0.05  # seconds between reads at the end of a followed file
STDIN = "-"


def pause() -> None:
    """The default wait at the end of a followed file."""
    time.sleep(POLL_S)


def follow_rows(f: BinaryIO, name: str, what: str, finished: Callable[[], bool],
                wait: Callable[[], None]) -> Iterator[RawRow]:
    """The complete lines of a file being appended to, each as soon as its newline is
    written; at the end of what is there, `wait()` and read again, until `finished()`
    (the end marker was read) is true there. A line longer than MAX_LINE_BYTES is refused
    once that many bytes are read."""
    with f:
        lineno, part = 0, b""
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1 - len(part))
            if raw:
                part += raw
                if part.endswith(b"\n"):
                    lineno += 1
                    yield lineno, part
                    part = b""
                elif len(part) > MAX_LINE_BYTES:
                    raise line_too_long(f"{name}:{lineno + 1}", what)
                continue
            if finished():
                if part:  # written after the end marker: the reader reports it
                    yield lineno + 1, part
                return
            wait()


def follow_events(source: str, allow_unterminated: bool = False,
                  wait: Callable[[], None] | None = None) -> EventStream:
    """The event log at `source` read as it is written: a file followed (`follow_rows`),
    or standard input (`-`) read to its end. The header is read now (waiting for it)."""
    if source == STDIN:
        return EventStream(stream_rows(sys.stdin.buffer, "<stdin>", "event log"), "<stdin>",
                           allow_unterminated)
    path = Path(source)
    try:
        f = path.open("rb")  # closed by `follow_rows` when it ends
    except OSError as exc:
        raise TraceError(f"{source}: cannot read the event log ({exc.strerror})") from None
    holder: list[EventStream] = []

    def finished() -> bool:
        return bool(holder) and holder[0].terminated

    rows = follow_rows(f, source, "event log", finished,
                       wait or pause)
    stream = EventStream(rows, source, allow_unterminated)
    holder.append(stream)
    return stream
