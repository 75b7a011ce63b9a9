"""Guard combinations (`verify/conformance/guards.py`): the classifier, the table of
combinations the model allows per configuration, and that what a campaign reaches is in
that table (the filter never drops a combination the model allows)."""

from __future__ import annotations

from typing import Any

import pytest

from kvpocket.model.config import PocketPolicy
from kvpocket.verify.conformance import guards
from kvpocket.verify.conformance.fuzz import CampaignSpec, expected_rare_states, run_worker
from kvpocket.verify.conformance.lockstep import Lockstep
from kvpocket.verify.presets import PRESETS
from kvpocket.verify.quality.seeded import CONFIGS


def test_the_guarded_actions_are_the_api_tables_sequence_actions() -> None:
    assert set(guards.ACTIONS) == {"create", "resume", "resize", "commit", "stop_committing",
                                   "suspend", "close"}


def test_the_table_follows_the_model_and_the_configuration() -> None:
    tiny = PRESETS["tiny"].config
    states = guards.allowed_states(tiny)
    assert ("FREE", guards.COMMITTING, guards.EMPTY, guards.NOTHING) in states
    assert all(st[2] == guards.EMPTY for st in states if st[:2] != ("ACTIVE", guards.STOPPED))
    assert not any(st[0] in ("FREE", "CLOSED") and st[1] != (
        guards.COMMITTING if st[0] == "FREE" else guards.STOPPED) for st in states)
    assert ("ACTIVE", guards.STOPPED, guards.PARTLY, guards.WITHOUT_SLOT) in states
    assert ("ACTIVE", guards.STOPPED, guards.FULL, guards.WITH_SLOT) in states
    # a full-attention life cycle takes a GPU page per block: 10 slots hold no full pocket
    assert not any(st[2] == guards.FULL for st in guards.allowed_states(CONFIGS["sinks"]))
    pinned = guards.allowed_states(tiny.with_pocket(True, PocketPolicy.PIN))
    assert not any(st[3] == guards.WITHOUT_SLOT for st in pinned), "pin: parked pages stay"
    assert len(guards.allowed_states(tiny.with_pocket(enabled=False))) == 6
    assert len(guards.expected_guard_states(tiny)) == len(states) * len(guards.ACTIONS)
    assert set(guards.expected_guard_states(tiny)) <= set(expected_rare_states(tiny))


def test_the_label_names_the_pre_state() -> None:
    cfg = CONFIGS["wide-pocket"]
    ls = Lockstep(cfg)
    steps: list[tuple[str, dict[str, Any]]] = [
             ("create", {"seq": 0, "prompt": []}), ("resume", {"seq": 0}),
             ("stop_committing", {"seq": 0}),
             *(("resize", {"seq": 0, "capacity": h + 1, "history": h}) for h in range(4)),
             ("resize", {"seq": 0, "capacity": 10, "history": 3}),
             ("resize", {"seq": 0, "capacity": 10, "history": 9}),
             ("pressure", {"level": 0, "pool_group": 0, "slots": 7}),
             ("stop_committing", {"seq": 0}), ("resume", {"seq": 7})]
    labels = [[e for e in ls.step(a, p).events if e.startswith(guards.PREFIX)]
              for a, p in steps]
    assert labels[0] == ["guard: create | FREE | committing | pocket empty | nothing parked "
                         "| 1 window | no sinks"]
    assert labels[-2] == ["guard: stop_committing | ACTIVE | stopped | pocket full | parked "
                          "without slot | 1 window | no sinks"]
    assert labels[-1] == [], "a sequence the configuration lacks has no combination"
    assert labels[-3] == [], "pressure is not a guarded action"


@pytest.mark.slow
def test_every_combination_a_campaign_reaches_is_in_the_table(tmp_path: object) -> None:
    """The table filters only what cannot happen: a short campaign on three cells (one with
    a full-attention life cycle beside the window) reaches nothing outside it."""
    for name in ("tiny", "wide-pocket", "sinks"):
        cfg = CONFIGS[name]
        r = run_worker(CampaignSpec(name, cfg, profile="ci", examples=6, seed=3,
                                    out_dir=str(tmp_path)))
        reached = {n for n, c in r.rare_states.items() if c and n.startswith(guards.PREFIX)}
        assert len(reached) >= 10, reached
        assert reached <= set(guards.expected_guard_states(cfg)), \
            reached - set(guards.expected_guard_states(cfg))
