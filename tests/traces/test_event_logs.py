"""Event logs: the implementation's logs validate against the model; doctored logs are
caught at the right line; malformed files are usage errors with a line number."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from kvpocket.impl import CorruptionWarning
from kvpocket.impl.eventlog import error_category
from kvpocket.impl.manager import KVCacheManager
from kvpocket.verify.cli.commands import main
from kvpocket.verify.presets import preset
from kvpocket.verify.traces.record import record
from kvpocket.verify.traces.trace import (
    END_KEY,
    TraceError,
    parse_events,
    read_events,
    with_end_marker,
)
from kvpocket.verify.traces.tracecheck import EventChecker, TraceVerdict, check_events

VALID = [("tiny", "revalidate"), ("tiny", "pin"), ("offset", "revalidate"), ("offset", "pin"),
         ("three-level", "revalidate"), ("split-pools", "pin"), ("two-level", "revalidate"),
         ("sinks", "pin"), ("gpu-only", "revalidate")]


def _record(tmp_path: Path, name: str, policy: str, seed: int = 0, steps: int = 150) -> Path:
    path = tmp_path / f"{name}-{policy}-{seed}.ndjson"
    record(preset(name).with_pocket(True, policy), steps, seed, path)
    return path


def _rows(path: Path) -> list[dict[str, Any]]:
    """The header and event rows (the end marker left out)."""
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert END_KEY in rows[-1], "a recorded log ends with its end marker"
    return rows[:-1]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Rows as a log file, ended by a correct end marker (a doctored log that is still
    well-formed: what the checker must catch is in the events)."""
    path.write_text("\n".join(with_end_marker(json.dumps(r) for r in rows)) + "\n")
    return path


def _check(path: Path, policy: str | None = None) -> TraceVerdict:
    log = read_events(path)
    cfg = log.config if policy is None else log.config.with_pocket(True, policy)
    return check_events(log, cfg, str(path))


# ---- real runs -------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "policy"), VALID, ids=[f"{n}-{p}" for n, p in VALID])
def test_recorded_logs_validate(tmp_path: Path, name: str, policy: str) -> None:
    for seed in (0, 1):
        path = _record(tmp_path, name, policy, seed)
        result = _check(path)
        assert result.ok, result.report
        assert result.events > 100


def test_recording_is_deterministic(tmp_path: Path) -> None:
    a = _record(tmp_path / "a", "tiny", "revalidate", seed=3)
    b = _record(tmp_path / "b", "tiny", "revalidate", seed=3)
    assert a.read_text() == b.read_text()


def test_recorded_logs_exercise_the_pocket(tmp_path: Path) -> None:
    rows = _rows(_record(tmp_path, "tiny", "revalidate", steps=300))
    kinds = {c[0] for r in rows[1:] for c in r["choices"]}
    assert kinds == {"slot", "victim", "pocket"}
    assert any(isinstance(r.get("result"), dict) for r in rows[1:])  # misuse is logged
    assert any(r["action"] == "advance" for r in rows[1:])


def test_every_usage_error_has_a_model_category() -> None:
    """Usage errors carry the model's category (one table for the event log and the
    lockstep); capacity failures and internal errors carry none."""
    from kvpocket.impl import exceptions as e
    from kvpocket.model import errors as model_errors

    model_categories = {c.category for c in vars(model_errors).values()
                        if isinstance(c, type) and issubclass(c, model_errors.UsageError)}
    usage = [e.UnknownSequenceError, e.DuplicateSequenceError, e.SequenceClosedError,
             e.SequenceStateError, e.HistoryDecreaseError, e.CapacityError,
             e.CommitNotAllowedError, e.UnknownLevelError]
    for cls in usage:
        assert cls.category in model_categories, cls
        assert error_category(cls("x")) == cls.category
    for other in (e.OutOfPagesError, e.CopyFailedError, e.DoubleReleaseError, e.SimulatorError):
        assert other.category is None, other


