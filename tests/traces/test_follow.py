"""`trace check --follow FILE` and `trace check -`: a log checked while it is written.

The writer is a thread appending to a file in pieces cut at arbitrary bytes (lines are
split across pieces); the follower's wait between reads is the handshake that lets the
writer append its next piece, so every verdict here counts pieces, never time."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvpocket.verify.cli.commands import main
from kvpocket.verify.presets import preset
from kvpocket.verify.traces import follow as follow_mod
from kvpocket.verify.traces.follow import follow_events
from kvpocket.verify.traces.record import record
from kvpocket.verify.traces.trace import END_KEY, Event, with_end_marker
from kvpocket.verify.traces.tracecheck import check_events

ROOT = Path(__file__).resolve().parents[2]
PIECE = 997  # bytes per append: not a multiple of any line's length


class PieceWriter(threading.Thread):
    """Appends `data` to `path` one piece per `step()` (the follower's wait)."""

    def __init__(self, path: Path, data: bytes) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.pieces = [data[i:i + PIECE] for i in range(0, len(data), PIECE)]
        self.written = 0
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        path.write_bytes(b"")

    def run(self) -> None:
        with self.path.open("ab") as f:
            for piece in self.pieces:
                self._go.acquire()
                f.write(piece)
                f.flush()
                self.written += 1
                self._done.release()

    def step(self) -> None:
        if self.written == len(self.pieces):
            raise AssertionError("the follower waited after the whole log was written")
        self._go.release()
        assert self._done.acquire(timeout=600), "the writer thread stopped"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / ".devpath")}


def _recorded(tmp_path: Path, steps: int = 300) -> bytes:
    path = tmp_path / "whole.ndjson"
    record(preset("tiny").with_pocket(True, "revalidate"), steps, 0, path)
    return path.read_bytes()


def test_a_followed_log_is_checked_as_it_is_written(tmp_path: Path) -> None:
    data = _recorded(tmp_path)
    writer = PieceWriter(tmp_path / "live.ndjson", data)
    writer.start()
    verdict = check_events(follow_events(str(writer.path), wait=writer.step))
    events = data.count(b"\n") - 2
    assert verdict.ok, verdict.report
    assert verdict.events == events
    assert writer.written == len(writer.pieces) > 10  # it read every piece, as appended


def test_a_bad_event_is_reported_when_its_line_is_read(tmp_path: Path) -> None:
    lines = _recorded(tmp_path).decode().splitlines()[:-1]
    bad = len(lines) // 3
    row = json.loads(lines[bad])
    row["result"] = {"error": "capacity"} if row.get("result") is not None else True
    lines[bad] = json.dumps(row)
    data = ("\n".join(with_end_marker(lines)) + "\n").encode()
    writer = PieceWriter(tmp_path / "live.ndjson", data)
    writer.start()
    verdict = check_events(follow_events(str(writer.path), wait=writer.step))
    assert not verdict.ok and verdict.line == bad + 1
    # the pieces written when the verdict came: up to the one that completes the bad line
    end_of_bad = len("\n".join(lines[:bad + 1]).encode()) + 1
    assert writer.written == -(-end_of_bad // PIECE)
    while writer.written < len(writer.pieces):  # let the thread finish
        writer.step()


def test_following_keeps_no_event(tmp_path: Path) -> None:
    data = _recorded(tmp_path, 600)
    writer = PieceWriter(tmp_path / "live.ndjson", data)
    writer.start()
    stream = follow_events(str(writer.path), wait=writer.step)
    verdict = check_events(stream)
    assert verdict.ok and verdict.events > 1000
    gc.collect()
    assert sum(isinstance(o, Event) for o in gc.get_objects()) <= 1


def test_ctrl_c_while_following_is_no_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    lines = _recorded(tmp_path).decode().splitlines()[:-1]  # no end marker yet
    live = tmp_path / "live.ndjson"
    live.write_text("\n".join(lines[:40]) + "\n")
    waits: list[int] = []

    def interrupted() -> None:
        waits.append(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(follow_mod, "pause", interrupted)
    assert main(["trace", "check", "--follow", str(live)]) == 130
    err = capsys.readouterr().err
    assert "interrupted at line 40: no verdict (39 events read" in err
    assert len(waits) == 1  # it waited at the end of what was written


def test_a_followed_log_ends_at_its_end_marker(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    live = tmp_path / "live.ndjson"
    live.write_bytes(_recorded(tmp_path))
    assert END_KEY in live.read_text().splitlines()[-1]

    def never() -> None:
        raise AssertionError("waited after the end marker")

    monkeypatch.setattr(follow_mod, "pause", never)
    assert main(["trace", "check", "--follow", str(live)]) == 0
    assert "events valid" in capsys.readouterr().out


def test_a_pipe_from_a_running_recorder(tmp_path: Path) -> None:
    """`trace record --out - | trace check -`: two processes, the log streamed between."""
    env = _env()
    rec = subprocess.Popen([sys.executable, "-m", "kvpocket", "trace", "record", "--config",
                            "tiny", "--steps", "200", "--out", "-"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, env=env)
    check = subprocess.run([sys.executable, "-m", "kvpocket", "trace", "check", "-"],
                           stdin=rec.stdout, capture_output=True, text=True, env=env)
    assert rec.stdout is not None
    rec.stdout.close()
    assert rec.wait() == 0
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith("-: ") and "events valid" in check.stdout


def test_a_pipe_cut_short_is_truncated(tmp_path: Path) -> None:
    data = _recorded(tmp_path).decode().splitlines()[:-1]
    env = _env()
    check = subprocess.run([sys.executable, "-m", "kvpocket", "trace", "check", "-"],
                           input="\n".join(data) + "\n", capture_output=True, text=True,
                           env=env)
    assert check.returncode == 2
    assert "truncated: no end marker" in check.stderr and "Traceback" not in check.stderr
