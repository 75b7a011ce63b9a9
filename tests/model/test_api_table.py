"""One API table (`model.api.API`): every engine derives its alphabet from it, `Model.run`
gives the atomic-call semantics, and one chooser replays recorded choices for all."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from kvpocket.impl.manager import KVCacheManager
from kvpocket.model import api
from kvpocket.model.api import API, ApiAction, Param
from kvpocket.model.errors import CapacityError, ChoiceRejected, MissingChoice
from kvpocket.model.executor import CHOICE_KINDS, Executor, RecordedChooser
from kvpocket.model.machine import Model
from kvpocket.model.spec import spec_json
from kvpocket.verify.conformance.lockstep import Lockstep
from kvpocket.verify.presets import preset
from kvpocket.verify.proofs.bounded import api_instances
from kvpocket.verify.traces.alphabet import alphabet, api_form, check_params
from kvpocket.verify.traces.trace import parse_events, parse_trace
from kvpocket.verify.traces.tracecheck import check_events


def _toy(ex: Executor, level: int) -> None:
    """A toy environment action: a level must exist; nothing changes."""
    ex.require(0 <= level < ex.lay.cfg.num_levels,
               CapacityError(f"toy: no level {level}"))


TOY = ApiAction("toy", "env", (Param("level", "level"),), _toy, False, ("capacity",),
                "the level exists")


def test_a_toy_action_appears_in_every_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(API, "toy", TOY)
    cfg = preset("tiny")
    header = json.dumps({"kvpocket_trace": 1, "config": cfg.to_json()})
    # The executable model.
    m = Model(cfg)
    assert m.run("toy", {"level": 1}).error is None
    bad = m.run("toy", {"level": 7}).error
    assert bad is not None and bad.category == "capacity"
    # The trace format and the lockstep's alphabet.
    assert "toy" in alphabet()
    check_params("toy", {"level": 0})
    with pytest.raises(ValueError, match="level"):
        check_params("toy", {})
    trace = parse_trace([header, json.dumps({"action": "toy", "params": {"level": 0}})])
    assert trace.steps[0].action == "toy"
    # The spec's tables.
    assert any(a["name"] == "toy" for a in spec_json(cfg)["actions"])
    # BMC's alphabet: one instance per level.
    assert [i.args for i in api_instances(cfg) if i.name == "toy"] == [{"level": 0}, {"level": 1}]
    # The lockstep: the implementation's method of the same name is called.
    calls: list[int] = []
    monkeypatch.setattr(KVCacheManager, "toy", lambda self, level: calls.append(level),
                        raising=False)
    ls = Lockstep(cfg)
    ls.step("toy", {"level": 1})
    assert calls == [1]
    # The implementation's event log wraps it, and the trace checker checks the log.
    out = io.StringIO()
    mgr = KVCacheManager(cfg, event_log=out)
    mgr.toy(0)  # type: ignore[attr-defined]
    lines = out.getvalue().splitlines()
    assert json.loads(lines[-1])["action"] == "toy"
    assert json.loads(lines[-1])["params"] == {"level": 0}
    result = check_events(parse_events(lines))
    assert result.ok and result.events == 1, result.report


def test_every_action_has_a_documented_kind_and_program() -> None:
    for name, a in API.items():
        assert a.name == name and a.layer in ("api", "env")
        assert a.doc, f"{name}: its program has no docstring"
        for p in a.params:
            assert p.kind in api.PARAM_KINDS, (name, p)
        assert set(a.errors) <= {"unknown_sequence", "sequence_state", "history_decrease",
                                 "capacity", "commit"}


def test_run_is_atomic() -> None:
    m = Model(preset("tiny"))
    before = m.state
    r = m.run("resize", {"seq": 0, "capacity": 2, "history": 0})
    assert r.error is not None and r.error.category == "unknown_sequence"
    assert m.state == before
    m.create(0)
    assert m.resume(0)
    m.fail_allocation()
    armed = m.state
    r = m.run("resize", {"seq": 0, "capacity": 2, "history": 0})
    assert r.value is False and r.failed
    assert m.state == type(armed)(**{**armed.__dict__, "fault_alloc": False}), \
        "rolled back exactly, the fault consumed"
    assert m.run("resize", {"seq": 0, "capacity": 2, "history": 0}).value is True


def test_recorded_chooser_policies() -> None:
    labels: list[object] = [(0, 0, 3), (0, 0, 5)]
    by_label = RecordedChooser({"victim": [(0, 0, 5)]})
    assert by_label.choose("victim", [7, 9], labels) == 9
    assert by_label.choose("page", [4, 6], [4, 6]) == 4, "page records are the model's own"
    noted = RecordedChooser({"slot": []}, on_missing="note")
    assert noted.choose("slot", [2, 3], [2, 3]) == 2 and noted.unmatched
    with pytest.raises(MissingChoice):
        RecordedChooser({"slot": []}, on_missing="raise").choose("slot", [2], [2])
    with pytest.raises(ChoiceRejected):
        RecordedChooser({"victim": [(1, 0, 0)]}).choose("victim", [7, 9], labels)
    by_id = RecordedChooser({"page": [6]}, by="candidate")
    assert by_id.choose("page", [4, 6], [4, 6]) == 6
    assert RecordedChooser(None).choose("slot", [5, 1], [5, 1]) == 5
    left = RecordedChooser({"slot": [1, 2], "pocket": []})
    left.choose("slot", [1], [1])
    assert left.left() == {"slot": [2]}
    assert set(CHOICE_KINDS) == {"slot", "victim", "pocket", "clash", "hit", "reuse"}


def test_one_validator_reads_both_forms_of_the_table() -> None:
    """Traces name commit's tokens by count, event logs carry them; one validator reads
    either form, and only an event log may name the copy stream "copy"."""
    check_params("commit", {"seq": 0, "n": 2})
    with pytest.raises(ValueError, match="takes parameters"):
        check_params("commit", {"seq": 0, "tokens": [1]})
    events = api_form()
    check_params("commit", {"seq": 0, "tokens": [1, 2]}, events, events=True)
    with pytest.raises(ValueError, match="carry the committed"):
        check_params("commit", {"seq": 0, "n": 2}, events, events=True)
    check_params("advance", {"stream": "copy"}, events, events=True)
    with pytest.raises(ValueError, match="must be an int"):
        check_params("advance", {"stream": "copy"})
    with pytest.raises(ValueError, match="list of ints"):
        check_params("create", {"seq": 0, "prompt": [True]}, events, events=True)


def test_one_table_of_choice_kinds_read_by_every_engine() -> None:
    """`model/choices.py` is the one list: every kind the API programs pick is in it, every
    kind in it is picked somewhere, and the executors, the event-log format and the trace
    checker read it rather than lists of their own."""
    import ast

    from kvpocket.model import choices
    from kvpocket.verify.traces import schema, trace, tracecheck

    api_source = ast.parse((Path(__file__).resolve().parents[2] / "model" / "api.py").read_text())
    picked: set[str] = set()
    for node in ast.walk(api_source):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "choose" and node.args):
            first = node.args[0]
            if isinstance(first, ast.Constant):
                picked.add(str(first.value))
            else:
                assert isinstance(first, ast.Name), ast.dump(first)
                picked.add(str(getattr(choices, first.id)))
    assert picked == set(choices.CHOICES)
    assert CHOICE_KINDS is choices.RECORDED and trace.CHOICE_KINDS is choices.RECORDED
    assert set(tracecheck.FREE_KINDS) == set(choices.OPEN) - {choices.SLOT}
    assert tracecheck.DEFAULTED_KINDS is choices.DEFAULTED
    assert all(choices.CHOICES[k].open for k in choices.DEFAULTED)
    # the event-log schema types every recorded kind's label, and only those
    assert schema.LOCATION_KINDS | schema.INT_KINDS | {choices.CLASH} == set(choices.RECORDED)