def test_manager_writes_to_a_text_stream(tmp_path: Path) -> None:
    with (tmp_path / "log.ndjson").open("w") as out:
        mgr = KVCacheManager(preset("tiny"), event_log=out)
        kv = mgr.create(7, [])
        resumed = kv.resume()
        assert getattr(resumed, "ok", resumed) is True  # a bool, or a typed result
        kv.resize(4, 3)
        with pytest.raises(Exception):  # noqa: B017 (history may not decrease)
            kv.resize(4, 1)
        with pytest.raises(TraceError, match=r"log.ndjson:5: the event log is truncated"):
            read_events(tmp_path / "log.ndjson")  # not ended yet: no end marker
        mgr.shutdown()  # writes the end marker
    rows = _rows(tmp_path / "log.ndjson")
    assert rows[0]["kind"] == "events"
    assert [r["action"] for r in rows[1:]] == ["create", "resume", "resize", "resize"]
    assert rows[-1]["result"] == {"error": "history_decrease"}
    assert rows[3]["choices"] == [["slot", 0], ["slot", 1]]
    assert _check(tmp_path / "log.ndjson").ok


# ---- doctored logs ---------------------------------------------------------------------


def _line_of(rows: list[dict[str, Any]], pred: Any) -> int:
    """1-based line number of the first event row satisfying pred."""
    return next(i + 1 for i, r in enumerate(rows) if i > 0 and pred(r))


def test_a_removed_event_is_caught(tmp_path: Path) -> None:
    rows = _rows(_record(tmp_path, "tiny", "revalidate"))
    # Remove the second sequence's create: its next event is the one reported.
    creates = [i for i, r in enumerate(rows)
               if i > 0 and r["action"] == "create" and r["result"] is None]
    k = creates[1]
    seq = rows[k]["params"]["seq"]
    doctored = rows[:k] + rows[k + 1:]
    want = _line_of(doctored, lambda r: r["params"].get("seq") == seq)
    result = _check(_write(tmp_path / "removed.ndjson", doctored))
    assert not result.ok and result.line == want
    assert "different result" in result.report and "unknown_sequence" in result.report


def test_a_changed_slot_id_is_caught(tmp_path: Path) -> None:
    path = _record(tmp_path, "tiny", "revalidate")
    rows = _rows(path)
    k = _line_of(rows, lambda r: any(c[0] == "slot" for c in r["choices"])) - 1
    # The slot must be one that is occupied just before this event: ask the model.
    log = read_events(path)
    checker = EventChecker(log.config)
    for ev in log.events[: k - 1]:
        checker.step(ev)
    s, lay = checker.model.state, checker.model.layout
    occupied = [i for i in range(lay.slots_at(0)) if s.slot_owner[i] != -1]
    taken = next(c for c in rows[k]["choices"] if c[0] == "slot")
    if occupied:
        taken[1] = occupied[0]
    else:
        taken[1] = 999
    result = _check(_write(tmp_path / "slot.ndjson", rows))
    assert not result.ok and result.line == k + 1, result.report
    assert result.kind == "the model rejects the log's choice"
    assert f"line {k + 1}" not in result.report.split("history", 1)[-1]  # only earlier events


def _first_unsafe_pop(rows: list[dict[str, Any]]) -> int:
    return _line_of(rows, lambda r: any(c[0] == "pocket" and c[1][0] != 0
                                        for c in r["choices"]))


def _unsafe_log(tmp_path: Path) -> Path:
    """A recorded log in which a parked page migrated to host and was then popped (the
    hazard needs parked victims to migrate, not be dropped)."""
    cfg = preset("tiny").with_pocket(True, "unsafe", evict_parked="migrate")
    for seed in range(20):
        path = tmp_path / f"unsafe-migrate-{seed}.ndjson"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CorruptionWarning)
            record(cfg, 150, seed, path)
        rows = _rows(path)
        try:
            _first_unsafe_pop(rows)
        except StopIteration:
            continue
        # The implementation noticed the aliasing it was driven into, and said so.
        assert any(issubclass(w.category, CorruptionWarning) for w in caught)
        return path
    raise AssertionError("no migration-during-park pop in 20 seeds")


def test_migration_during_park_is_caught_under_its_own_policy(tmp_path: Path) -> None:
    path = _unsafe_log(tmp_path)
    want = _first_unsafe_pop(_rows(path))
    result = _check(path)
    assert not result.ok and result.line == want, result.report
    assert "popped_slots_valid" in result.report
    assert "evict_begin" in result.report  # the history shows the migration


