"""`PocketConfig.evict_parked` in the model: a parked eviction victim is dropped (its slot
released, no copy, the page left slotless in its pocket) or migrated to host.

The scenario is the park prefix of `kvpocket prove` (a page parked at GPU), then another
tenant's pressure evicts it, then the sequence's next crossing wants the pocket."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvpocket.model.config import (
    GPU_LEVEL,
    NO_SLOT,
    NONE,
    ConfigError,
    EvictParked,
    KVConfig,
    PocketConfig,
    PocketPolicy,
)
from kvpocket.model.invariants import INVARIANTS_BY_NAME
from kvpocket.model.logic import CONCRETE
from kvpocket.model.machine import Model
from kvpocket.model.pages import PAGE_ACTIONS
from kvpocket.model.state import Layout
from kvpocket.verify.presets import decode_config

PARK: list[tuple[str, dict[str, Any]]] = [
    ("create", {"seq": 0, "prompt": ()}), ("resume", {"seq": 0}),
    ("stop_committing", {"seq": 0}),
    ("resize", {"seq": 0, "capacity": 4, "history": 2}),
    ("resize", {"seq": 0, "capacity": 5, "history": 4}),  # block 0 leaves: parked
]
PRESSURE = ("pressure", {"level": 0, "pool_group": 0, "slots": 2})
CROSSING = ("resize", {"seq": 0, "capacity": 7, "history": 6})  # wants a new block


def parked_model(policy: str, evict: str) -> tuple[Model, int]:
    m = Model(decode_config(policy, evict_parked=evict))
    for action, params in PARK:
        m.run(action, params)
    parked = [p for p in m.state.pocket if p != NONE]
    assert len(parked) == 1 and m.state.level[parked[0]] == GPU_LEVEL
    assert m.violations("api") == []
    return m, parked[0]


def steps(m: Model) -> list[str]:
    return [s.action for s in m.last_steps if not s.action.startswith("set_")]


def occupied(m: Model, level: int) -> int:
    return sum(m.state.slot_owner[i] != NONE for i in m.layout.slot_range(level, 0))


# ---- configuration -----------------------------------------------------------------------

def test_default_is_drop_and_strings_are_normalised() -> None:
    assert PocketConfig().evict_parked is EvictParked.DROP
    assert KVConfig().pocket.drops_parked
    assert not PocketConfig(policy=PocketPolicy.PIN).drops_parked  # pin evicts no parked page
    cfg = KVConfig(pocket=PocketConfig(enabled=True, evict_parked="migrate"))  # type: ignore[arg-type]
    assert cfg.pocket.evict_parked is EvictParked.MIGRATE and not cfg.pocket.drops_parked


@pytest.mark.parametrize("bad", ["copy", "DROP", "", 1, None, True])
def test_bad_value_names_the_field_and_the_choices(bad: object) -> None:
    with pytest.raises(ConfigError) as err:
        KVConfig(pocket=PocketConfig(enabled=True, evict_parked=bad))  # type: ignore[arg-type]
    assert err.value.field_name == "pocket.evict_parked"
    assert err.value.allowed == "one of drop, migrate"
    assert "pocket.evict_parked" in str(err.value) and repr(bad) in str(err.value)


def test_json_round_trip_and_unknown_pocket_field() -> None:
    cfg = decode_config(evict_parked="migrate")
    data = cfg.to_json()
    assert data["pocket"]["evict_parked"] == "migrate"
    assert KVConfig.from_json(data) == cfg
    del data["pocket"]["evict_parked"]
    assert KVConfig.from_json(data).pocket.evict_parked is EvictParked.DROP  # the default
    data["pocket"]["evict_parkd"] = "migrate"  # a typo is not silently the default
    with pytest.raises(ConfigError) as err:
        KVConfig.from_json(data)
    assert err.value.field_name == "pocket.evict_parkd"


def test_with_pocket_keeps_the_setting_and_rederives_the_page_bound() -> None:
    off = decode_config(enabled=False, evict_parked="migrate")
    assert off.with_pocket(True, "unsafe").pocket.evict_parked is EvictParked.MIGRATE
    base = decode_config(enabled=False)  # 2 sequences, one SWA life cycle, 4 + 4 slots
    assert base.max_pages == 8
    # Dropped parked pages live on slotless in their pockets: one record per position.
    assert base.with_pocket(True, "revalidate").max_pages == 8 + 2 * 1 * 2
    assert base.with_pocket(True, "pin").max_pages == 8  # pin never evicts parked pages
    assert base.with_pocket(True, evict_parked="migrate").max_pages == 8
    assert replace(base, max_pages=9).with_pocket(True).max_pages == 9  # explicit: kept
    gpu_only = decode_config(slots=(4,))
    assert gpu_only.max_pages == 4  # one level: HELD pages are never evictable


# ---- the action table --------------------------------------------------------------------

@pytest.mark.parametrize("evict", ["drop", "migrate"])
def test_guards_pick_exactly_one_way_out_for_a_parked_head(evict: str) -> None:
    m, page = parked_model("revalidate", evict)
    lay = m.layout
    assert m.state.queued[page]  # HELD above the last level: the queue head
    free_host = next(i for i in range(lay.slots_at(1))
                     if m.state.slot_owner[lay.slot_ix(CONCRETE, 1, 0, i)] == NONE)

    def enabled(name: str, **params: int) -> bool:
        conds = PAGE_ACTIONS[name].guard(CONCRETE, lay, m.state, params)
        return all(ok for _, ok in conds)

    assert enabled("drop_parked", page=page) == (evict == "drop")
    assert enabled("evict_begin", page=page, dst_slot=free_host) == (evict == "migrate")


# ---- API behaviour -----------------------------------------------------------------------

def test_drop_releases_the_gpu_slot_without_a_copy() -> None:
    m, page = parked_model("revalidate", "drop")
    slot, gpu_before, host_before = m.state.slot[page], occupied(m, 0), occupied(m, 1)
    assert m.run(*PRESSURE).value is True
    assert steps(m) == ["drop_parked"]
    s = m.state
    assert s.alive[page] and page in s.pocket  # still parked, HELD by its pocket entry
    assert s.slot[page] == NO_SLOT and s.level[page] == GPU_LEVEL and not s.queued[page]
    assert s.slot_owner[m.layout.slot_ix(CONCRETE, 0, 0, slot)] == NONE
    assert occupied(m, 0) == gpu_before - 1 and occupied(m, 1) == host_before  # no copy
    assert m.violations("api") == []


def test_migrate_copies_the_parked_page_to_host() -> None:
    m, page = parked_model("revalidate", "migrate")
    host_before = occupied(m, 1)
    assert m.run(*PRESSURE).value is True
    assert steps(m) == ["evict_begin", "migrate_complete"]
    assert m.state.level[page] == 1 and m.state.slot[page] != NO_SLOT and page in m.state.pocket
    assert occupied(m, 1) == host_before + 1
    assert m.violations("api") == []


@pytest.mark.parametrize("evict", ["drop", "migrate"])
def test_revalidate_refuses_the_evicted_parked_page(evict: str) -> None:
    m, _ = parked_model("revalidate", evict)
    m.run(*PRESSURE)
    assert m.run(*CROSSING).value is True
    assert "drain" in steps(m) and "pop" not in steps(m) and "allocate" in steps(m)
    drained = next(s.params for s in m.last_steps if s.action == "drain")
    assert (drained["seq"], drained["lc"], drained["k"]) == (0, 0, 0)  # the evicted entry
    s = m.state
    assert all(s.level[p] == GPU_LEVEL and s.slot[p] != NO_SLOT for p in s.pocket if p != NONE)
    assert m.violations("api") == [] and not s.bad_pop


@pytest.mark.parametrize("evict", ["drop", "migrate"])
def test_unsafe_pops_the_evicted_parked_page_and_is_caught(evict: str) -> None:
    m, _ = parked_model("unsafe", evict)
    m.run(*PRESSURE)
    assert m.violations("api") == []  # the eviction itself is fine...
    m.run(*CROSSING)
    assert "pop" in steps(m)  # ...the pop that does not re-check is the hazard
    broken = {i.name for i in m.violations("api")}
    assert "popped_slots_valid" in broken and m.state.bad_pop


@pytest.mark.parametrize("evict", ["drop", "migrate"])
def test_pin_never_evicts_a_parked_page(evict: str) -> None:
    m, page = parked_model("pin", evict)
    assert not m.state.queued[page]
    assert m.run(*PRESSURE).value is False  # nothing else to evict: OutOfPages
    assert m.run(*CROSSING).value is True and "pop" in steps(m)
    assert m.violations("api") == []


# ---- the invariants that admit the slotless parked page stay sharp -------------------------

def test_a_slotless_page_outside_a_pocket_is_still_a_violation() -> None:
    m, page = parked_model("revalidate", "drop")
    m.run(*PRESSURE)
    lay, s = m.layout, m.state
    inv = INVARIANTS_BY_NAME["live_pages_have_slots"]
    assert inv.predicate(CONCRETE, lay, s)
    unparked = replace(s, pocket=tuple(NONE if x == page else x for x in s.pocket))
    assert not inv.predicate(CONCRETE, lay, unparked)
    migrate_lay = Layout(m.cfg.with_pocket(True, evict_parked="migrate"))
    assert not inv.predicate(CONCRETE, migrate_lay, s)  # no slotless page under migrate
    queue = INVARIANTS_BY_NAME["queue_follows_evictability"]
    assert queue.predicate(CONCRETE, lay, s)
    assert not queue.predicate(CONCRETE, lay, replace(
        s, queued=tuple(q or p == page for p, q in enumerate(s.queued))))


def test_policy_is_parsed_before_the_page_bound_is_derived() -> None:
    cfg = KVConfig(pocket=PocketConfig(enabled=True, policy="pin"),  # type: ignore[arg-type]
                   slots_per_level=(4, 4))
    assert cfg.pocket.policy is PocketPolicy.PIN and cfg.max_pages == 8
