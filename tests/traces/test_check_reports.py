"""What `kvpocket trace check` says about an independent manager's log: an illegal choice
is named as such (with why, and the history of its own location), the lru profile
explains a pop of a newer entry, and the verdict counts what it checked in the right words."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvpocket.verify.presets import preset
from kvpocket.verify.traces import tracecheck
from kvpocket.verify.traces.record import record
from kvpocket.verify.traces.trace import parse_events, with_end_marker
from kvpocket.verify.traces.tracecheck import EventChecker, check_events


def _header(name: str = "tiny", **config: object) -> str:
    return json.dumps({"kvpocket_trace": 1, "kind": "events",
                       "config": {**preset(name).to_json(), **config}})


def _check(lines: list[str]) -> tracecheck.TraceVerdict:
    return check_events(parse_events(with_end_marker(lines)))


def test_a_locked_victim_is_an_illegal_choice_not_a_different_result() -> None:
    """Every GPU page is LOCKED, so the model finds no victim and runs out; the log's
    victim is what is wrong, and the report shows that slot's history."""
    log = [_header(),
           '{"action": "create", "params": {"seq": 7, "prompt": []}, "result": null}',
           '{"action": "resume", "params": {"seq": 7}, "result": true}',
           '{"action": "resize", "params": {"seq": 7, "capacity": 8, "history": 0}, '
           '"choices": [["slot", 0], ["slot", 1], ["slot", 2], ["slot", 3]], "result": true}',
           '{"action": "pressure", "params": {"level": 0, "pool_group": 0, "slots": 1}, '
           '"choices": [["victim", [0, 0, 1]]], "result": true}']
    v = _check(log)
    assert not v.ok and v.line == 5
    assert v.kind == "the model rejects the log's choice", v.report
    assert "the log chose victim [0, 0, 1]" in v.report
    assert "the page at [0, 0, 1] in the model is LOCKED" in v.report
    history = v.report.split("history of the locations involved ([0, 0, 1];")[1]
    assert "line 4: resize" in history and "allocate [0, 0, 1]" in history


def _lru_pop_of_a_newer_entry(tmp_path: Path) -> list[str]:
    """A recorded wide-pocket log (order=lru) with one pop's choice changed to the newer
    of two parked pages that both still have a slot."""
    path = tmp_path / "wide.ndjson"
    record(preset("wide-pocket"), 1500, 0, path)
    lines = [ln for ln in path.read_text().splitlines() if "kvpocket_end" not in ln]
    header = json.loads(lines[0])
    header["config"]["order"] = "lru"
    lines[0] = json.dumps(header)
    log = parse_events(with_end_marker(lines))
    ck = EventChecker(log.config)
    for n, ev in enumerate(log.events, 1):
        pk = [i for i, c in enumerate(ev.choices or []) if c[0] == "pocket"]
        q = ck.slot_of.get(ev.params.get("seq", -1))
        if pk and q is not None:
            s = ck.model.state
            where = [ck._where(s, p) for p in ck._pocket(s, q, 0)]
            if len(where) >= 2 and all(w[2] >= 0 for w in where):
                raw: dict[str, Any] = json.loads(lines[ev.line - 1])
                raw["choices"][pk[0]][1] = list(where[1])
                return [*lines[:ev.line - 1], json.dumps(raw)]
        assert ck.check(ev, n) is None
    raise AssertionError("no pop from a pocket of two slotted entries in the log")


def test_lru_explains_a_pop_of_a_newer_entry(tmp_path: Path) -> None:
    v = _check(_lru_pop_of_a_newer_entry(tmp_path))
    assert v.kind == "the model rejects the log's choice"
    assert "not the oldest entry of its pocket (order=lru pops the oldest" in v.report


def test_the_verdict_counts_in_the_right_words() -> None:
    one = _check([_header(), '{"action": "create", "params": {"seq": 7, "prompt": []}}'])
    assert one.ok and one.summary().startswith("1 event valid under order=any;")
    assert "1 event logged no choices" in one.summary()
    log = [_header(), '{"action": "create", "params": {"seq": 7, "prompt": []}}',
           '{"action": "advance", "params": {"stream": "copy"}}',
           '{"action": "fail_copy", "params": {}}']
    v = _check(log)
    assert v.ok, v.report
    text = v.summary()
    assert text.startswith("3 events valid under order=any (of them 1 stream completion, "
                           "1 injected fault, which make no choices)"), text
    assert "1 event logged no choices" in text and "3 events logged" not in text
