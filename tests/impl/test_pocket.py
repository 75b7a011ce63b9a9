"""The SWA reuse pocket: steady state, revalidation under migration, the unsafe bug, pin."""

from __future__ import annotations

from typing import Any

import pytest
from impl_helpers import assert_clean, decoder, swa_config

from kvpocket.impl import CorruptionWarning, KVCacheManager, LeakError, SlotRef
from kvpocket.impl.undo import Choice
from kvpocket.model.config import SeqStatus
from kvpocket.verify.oracles.data import DecodeOracle


@pytest.mark.parametrize("pocket", [False, True])
def test_steady_state_allocator_traffic(make_mgr: Any, pocket: bool) -> None:
    mgr = make_mgr(swa_config(window=5, slots=(8, 8), pocket=pocket))
    oracle = DecodeOracle(mgr)
    kv = decoder(mgr, 0)
    for _ in range(12):  # warm-up
        assert oracle.decode_step(kv)
    slots: set[int] = set()
    crossings = 0
    for _ in range(24):
        before = mgr.counters_of(0)
        nb = kv.num_blocks
        assert oracle.decode_step(kv)
        after = mgr.counters_of(0)
        if kv.num_blocks != nb:
            crossings += 1
            if pocket:
                assert (after.alloc_calls, after.releases) == (before.alloc_calls,
                                                               before.releases)
                assert after.pocket_pops == before.pocket_pops + 1
            else:
                assert after.alloc_calls == before.alloc_calls + 1
                assert after.releases == before.releases + 1
        _s, e = kv.stale_range(0)
        slots |= set(kv.block_table(0)[e:])
    assert crossings == 12
    if pocket:
        assert len(slots) == 4  # 3 in-window blocks + 1 parked, in rotation
    assert oracle.check() == [] and oracle.missing == []
    assert_clean(mgr)


def _migration_scenario(mgr: KVCacheManager) -> tuple[DecodeOracle, Any, Any, list[Choice]]:
    """A parks a page; B's growth evicts it to host (`evict_parked="migrate"`); B writes;
    A's next crossing pops. Returns the choices of A's crossing too."""
    oracle = DecodeOracle(mgr)
    a = decoder(mgr, 0)
    for _ in range(5):  # h = 0..4: block 0 is parked at h = 4
        assert oracle.decode_step(a)
    parked = a.pocket_pages(0)
    assert len(parked) == 1
    entry = a.pocket_entries(0)[0]
    assert (entry.page_id, entry.level, entry.valid) == (parked[0], 0, True)
    b = decoder(mgr, 1)
    assert b.resize(6, 2)  # needs 3 GPU slots, 2 free: the parked page migrates to host
    assert ("migrate", parked[0], 0, 1, 0) in mgr.last_choices()
    moved = a.pocket_entries(0)[0]  # still parked, now at host: its GPU slot is gone
    assert (moved.page_id, moved.level, moved.slot, moved.valid) == (parked[0], 1, 0, False)
    oracle.prefill(b, [oracle.token_for(1, p) for p in range(3)])
    oracle.verify(b)
    assert oracle.decode_step(a)  # h = 5: no crossing
    assert oracle.decode_step(a)  # h = 6: crossing; the pocket is consulted
    choices = mgr.last_choices()
    assert oracle.decode_step(b) and oracle.decode_step(b)  # B writes positions 3, 4
    oracle.verify(a)
    return oracle, a, b, choices


def test_revalidate_refuses_migrated_page_and_allocates(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(5, 4), pocket=True, policy="revalidate",
                              evict_parked="migrate"))
    oracle, a, b, crossing = _migration_scenario(mgr)
    choices = [c[0] for c in crossing]
    assert "refuse" in choices and "alloc" in choices and "pop" not in choices
    assert mgr.counters_of(0).pocket_refusals == 1
    assert oracle.check() == [] and oracle.missing == []
    assert_clean(mgr)
    a.close()
    b.close()
    assert not mgr.shutdown()


def test_unsafe_pop_is_caught_by_oracle_or_invariants(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(5, 4), pocket=True, policy="unsafe",
                              evict_parked="migrate"))
    oracle, _a, _b, crossing = _migration_scenario(mgr)
    assert "pop" in [c[0] for c in crossing]
    mismatches = oracle.check()
    violations = mgr.check_invariants()
    assert mismatches, "the aliased slot must corrupt in-window data"
    assert any("aliasing" in v or "not occupied" in v for v in violations)
    assert any("leaked slot" in v for v in violations)
    assert any("seq 0 lc 0 block 3 token 6" in str(m) for m in mismatches)