def test_migration_during_park_is_caught_under_revalidate(tmp_path: Path) -> None:
    path = _unsafe_log(tmp_path)
    want = _first_unsafe_pop(_rows(path))
    result = _check(path, "revalidate")
    assert not result.ok and result.line == want, result.report
    assert "drain" in result.report  # the model refuses the moved entry


def test_an_edited_pop_label_is_caught(tmp_path: Path) -> None:
    rows = _rows(_record(tmp_path, "tiny", "revalidate"))
    line = _line_of(rows, lambda r: any(c[0] == "pocket" for c in r["choices"]))
    pop = next(c for c in rows[line - 1]["choices"] if c[0] == "pocket")
    pop[1] = [1, 0, 3]  # a host slot: no pocket entry sits there
    result = _check(_write(tmp_path / "pop.ndjson", rows))
    assert not result.ok and result.line == line
    assert "pocket [1, 0, 3]" in result.report


def test_a_changed_result_and_observation_are_caught(tmp_path: Path) -> None:
    rows = _rows(_record(tmp_path, "tiny", "revalidate"))
    line = _line_of(rows, lambda r: r["action"] == "resize" and r["result"] is True)
    bad = [dict(r) for r in rows]
    bad[line - 1] = {**bad[line - 1], "result": False}
    result = _check(_write(tmp_path / "result.ndjson", bad))
    assert not result.ok and result.line == line and result.kind == "different result"
    obs = dict(rows[line - 1]["observed"])
    obs["free"] = [[lv, g, n + 1] for lv, g, n in obs["free"]]
    bad = [dict(r) for r in rows]
    bad[line - 1] = {**bad[line - 1], "observed": obs}
    result = _check(_write(tmp_path / "observed.ndjson", bad))
    assert not result.ok and result.line == line
    assert "observed post-state differs" in result.report


def test_a_hand_written_log_without_choices(tmp_path: Path) -> None:
    """An integrator may log only actions and results; the model then picks."""
    header = {"kvpocket_trace": 1, "kind": "events", "config": preset("tiny").to_json()}
    rows: list[dict[str, Any]] = [header,
            {"action": "create", "params": {"seq": 42, "prompt": []}},
            {"action": "resume", "params": {"seq": 42}, "result": True},
            {"action": "resize", "params": {"seq": 42, "capacity": 4, "history": 3},
             "result": True, "observed": {"index": [[0, 1]]}},
            {"action": "commit", "params": {"seq": 42, "tokens": [1, 0]}, "result": None},
            {"action": "advance", "params": {"stream": "copy"}},
            {"action": "suspend", "params": {"seq": 9}, "result": {"error": "unknown_sequence"}},
            {"action": "close", "params": {"seq": 42}},
            {"action": "create", "params": {"seq": 42, "prompt": []},
             "result": {"error": "sequence_state"}}]
    result = _check(_write(tmp_path / "hand.ndjson", rows))
    assert result.ok, result.report
    assert result.events == 8


# ---- malformed files -------------------------------------------------------------------


HEADER = json.dumps({"kvpocket_trace": 1, "kind": "events",
                     "config": preset("tiny").to_json()})


@pytest.mark.parametrize(("lines", "needle"), [
    ([HEADER, '{"action": "resize", "params": {'], ":2: invalid JSON"),
    ([HEADER, '{"action": "create", "params": {"seq": 1, "prompt": []}}', "[1, 2]"],
     ":3: expected a JSON object"),
    ([HEADER, '{"action": "grow", "params": {}}'], ":2: unknown action 'grow'"),
    ([HEADER, '{"action": "commit", "params": {"seq": 1, "n": 2}}'], "carry the committed"),
    ([HEADER, '{"action": "resume", "params": {"seq": 1}, "choices": [["slot", [0, 0, 1]]]}'],
     ":2: a slot choice's label is a slot id"),
    ([HEADER, '{"action": "resume", "params": {"seq": 1}, "result": "yes"}'], ":2: \"result\""),
    ([HEADER, '{"action": "resume", "params": {"seq": 1}, "observed": {"slots": 1}}'],
     ":2: unknown observed field"),
    (['{"hello": 1}'], ":1: not a kvpocket trace header"),
    ([], "the event log is empty"),
])
def test_malformed_logs_name_the_line(lines: list[str], needle: str) -> None:
    with pytest.raises(TraceError, match=None) as exc:
        parse_events(lines, "log")
    assert needle in str(exc.value)


