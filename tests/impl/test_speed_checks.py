"""The implementation's speed-structure checks (`impl/selfcheck.py: SPEED_CHECKS`): clean
on a manager that ran a workload, and each one fails when its structure is broken by hand
(the primary data left as it was)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from impl_helpers import decoder, swa_config

from kvpocket.impl import KVCacheManager
from kvpocket.impl.eviction import EvictionQueue
from kvpocket.impl.selfcheck import SPEED_CHECKS, check_invariants, check_speed_structures
from kvpocket.impl.undo import Op


def _busy() -> KVCacheManager:
    """Two sequences, pages queued (one suspended), slots recycled, blocks committed."""
    mgr = KVCacheManager(swa_config(pocket=True, slots=(12, 8), full=True))
    a = decoder(mgr, 0)
    for h in range(7):
        assert a.resize(h + 1, h)
    b = mgr.create(1)
    assert b.resume()
    assert b.resize(4, 0)
    b.commit([1, 2, 3, 4])
    b.suspend()
    assert check_speed_structures(mgr) == [] and check_invariants(mgr) == []
    return mgr


def _queue(mgr: KVCacheManager) -> EvictionQueue:
    return max((q for level in mgr.storage.queues for q in level), key=len)


def _break_heap(mgr: KVCacheManager) -> None:
    q = _queue(mgr)
    q._heap.clear()


def _break_heap_order(mgr: KVCacheManager) -> None:
    q = _queue(mgr)
    heap = q._heap
    heap.reverse()


def _break_free_list(mgr: KVCacheManager) -> None:
    a = mgr.storage.allocs[0][0]
    a.recycled.append(a.recycled[0] if a.recycled else next(iter(a.occupied)))


def _break_index(mgr: KVCacheManager) -> None:
    tree = mgr.storage.tree
    key = next(iter(tree.index))
    tree.index[key] = tree.next_id + 5


def _break_stale_memo(mgr: KVCacheManager) -> None:
    kv = mgr.seqs[0]
    kv._stale[0] = (0, 0)


def _break_window_bound(mgr: KVCacheManager) -> None:
    kv = mgr.seqs[0]
    kv._next_change = kv.history + 40


BREAKS: dict[str, list[Callable[[KVCacheManager], None]]] = {
    "eviction heap": [_break_heap, _break_heap_order],
    "slot free list": [_break_free_list],
    "prefix-tree index": [_break_index],
    "remembered stale ranges": [_break_stale_memo],
    "window-change bound": [_break_window_bound],
}


def test_every_speed_check_has_a_hand_made_break() -> None:
    assert set(BREAKS) == set(SPEED_CHECKS)


@pytest.mark.parametrize("name,breaker", [(n, b) for n, bs in BREAKS.items() for b in bs],
                         ids=[f"{n}-{b.__name__}" for n, bs in BREAKS.items() for b in bs])
def test_a_broken_structure_fails_its_check(name: str,
                                            breaker: Callable[[KVCacheManager], None]) -> None:
    mgr = _busy()
    breaker(mgr)
    bad = SPEED_CHECKS[name](mgr)
    assert bad, f"{name}: the check passed a broken structure"
    assert any(line.startswith(f"{name}: ") for line in check_speed_structures(mgr))


def test_a_compaction_keeps_the_live_entries_and_is_counted() -> None:
    """The heap's rare path: rebuilt with live entries, it still holds each of them."""
    mgr = _busy()
    q = mgr.storage.queues[0][0]
    live = dict(q.entries)
    assert live
    op = Op()
    for _ in range(q.COMPACT_FACTOR * len(live) + q.COMPACT_SLACK + 2):  # garbage, per round
        q.push(-1, 0, op)
        q.remove(-1, op)
    assert q.compactions >= 1 and q.compacted_live == len(live)
    assert dict(q.entries) == live and SPEED_CHECKS["eviction heap"](mgr) == []
