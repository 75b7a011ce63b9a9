"""Induction proofs, CTIs, traces and the prove runner's option handling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpocket.model.state import Layout
from kvpocket.verify.proofs.obligations import PROVED, VIOLATED, check_consecution, prove_config
from kvpocket.verify.proofs.prove import PROVE_CONFIGS, run_prove
from kvpocket.verify.traces.trace import (
    Trace,
    TraceError,
    TraceStep,
    read_trace,
    replay_on_model,
    write_trace,
)


@pytest.mark.parametrize("policy", ["revalidate", "pin"])
@pytest.mark.slow
def test_step_invariants_are_inductive(policy: str) -> None:
    lay = Layout(PROVE_CONFIGS["gpu-host"].config.with_pocket(True, policy))
    outcomes = prove_config(lay, f"gpu-host/{policy}")
    assert [o.obligation for o in outcomes if o.status != PROVED] == []
    assert len(outcomes) > 20


def test_unsafe_pop_has_a_readable_cti() -> None:
    lay = Layout(PROVE_CONFIGS["gpu-host"].config.with_pocket(True, "unsafe"))
    [out] = check_consecution(lay, "gpu-host/unsafe", actions=["pop"])
    assert out.status == VIOLATED and out.cti is not None
    # Z3 may pick any counterexample: each breaks one of the pop-safety invariants.
    hazards = {"popped_slots_valid": "bad_pop", "no_unsynced_reuse": "unsynced_reuse"}
    broken = [name for name in hazards if name in out.cti.broken]
    assert broken, out.cti.broken
    text = out.cti.render(lay)
    assert "action: pop(" in text
    assert any(f"{hazards[name]}: False -> True" in text for name in broken), text


SCENARIO = [
    TraceStep("create", {"seq": 0, "prompt": []}),
    TraceStep("resume", {"seq": 0}),
    TraceStep("stop_committing", {"seq": 0}),
    TraceStep("resize", {"seq": 0, "capacity": 4, "history": 2}),
    TraceStep("resize", {"seq": 0, "capacity": 4, "history": 4}),
    TraceStep("pressure", {"level": 0, "pool_group": 0, "slots": 1}, choices=[("victim", 0)]),
    TraceStep("resize", {"seq": 0, "capacity": 6, "history": 4}),
]


@pytest.mark.parametrize(("policy", "expect"), [("unsafe", 6), ("revalidate", -1), ("pin", -1)])
def test_migration_during_park_trace_replays(tmp_path: Path, policy: str, expect: int) -> None:
    cfg = PROVE_CONFIGS["gpu-host"].config.with_pocket(True, policy)
    steps = SCENARIO if policy != "pin" else [  # pinned: pressure finds no victim to choose
        TraceStep(s.action, s.params) for s in SCENARIO]
    path = write_trace(tmp_path / "t.jsonl", Trace(cfg, steps, "test", policy))
    trace = read_trace(path)
    assert trace.config == cfg and len(trace.steps) == len(SCENARIO)
    step, broken = replay_on_model(trace)
    assert step == expect
    if policy == "unsafe":
        assert "popped_slots_valid" in broken


def test_read_trace_names_the_bad_line(tmp_path: Path) -> None:
    cfg = PROVE_CONFIGS["gpu"].config
    path = write_trace(tmp_path / "t.jsonl", Trace(cfg, SCENARIO[:2]))
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(TraceError, match=r"t.jsonl:5: invalid JSON"):
        read_trace(path)
    path.write_text(json.dumps({"kvpocket_trace": 1, "config": cfg.to_json()}) + "\n"
                    + json.dumps({"action": "resume"}) + "\n")
    with pytest.raises(TraceError, match=r":2: missing field 'params'"):
        read_trace(path)


def test_prove_rejects_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_prove("nope", None, 0, None, str(tmp_path)) == 2
    assert "--config" in capsys.readouterr().err
    assert run_prove(None, "yolo", 0, None, str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "--policy" in err and "revalidate" in err


@pytest.mark.slow
def test_prove_unsafe_reports_a_violation(tmp_path: Path) -> None:
    js = tmp_path / "r.json"
    assert run_prove("gpu", "unsafe", 0, str(js), str(tmp_path)) == 1
    data = json.loads(js.read_text())
    rows = {r["obligation"]: r["status"] for r in data["obligations"]}
    assert rows["consecution:pop"] == "violated" and rows["init"] == "proved"
    assert {"config", "obligation", "status", "seconds"} <= set(data["obligations"][0])
