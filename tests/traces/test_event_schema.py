"""The event-line schema (`verify/traces/schema.py`) agrees with the reference reading.

The schema is a fast second reading of the rules `trace._event` and `_Framing.line`
state. On every line of every log the repository holds (the lockstep regressions of
`verify/regressions`, whose API lines are event lines and whose page-layer lines both
readings refuse, and the event log in the docs), on every line of logs the implementation
writes, and on many malformed variants of them, both readings must take the same lines
and build equal events; a line the reference refuses must never be taken by the schema."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpocket.verify.presets import preset
from kvpocket.verify.traces.record import record
from kvpocket.verify.traces.trace import (
    END_KEY,
    EVENTS_KIND,
    TraceError,
    open_events,
    parse_events,
    reference_event,
    schema_event,
)

ROOT = Path(__file__).resolve().parents[2]
# where the repository keeps files (a log written under any of them is found)
SOURCE_DIRS = ("model", "impl", "verify", "tests", "docs", "scripts")

LOGS = [("tiny", "revalidate", 0), ("offset", "pin", 1), ("three-level", "revalidate", 2),
        ("split-pools", "pin", 3), ("sinks", "pin", 4), ("gpu-only", "revalidate", 5),
        ("two-level", "revalidate", 6)]
# values a field is replaced by in the malformed variants: other types, out-of-range
# integers, near-miss shapes
ODD_VALUES: list[Any] = ["x", "copy", True, None, 1.5, 2**63, -(2**63) - 1, 2**63 - 1, -1,
                         [], [0, 0], [0, 0, 0], [[0, 0, 0]], {}, {"error": "capacity"},
                         {"error": "nope"}, ["slot", 1], "ACTIVE", "stop"]


def _recorded(tmp_path: Path) -> list[Path]:
    out = []
    for name, policy, seed in LOGS:
        path = tmp_path / f"{name}-{seed}.ndjson"
        record(preset(name).with_pocket(True, policy), 80, seed, path)
        out.append(path)
    return out


def _event_lines(path: Path) -> list[str]:
    return path.read_text().splitlines()[1:-1]


def _reference(text: str, lineno: int = 2, name: str = "event log") -> Any:
    try:
        return reference_event(lineno, text, name)
    except TraceError:
        return None


def _committed_logs() -> dict[str, list[str]]:
    """Every log the repository holds, by its path, as its lines: the `.jsonl` and
    `.ndjson` files (lockstep traces and event logs), and each block of the docs whose
    first line is a whole trace or event-log header (the adapter guide's minimal log)."""
    logs: dict[str, list[str]] = {}
    for top in SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in (".jsonl", ".ndjson") and path.is_file():
                logs[str(path.relative_to(ROOT))] = path.read_text().splitlines()
    for doc in sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]):
        blocks = re.findall(r"```[a-z]*\n(.*?)```", doc.read_text(), flags=re.DOTALL)
        for i, block in enumerate(blocks):
            lines = block.splitlines()
            if lines and _header(lines[0]) is not None:
                logs[f"{doc.relative_to(ROOT)}#block{i}"] = lines
    return logs


def _header(text: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and "kvpocket_trace" in obj else None


COMMITTED = _committed_logs()


def _same(a: Any, b: Any) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and a == b)


def _variants(obj: Any, rng: random.Random) -> Iterator[Any]:
    """`obj` with one change: a key dropped or added, a value replaced (at any depth)."""
    if isinstance(obj, dict):
        for k in list(obj):
            yield {x: v for x, v in obj.items() if x != k}
            for v in rng.sample(ODD_VALUES, 4):
                yield {**obj, k: v}
            for sub in _variants(obj[k], rng):
                yield {**obj, k: sub}
        yield {**obj, "extra": 1}
    elif isinstance(obj, list):
        for i in range(min(len(obj), 3)):
            for v in rng.sample(ODD_VALUES, 3):
                yield [*obj[:i], v, *obj[i + 1:]]
            for sub in _variants(obj[i], rng):
                yield [*obj[:i], sub, *obj[i + 1:]]
        yield [*obj, obj[0] if obj else 0]