def test_header_only_is_a_valid_empty_log() -> None:
    assert check_events(parse_events([HEADER])).ok


def test_cli_exit_statuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.ndjson"
    assert main(["trace", "record", "--config", "tiny", "--steps", "60", "--seed", "1",
                 "--out", str(out)]) == 0
    assert main(["trace", "check", str(out)]) == 0
    assert "events valid" in capsys.readouterr().out
    unsafe = _unsafe_log(tmp_path)
    assert main(["trace", "check", str(unsafe), "--policy", "revalidate"]) == 1
    report = capsys.readouterr().out
    assert f"{unsafe}:{_first_unsafe_pop(_rows(unsafe))}:" in report
    truncated = tmp_path / "truncated.ndjson"
    truncated.write_text(out.read_text()[:-20])
    assert main(["trace", "check", str(truncated)]) == 2
    err = capsys.readouterr().err
    assert "truncated" in err and "Traceback" not in err
    (tmp_path / "empty.ndjson").write_text("")
    assert main(["trace", "check", str(tmp_path / "empty.ndjson")]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["trace", "check", str(tmp_path / "missing.ndjson")]) == 2
    assert main(["trace"]) == 2
    assert main(["trace", "record", "--steps", "0", "--out", str(out)]) == 2
    assert main(["trace", "check", str(out), "--config", "nope"]) == 2


def test_a_long_recording_keeps_a_bounded_number_of_handles(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import random

    from kvpocket.verify.traces import record as rec

    monkeypatch.setattr(rec, "KEPT_SEQUENCES", 4)
    mgr = KVCacheManager(preset("tiny"), backend="numpy", slot_elems=8,
                         backend_options={"eager": False}, event_log=io.StringIO())
    w = rec.Workload(mgr, random.Random(0))
    created = 0
    for _ in range(600):
        before = w.next_id
        w.step()
        created += w.next_id - before
    assert created > 10  # many sequences came and went
    assert len(w.seqs) <= max(4, len(w._open()))


def test_trace_check_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`trace check --json OUT`: the verdict, the events checked, the first bad event's line
    and reason, for a valid, an invalid and a malformed log."""
    log = _record(tmp_path, "tiny", "revalidate")
    js = tmp_path / "verdict.json"
    assert main(["trace", "check", str(log), "--json", str(js)]) == 0
    data = json.loads(js.read_text())
    assert data["verdict"] == "valid" and data["file"] == str(log)
    assert data["events_checked"] == len(_rows(log)) - 1 and data["first_bad_event"] is None
    assert data["compared"]["choices"] > 0
    capsys.readouterr()
    rows = _rows(log)
    line = _line_of(rows, lambda r: r["action"] == "resize" and r["result"] is True)
    rows[line - 1] = {**rows[line - 1], "result": False}
    bad = _write(tmp_path / "bad.ndjson", rows)
    assert main(["trace", "check", str(bad), "--json", str(js)]) == 1
    data = json.loads(js.read_text())
    assert data["verdict"] == "invalid" and data["events_checked"] == line - 1
    first = data["first_bad_event"]
    assert first["line"] == line and first["reason"] == "different result"
    assert first["report"][0].startswith(f"{bad}:{line}: ")
    assert capsys.readouterr().out.splitlines()[0] == first["report"][0]  # the text report too
    cut = tmp_path / "cut.ndjson"
    cut.write_text(log.read_text()[:-20])
    assert main(["trace", "check", str(cut), "--json", str(js)]) == 2
    data = json.loads(js.read_text())
    assert data["verdict"] == "malformed" and "truncated" in data["error"]
    assert main(["trace", "check", str(log), "--json", str(js / "x.json")]) == 2  # under a file
    assert "--json" in capsys.readouterr().err
