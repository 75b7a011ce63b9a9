"""`PocketConfig.evict_parked` in the implementation: an evicted parked page is dropped (its
GPU slot released, no device-to-host copy, the page left slotless in its pocket until the
pop refuses it) or migrated to host; the lockstep stays exact for both, and the unsafe pop
of either is caught."""

from __future__ import annotations

from typing import Any

import pytest
from impl_helpers import assert_clean, decoder, swa_config

from kvpocket.impl import KVCacheManager
from kvpocket.model.config import GPU_LEVEL, NO_SLOT
from kvpocket.verify.conformance.lockstep import Divergence, Lockstep
from kvpocket.verify.oracles.data import DecodeOracle
from kvpocket.verify.presets import decode_config


def page_record(mgr: KVCacheManager, pid: int) -> dict[str, Any]:
    return next(p for p in mgr.snapshot()["pages"] if p["id"] == pid)


def evict_parked_scenario(mgr: KVCacheManager) -> tuple[DecodeOracle, Any, Any, int]:
    """A parks a page; B's growth needs 3 GPU slots with 2 free, so the cascade evicts the
    parked page (the queue head). Returns (oracle, A, B, the parked page id)."""
    oracle = DecodeOracle(mgr)
    a = decoder(mgr, 0)
    for _ in range(5):  # h = 0..4: block 0 is parked at h = 4
        assert oracle.decode_step(a)
    parked = a.pocket_pages(0)
    assert len(parked) == 1
    b = decoder(mgr, 1)
    assert b.resize(6, 2)
    return oracle, a, b, parked[0]


@pytest.mark.parametrize("policy", ["revalidate", "unsafe"])
def test_drop_releases_the_gpu_slot_and_copies_nothing(make_mgr: Any, policy: str) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(5, 4), pocket=True, policy=policy,
                              evict_parked="drop"))
    host = mgr.storage.allocs[1][0]
    _, a, _, pid = evict_parked_scenario(mgr)
    choices = mgr.last_choices()
    assert ("evict", 0, 0, pid) in choices and ("drop_parked", 0, pid) in choices
    assert not [c for c in choices if c[0] == "migrate"]  # no device-to-host copy at all
    assert host.num_free == host.capacity  # the host tier was not touched
    rec = page_record(mgr, pid)
    assert (rec["level"], rec["slot"], rec["status"], rec["queued"]) == (
        GPU_LEVEL, NO_SLOT, "HELD", False)
    assert a.pocket_pages(0) == [pid]  # still parked, slotless, until the pop refuses it
    assert mgr.counters_of(1).drops == 1 and mgr.counters_of(1).migrations == 0
    assert_clean(mgr)  # the slotless parked page is the one allowed exception


def test_migrate_copies_the_parked_page_to_host(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(5, 4), pocket=True, evict_parked="migrate"))
    host = mgr.storage.allocs[1][0]
    _, a, _, pid = evict_parked_scenario(mgr)
    assert ("migrate", pid, 0, 1, 0) in mgr.last_choices()
    assert not [c for c in mgr.last_choices() if c[0] == "drop_parked"]
    assert host.num_free == host.capacity - 1
    assert page_record(mgr, pid)["level"] == 1 and a.pocket_pages(0) == [pid]
    assert_clean(mgr)


def test_revalidate_refuses_the_dropped_page_and_nothing_leaks(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(5, 4), pocket=True, evict_parked="drop"))
    oracle, a, b, pid = evict_parked_scenario(mgr)
    oracle.prefill(b, [oracle.token_for(1, p) for p in range(3)])
    assert oracle.decode_step(a)  # h = 5: no crossing
    assert oracle.decode_step(a)  # h = 6: crossing; the pocket is consulted
    choices = mgr.last_choices()
    assert ("refuse", 0, 0, pid) in choices and "pop" not in [c[0] for c in choices]
    assert pid not in mgr.storage.pages  # the refusal released the last reference
    assert oracle.decode_step(b) and oracle.decode_step(b)
    assert oracle.check() == [] and oracle.missing == []
    assert_clean(mgr)
    a.close()
    b.close()
    assert not mgr.shutdown()


def test_unsafe_pop_of_a_dropped_page_maps_no_slot(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(5, 4), pocket=True, policy="unsafe",
                              evict_parked="drop"))
    oracle, a, _, pid = evict_parked_scenario(mgr)
    assert oracle.decode_step(a, verify=False)
    assert a.resize(8, 6)  # the crossing pops the slotless page without re-checking
    assert ("pop", 0, 0, pid) in mgr.last_choices()
    assert a.block_table(0)[3] == NO_SLOT  # an in-window block mapped to no slot
    assert any("live page without a slot" in v for v in mgr.check_invariants())


def test_selfcheck_still_flags_a_slotless_page_that_is_not_parked(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(5, 4), pocket=True, evict_parked="drop"))
    _, a, _, pid = evict_parked_scenario(mgr)
    assert_clean(mgr)
    page = mgr.storage.pages[pid]
    page.pocket_owner = None  # pretend the pocket forgot it: now it is a leak
    assert any(f"page {pid}: live page without a slot" in v for v in mgr.check_invariants())
    page.pocket_owner = a.seq_id
    mgr.storage.queues[0][0].entries[pid] = (page.priority, -1)  # and queued: not allowed
    assert any("dropped parked page (no slot) is queued" in v for v in mgr.check_invariants())


# ---- the lockstep: both settings, every policy -----------------------------------------------

TRACE: list[tuple[str, dict[str, Any]]] = [
    ("create", {"seq": 0, "prompt": []}), ("resume", {"seq": 0}),
    ("stop_committing", {"seq": 0}),
    ("resize", {"seq": 0, "capacity": 4, "history": 2}),
    ("resize", {"seq": 0, "capacity": 5, "history": 4}),  # block 0 parked
    ("pressure", {"level": 0, "pool_group": 0, "slots": 2}),  # the parked page is evicted
    ("resize", {"seq": 0, "capacity": 7, "history": 6}),  # the crossing consults the pocket
]


@pytest.mark.parametrize("evict", ["drop", "migrate"])
def test_lockstep_agrees_and_revalidate_refuses(evict: str) -> None:
    ls = Lockstep(decode_config("revalidate", evict_parked=evict))
    events = [e for action, params in TRACE for e in ls.step(action, params).events]
    ls.finish()
    evicted = "parked page dropped" if evict == "drop" else "parked page migrated"
    other = "parked page migrated" if evict == "drop" else "parked page dropped"
    assert evicted in events and other not in events
    assert "pop refused" in events


@pytest.mark.parametrize("evict", ["drop", "migrate"])
def test_lockstep_catches_the_unsafe_pop(evict: str) -> None:
    ls = Lockstep(decode_config("unsafe", evict_parked=evict))
    for action, params in TRACE[:-1]:
        ls.step(action, params)  # up to the eviction, both sides agree and nothing breaks
    with pytest.raises(Divergence) as err:
        ls.step(*TRACE[-1])
    assert err.value.kind == "model invariant violated"
    assert any(line.startswith("popped_slots_valid") for line in err.value.lines)