def test_unsafe_aliasing_is_reported_on_close_and_shutdown(make_mgr: Any) -> None:
    """After the aliasing, closing the sequence whose slot was freed under it would release
    that slot twice: close salvages (the page gives the slot up), warns, and the shutdown
    report names the corruption and the leaked host slot instead of raising."""
    mgr = make_mgr(swa_config(window=3, slots=(5, 4), pocket=True, policy="unsafe",
                              evict_parked="migrate"))
    _oracle, a, b, _crossing = _migration_scenario(mgr)
    violations = mgr.check_invariants()
    assert any("slot aliasing" in v for v in violations)
    a.close()  # frees the aliased GPU slot under b's page
    with pytest.warns(CorruptionWarning) as caught:
        b.close()  # raised DoubleReleaseError before
    assert [str(w.message) for w in caught] == list(mgr.corruption[-2:])
    assert a.status is SeqStatus.CLOSED and b.status is SeqStatus.CLOSED
    assert any("close of sequence 1: double release" in c for c in mgr.corruption)
    assert any("gave it up unreleased" in c for c in mgr.corruption)
    report = mgr.shutdown()
    assert report.corrupted and report
    assert any("slot aliasing" in c for c in report.corruption)
    assert report.open_sequences == () and report.pages == ()
    assert report.orphan_slots == (SlotRef(1, 0, 0),)  # the host copy's slot, leaked
    assert "corruption" in str(report)
    with pytest.raises(LeakError, match="slot aliasing"):
        report.raise_if_unclean()


def test_unsafe_aliasing_of_a_committed_page_is_reported_by_shutdown(make_mgr: Any) -> None:
    """The aliased page is committed: the tree keeps it after both closes, on a slot the
    allocator already has free; shutdown's drop would release it twice. It drops the page
    without releasing the slot and reports instead of raising."""
    mgr = make_mgr(swa_config(window=3, slots=(5, 4), pocket=True, policy="unsafe",
                              evict_parked="migrate"))
    a = decoder(mgr, 0)
    for h in range(5):
        assert a.resize(h + 1, h)  # block 0 parked at h = 4
    b = mgr.create(1)
    assert b.resume() and b.resize(6, 2)  # the parked page migrates to host
    b.commit([1, 2, 3, 4, 5, 6])  # b's pages become committed (tree pages)
    assert a.resize(6, 5) and a.resize(7, 6)  # the crossing pops the stale slot id
    assert ("pop", 0, 0, 0) in mgr.last_choices()
    b.close()
    a.close()  # frees GPU slot 0 under b's committed page
    assert not mgr.corruption  # nothing raised, nothing detected yet
    with pytest.warns(CorruptionWarning) as caught:
        report = mgr.shutdown()
    assert any("dropped without releasing it" in str(w.message) for w in caught)
    assert report.corrupted
    assert any("double release" in c for c in report.corruption)
    assert any("not occupied in its allocator" in c for c in report.corruption)
    assert report.pages == () and report.orphan_slots == (SlotRef(1, 0, 0),)


def test_pin_keeps_parked_pages_off_the_queue(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(5, 4), pocket=True, policy="pin"))
    oracle = DecodeOracle(mgr)
    a = decoder(mgr, 0)
    for _ in range(5):
        assert oracle.decode_step(a)
    pid = a.pocket_pages(0)[0]
    assert all(pid not in mgr.eviction_order(level) for level in range(2))
    before = mgr.snapshot()
    assert not mgr.pressure(0, 0, 3)  # only the parked page could go: it is pinned
    assert mgr.snapshot() == before
    assert oracle.decode_step(a) and oracle.decode_step(a)
    assert ("pop", 0, 0, pid) in mgr.last_choices()
    assert oracle.check() == []
    assert_clean(mgr)


def test_pocket_drains_on_suspend_and_close(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(8, 8), pocket=True))
    oracle = DecodeOracle(mgr)
    a = decoder(mgr, 0)
    for _ in range(5):
        assert oracle.decode_step(a)
    assert a.pocket_pages(0)
    a.suspend()
    assert a.pocket_pages(0) == []
    assert_clean(mgr)
    assert a.resume()
    before = mgr.counters_of(0)
    assert oracle.decode_step(a) and oracle.decode_step(a)  # next crossing allocates fresh
    assert mgr.counters_of(0).alloc_calls == before.alloc_calls + 1
    assert oracle.decode_step(a) and oracle.decode_step(a)
    assert a.pocket_pages(0)
    a.close()
    assert a.pocket_pages(0) == []
    assert not mgr.shutdown()


def test_pocket_capacity_bounds_parking(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(12, 4), pocket=True, capacity=2))
    a = decoder(mgr, 0)
    assert a.resize(8, 0)  # 4 blocks, none stale
    assert a.resize(12, 10)  # blocks 0..3 stale at once; blocks 4, 5 new
    parks = [c for c in mgr.last_choices() if c[0] == "park"]
    assert len(parks) == 2 and len(a.pocket_pages(0)) == 2
    assert_clean(mgr)


def test_failed_resize_leaves_pocket_untouched(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(7,), pocket=True, full=True))
    a = decoder(mgr, 0)
    assert a.resize(4, 0)
    assert a.resize(5, 4)  # swa block 0 parked
    assert a.pocket_pages(0)
    before = mgr.snapshot()
    mgr.inject_allocation_failure()
    assert not a.resize(7, 6)  # pops the parked page, then the full lc allocation fails
    assert mgr.snapshot() == before
    assert a.resize(7, 6)
    assert ("pop", 0, 0, before["pockets"][0]["pages"][0]) in mgr.last_choices()
    assert_clean(mgr)