def test_both_readings_take_every_recorded_line_alike(tmp_path: Path) -> None:
    lines = [ln for p in _recorded(tmp_path) for ln in _event_lines(p)]
    assert len(lines) > 300
    for text in lines:
        ref = _reference(text)
        assert ref is not None, text  # the implementation writes valid logs
        assert schema_event(2, (text + "\n").encode()) == ref, text


def test_the_committed_logs_are_found() -> None:
    regressions = {n for n in COMMITTED if n.startswith("verify/regressions/")}
    assert len(regressions) >= 10
    assert any(n.startswith("docs/adapter-guide.md#") for n in COMMITTED)
    verdicts = [_reference(text) is None for lines in COMMITTED.values() for text in lines[1:-1]]
    assert verdicts.count(False) > 300 and verdicts.count(True) > 0  # taken and refused lines


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_both_readings_agree_on_every_committed_log(name: str) -> None:
    """Line by line, the same verdict (taken or refused) and, where taken, equal events
    (their line numbers included); so a log's first refused line is the same too. An
    event log is also read whole, schema first as `trace check` reads it, and must give
    the events that the reference reading of each line gives."""
    lines = COMMITTED[name]
    header = _header(lines[0])
    assert header is not None
    body = lines[1:-1] if END_KEY in lines[-1] else lines[1:]
    taken: list[Any] = []
    for lineno, text in enumerate(body, start=2):
        ref = _reference(text, lineno, name)
        fast = schema_event(lineno, (text + "\n").encode())
        assert _same(fast, ref), f"{name}:{lineno}: schema {fast}, reference {ref}"
        taken.append(ref)
    if header.get("kind") == EVENTS_KIND:
        assert None not in taken  # a committed event log is valid: every line is an event
        assert parse_events(lines, name, allow_unterminated=False).events == taken


def test_the_schema_never_takes_a_line_the_reference_refuses(tmp_path: Path) -> None:
    rng = random.Random(0)
    lines = [ln for p in _recorded(tmp_path)[:3] for ln in _event_lines(p)]
    # one line of each action, with choices, results and observed fields among them
    seen: dict[tuple[str, frozenset[str]], str] = {}
    for text in lines:
        obj = json.loads(text)
        seen.setdefault((obj["action"], frozenset(obj)), text)
    refused = taken = 0
    for text in seen.values():
        for variant in _variants(json.loads(text), rng):
            line = json.dumps(variant)
            ref, fast = _reference(line), schema_event(2, (line + "\n").encode())
            assert _same(fast, ref), f"{line}: schema {fast}, reference {ref}"
            refused += ref is None
            taken += ref is not None
    assert refused > 200 and taken > 20  # the corpus has both kinds


@pytest.mark.parametrize("line", [
    '{"action": "resume", "params": {"seq": 1}, "choices": [["slot", true]]}',
    '{"action": "resume", "params": {"seq": 1}, "choices": [["below", 1]]}',
    '{"action": "commit", "params": {"seq": 1, "tokens": [1, 9223372036854775808]}}',
    '{"action": "resume", "params": {"seq": 1}, "layer": "page"}',
    '{"action": "advance", "params": {"stream": "copy2"}}',
    '{"action": "resume", "params": {"seq": -1}}',
    '{"action": "resume", "params": {"seq": 1.0}}',
    '{"action": "resume", "params": {"seq": 1}, "observed": {"free": [[0, 0]]}}',
    '{"action": "resume", "params": {"seq": 1}, "result": {"error": "capacity", "x": 1}}',
    '{"action": "commit", "params": {"seq": 1, "tokens": [NaN]}}',
])
def test_refused_alike_and_named_by_the_reference(line: str) -> None:
    assert schema_event(2, (line + "\n").encode()) is None
    with pytest.raises(TraceError, match=r"^log:2: "):
        parse_events([json.dumps({"kvpocket_trace": 1, "kind": "events",
                                  "config": preset("tiny").to_json()}), line], "log")


def test_a_stream_reads_the_same_events_through_either_reading(tmp_path: Path) -> None:
    path = _recorded(tmp_path)[0]
    fast = list(open_events(path))
    assert fast == [reference_event(i + 2, t) for i, t in enumerate(_event_lines(path))]
