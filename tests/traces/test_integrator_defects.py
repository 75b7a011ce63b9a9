"""The defects a manager written from the docs alone found in `kvpocket trace check`
(issue 21), each pinned: pressure's meaning, a verdict that counts what it compared,
reasons and history in every rejection, slotless parked pages in reports, the closed set
of error categories, `advance` of a stream nobody created."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvpocket.impl import CorruptionWarning
from kvpocket.impl.manager import KVCacheManager
from kvpocket.verify.cli.commands import main
from kvpocket.verify.presets import preset
from kvpocket.verify.traces.record import record
from kvpocket.verify.traces.trace import (
    END_KEY,
    ERROR_CATEGORIES,
    TraceError,
    parse_events,
    read_events,
    with_end_marker,
)
from kvpocket.verify.traces.tracecheck import TraceVerdict, check_events

HEADER: dict[str, Any] = {"kvpocket_trace": 1, "kind": "events",
                          "config": preset("tiny").to_json()}


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert END_KEY in rows[-1]
    return rows[:-1]


def _check_rows(rows: list[dict[str, Any]]) -> TraceVerdict:
    return check_events(parse_events(with_end_marker(json.dumps(r) for r in rows)))


def _suspended_then_pressed(path: Path) -> list[dict[str, Any]]:
    """kvpocket's manager: one sequence with two blocks, suspended (both pages queued),
    then pressure asks for all four GPU slots free: two victims migrate to host."""
    with path.open("w") as out:
        mgr = KVCacheManager(preset("tiny"), event_log=out)
        kv = mgr.create(1, [])
        assert kv.resume()
        assert kv.resize(4, 3)
        kv.suspend()
        assert mgr.pressure(0, 0, 4)
        mgr.shutdown()
    return _rows(path)


def test_pressure_logs_the_free_slots_to_reach(tmp_path: Path) -> None:
    """`slots` is the number of free slots eviction must reach (a watermark, another
    tenant's request), as the model reads it and the guide says; logging the number
    freed instead is reported with that explanation."""
    rows = _suspended_then_pressed(tmp_path / "pressure.ndjson")
    press = rows[-1]
    assert press["action"] == "pressure" and press["params"]["slots"] == 4
    assert [c[0] for c in press["choices"]].count("victim") == 2
    assert _check_rows(rows).ok
    freed = [*rows[:-1], {**press, "params": {**press["params"], "slots": 2}}]
    result = _check_rows(freed)
    assert result.kind == "the log records choices the model does not make", result.report
    assert "pressure's slots (2) is the number of free slots to reach, not the number " \
           "freed: 2 were free before the event" in result.report


def test_a_different_result_names_the_reason_and_history(tmp_path: Path) -> None:
    rows = _suspended_then_pressed(tmp_path / "pressure.ndjson")
    press = rows[-1]
    # the manager claims it could not make room; the model could, and says how
    claimed = [*rows[:-1], {**press, "result": False}]
    result = _check_rows(claimed)
    assert result.kind == "different result", result.report
    assert "the model evicted 2 pages" in result.report
    assert "evict_begin [0, 0, 0] [1, 0, 0]" in result.report
    assert "history of the locations involved" in result.report
    # pressure on a sequence whose pages are all locked: the model runs out, and says where
    locked = [*rows[:4], {"action": "pressure", "params": {"level": 0, "pool_group": 0,
                                                           "slots": 4}, "result": True}]
    result = _check_rows(locked)
    assert result.kind == "different result", result.report
    assert "it ran out: no evictable page at level 0, pool group 0" in result.report


def test_the_verdict_counts_what_it_compared() -> None:
    bare = [HEADER, {"action": "create", "params": {"seq": 1, "prompt": []}},
            {"action": "resume", "params": {"seq": 1}},
            {"action": "resize", "params": {"seq": 1, "capacity": 4, "history": 3}}]
    result = _check_rows(bare)
    assert result.ok and result.compared == dict.fromkeys(result.compared, 0)
    text = result.summary()
    assert "0 logged choices legal and used; 0 results" in text
    assert "no observed state was logged" in text
    full = [HEADER, {"action": "create", "params": {"seq": 1, "prompt": []}, "choices": [],
                     "result": None},
            {"action": "resume", "params": {"seq": 1}, "choices": [], "result": True},
            {"action": "resize", "params": {"seq": 1, "capacity": 4, "history": 3},
             "choices": [["slot", 0], ["slot", 1]], "result": True,
             "observed": {"free": [[0, 0, 2], [1, 0, 4]], "status": "ACTIVE",
                          "index": [[0, 1]], "pocket": [[]]}}]
    result = _check_rows(full)
    assert result.ok, result.report
    assert result.compared == {"choices": 2, "results": 3, "free": 2, "status": 1,
                               "index": 1, "pocket": 1}
    assert "2 logged choices legal and used; 3 results" in result.summary()
    assert "no observed state" not in result.summary()


def test_error_categories_are_the_models_five() -> None:
    assert ERROR_CATEGORIES == ("capacity", "commit", "history_decrease", "sequence_state",
                                "unknown_sequence")
    line = {"action": "resume", "params": {"seq": 1}, "result": {"error": "OutOfPagesError"}}
    with pytest.raises(TraceError, match="unknown error category 'OutOfPagesError'; "
                       "expected one of capacity, commit"):
        parse_events([json.dumps(HEADER), json.dumps(line)], "log")


@pytest.mark.parametrize(("result", "ok"), [
    ({}, False), ({"result": None}, False), ({"result": {"error": "unknown_sequence"}}, True)])
def test_advance_of_a_stream_never_created(result: dict[str, Any], ok: bool) -> None:
    rows = [HEADER, {"action": "create", "params": {"seq": 1, "prompt": []}},
            {"action": "advance", "params": {"stream": 5}, **result}]
    verdict = _check_rows(rows)
    assert verdict.ok is ok, verdict.report
    if not ok:
        assert verdict.line == 3 and verdict.kind == "different result"
        assert "stream 5 is no created sequence's id" in verdict.report


def test_a_closed_sequences_stream_may_still_complete() -> None:
    """Its last GPU work may outlive the close: `advance` of a closed id is accepted."""
    rows = [HEADER, {"action": "create", "params": {"seq": 1, "prompt": []}},
            {"action": "close", "params": {"seq": 1}},
            {"action": "advance", "params": {"stream": 1}, "result": None}]
    assert _check_rows(rows).ok


def _first_slotless_pop(rows: list[dict[str, Any]]) -> int:
    return next(i + 1 for i, r in enumerate(rows) if i > 0
                and any(c[0] == "pocket" and c[1][2] == -1 for c in r["choices"]))


def test_a_dropped_parked_page_keeps_its_history(tmp_path: Path) -> None:
    """Under unsafe + evict_parked=drop a pop takes a parked page whose slot was dropped:
    the report files the pop under the slot the page had, with the drop in its history
    (the migrate variant's report shows its migration the same way)."""
    cfg = preset("tiny").with_pocket(True, "unsafe", evict_parked="drop")
    for seed in range(30):
        path = tmp_path / f"drop-{seed}.ndjson"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CorruptionWarning)
            record(cfg, 150, seed, path)
        rows = _rows(path)
        try:
            line = _first_slotless_pop(rows)
        except StopIteration:
            continue
        result = check_events(read_events(path), name=str(path))
        assert not result.ok and result.line == line, result.report
        assert "(the page has no slot: it was dropped there)" in result.report
        assert "drop_parked" in result.report.split("history of the locations", 1)[1]
        return
    raise AssertionError("no pop of a dropped parked page in 30 seeds")


def test_cli_order_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "log.ndjson"
    assert main(["trace", "record", "--config", "tiny", "--steps", "40", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["trace", "check", str(out), "--order", "lru"]) == 0
    assert "events valid under order=lru" in capsys.readouterr().out
    assert main(["trace", "check", str(out), "--order", "mru"]) == 2
    err = capsys.readouterr().err
    assert "--order" in err and "one of any, lru" in err and "Traceback" not in err


def test_a_log_too_vague_to_follow_is_a_usage_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without choices or observed state, both queued pages may have been the victim: two
    model states fit. Beyond the checker's bound that is exit 2 asking for choices, not a
    verdict."""
    from kvpocket.verify.traces import tracecheck

    rows = _suspended_then_pressed(tmp_path / "pressure.ndjson")
    vague = [rows[0], *({k: v for k, v in r.items() if k not in ("choices", "observed")}
                        for r in rows[1:])]
    vague[-1]["params"] = {**vague[-1]["params"], "slots": 3}  # one victim of two
    result = _check_rows(vague)
    assert result.ok and result.ambiguous == 1, result.report
    monkeypatch.setattr(tracecheck, "MAX_STATES", 1)
    with pytest.raises(tracecheck.TooVague, match="2 model states fit the log so far"):
        _check_rows(vague)
    path = tmp_path / "vague.ndjson"
    path.write_text("\n".join(with_end_marker(json.dumps(r) for r in vague)) + "\n")
    assert main(["trace", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "log the events' \"choices\"" in err and "Traceback" not in err


def test_a_report_at_real_geometry_stays_short() -> None:
    """At 100,000 slots a missing slot choice has 100,000 legal slots: the report names them
    as runs and counts them, on a short line, instead of listing every one."""
    cfg = replace(preset("tiny"), slots_per_level=(100_000, 100_000), max_pages=0)
    rows: list[dict[str, Any]] = [
        {"kvpocket_trace": 1, "kind": "events", "config": cfg.to_json()},
        {"action": "create", "params": {"seq": 1, "prompt": []}, "choices": []},
        {"action": "resume", "params": {"seq": 1}, "choices": [], "result": True},
        {"action": "resize", "params": {"seq": 1, "capacity": 2, "history": 1},
         "choices": [], "result": True}]
    v = _check_rows(rows)
    assert not v.ok and v.line == 4 and v.kind == "the log lacks a choice the model makes"
    assert "legal: [0..99999] (100000 in all)" in v.report, v.report
    assert max(len(line) for line in v.report.splitlines()) < 300
