"""Manager semantics: resize, commit, prefix reuse, suspend/resume, close, errors, rollback."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from impl_helpers import assert_clean, page_tables_through_steps, swa_config

from kvpocket.impl import (
    CapacityError,
    CommitNotAllowedError,
    DuplicateSequenceError,
    HistoryDecreaseError,
    KVCacheManager,
    LeakError,
    NumpyBackend,
    OutOfPagesError,
    SequenceClosedError,
    SequenceStateError,
    UnknownLevelError,
    UnknownLifeCycleError,
    UnknownSequenceError,
)
from kvpocket.impl.eviction import EvictionQueue
from kvpocket.model.config import BAD_PAGE_INDEX, CommitState, SeqStatus
from kvpocket.verify.oracles.data import DecodeOracle


def active(mgr: KVCacheManager, sid: int, prompt: tuple[int, ...] = ()) -> Any:
    kv = mgr.create(sid, prompt)
    assert kv.resume()
    return kv


def test_create_starts_suspended_and_resize_allocates(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, full=True))
    kv = mgr.create(0)
    assert kv.status is SeqStatus.SUSPENDED
    with pytest.raises(SequenceStateError):
        kv.resize(2, 0)
    assert kv.resume()
    assert kv.resize(4, 0)
    assert kv.num_blocks == 2
    assert [c[0] for c in mgr.last_choices()] == ["alloc"] * 4
    assert BAD_PAGE_INDEX not in kv.block_table(0) and len(kv.block_table(0)) == 2
    assert kv.page_table(0)[2] == BAD_PAGE_INDEX  # the kernels' row: max_blocks long
    assert_clean(mgr)
    json.dumps(mgr.snapshot())


def test_stale_blocks_unlock_and_new_stale_blocks_get_no_page(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, full=True, slots=(16, 16)))
    kv = active(mgr, 0)
    kv.stop_committing()
    assert kv.resize(6, 4)  # block 0 stale for the swa life cycle (h >= 2*0+4)
    assert kv.stale_range(0) == (0, 1)
    assert kv.block_table(0)[0] == BAD_PAGE_INDEX and kv.block_entries(0)[0].page_id is None
    assert kv.block_entries(0)[0].stale and not kv.block_entries(1)[0].stale
    assert kv.block_table(1)[0] != BAD_PAGE_INDEX  # full attention keeps everything
    snap = mgr.snapshot()
    assert len([p for p in snap["pages"] if p["lc"] == 0]) == 2
    assert_clean(mgr)
    kv2 = active(mgr, 1)
    assert kv2.resize(12, 11)  # blocks 0..3 born stale: only block 4 and 5 get swa pages
    row = kv2.block_table(0)
    assert len(row) == 6 and row[:4] == (BAD_PAGE_INDEX,) * 4
    assert all(x != BAD_PAGE_INDEX for x in row[4:6])
    assert_clean(mgr)


def test_kept_holder_while_commit_allowed(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(6, 6)))
    kv = active(mgr, 0)
    assert kv.resize(4, 0)
    assert kv.resize(6, 4)
    entry = kv.block_entries(0)[0]
    assert entry.page_id is not None and not entry.locked and entry.stale
    page = mgr.page(entry.page_id)
    assert page is not None and page.status == "HELD" and not page.committed
    assert kv.block_table(0)[0] == BAD_PAGE_INDEX
    assert_clean(mgr)
    kv.stop_committing()  # the held uncommitted stale page dies
    assert kv.block_entries(0)[0].page_id is None and mgr.page(entry.page_id) is None
    assert_clean(mgr)


@pytest.mark.parametrize("bad", ["history_down", "cap_lt_hist", "cap_gt_max", "neg", "closed",
                                 "suspended", "commit_stop", "commit_over", "lc", "dup",
                                 "unknown", "level"])
def test_misuse_raises_specific_error_and_changes_nothing(make_mgr: Any, bad: str) -> None:
    mgr = make_mgr(swa_config(window=3, full=True, max_blocks=8))
    kv = active(mgr, 0)
    assert kv.resize(6, 3)
    other = mgr.create(1)
    closed = active(mgr, 2)
    closed.close()
    before = mgr.snapshot()
    cases: dict[str, tuple[type[Exception], Any]] = {
        "history_down": (HistoryDecreaseError, lambda: kv.resize(6, 2)),
        "cap_lt_hist": (CapacityError, lambda: kv.resize(2, 3)),
        "cap_gt_max": (CapacityError, lambda: kv.resize(17, 3)),
        "neg": (CapacityError, lambda: kv.resize(-1, None)),
        "closed": (SequenceClosedError, lambda: closed.resize(4, 0)),
        "suspended": (SequenceStateError, lambda: other.resize(4, 0)),
        "commit_stop": (CommitNotAllowedError, lambda: (kv.stop_committing(), kv.commit([1]))),
        "commit_over": (CapacityError, lambda: kv.commit([1] * 7)),
        "lc": (UnknownLifeCycleError, lambda: kv.page_table(5)),
        "dup": (DuplicateSequenceError, lambda: mgr.create(0)),
        "unknown": (UnknownSequenceError, lambda: mgr.get(99)),
        "level": (UnknownLevelError, lambda: mgr.pressure(3, 0, 1)),
    }
    exc, call = cases[bad]
    if bad == "commit_stop":
        kv.stop_committing()
        before = mgr.snapshot()
        call = lambda: kv.commit([1])  # noqa: E731
    with pytest.raises(exc) as info:
        call()
    assert str(info.value)
    assert mgr.snapshot() == before


def test_out_of_pages_rolls_back_exactly(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(4,), full=True))
    kv = active(mgr, 0)
    assert kv.resize(4, 0)  # 2 blocks x 2 lcs = 4 slots: GPU full
    before = mgr.snapshot()
    counters = mgr.counters_of()
    result = kv.resize(6, 1)
    assert not result and result.error == "OutOfPagesError" and "free" in result.reason
    with pytest.raises(OutOfPagesError, match=result.reason):
        result.raise_for_failure()
    assert mgr.last_choices()[-1] == ("fail", "OutOfPagesError")
    assert mgr.snapshot() == before
    assert mgr.counters_of() == counters


@pytest.mark.parametrize("inject", ["alloc", "copy"])
def test_injected_failures_roll_back_then_retry_succeeds(make_mgr: Any, inject: str) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(6, 4), full=True, pocket=True))
    kv = active(mgr, 0)
    kv.stop_committing()
    assert kv.resize(4, 0)
    other = active(mgr, 1)
    assert other.resize(2, 0)
    other.suspend()  # its pages become HELD and evictable: room needs a migration
    before = mgr.snapshot()
    if inject == "alloc":
        mgr.inject_allocation_failure()
    else:
        mgr.inject_copy_failure()
    failed = kv.resize(6, 4)
    assert not failed and failed.error == ("InjectedAllocationError" if inject == "alloc"
                                           else "CopyFailedError")
    assert mgr.snapshot() == before
    assert kv.resize(6, 4)
    assert any(c[0] == "migrate" for c in mgr.last_choices())
    assert_clean(mgr)


def test_pressure_cascades_and_fails_cleanly(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=8, slots=(4, 2)))
    kv = active(mgr, 0)
    kv.commit([])  # no-op commit keeps state ALLOWED
    assert kv.resize(8, 0)
    kv.suspend()  # 4 HELD pages at GPU, queued
    assert mgr.pressure(0, 0, 2)
    assert [c[0] for c in mgr.last_choices()].count("migrate") == 2
    assert_clean(mgr)
    before = mgr.snapshot()
    assert not mgr.pressure(0, 0, 4)  # host full of HELD pages: cannot take two more
    assert mgr.snapshot() == before
    assert kv.resume()
    entries = kv.block_entries(0)
    assert len(entries) == 4 and all(e.level == 0 and e.locked for e in entries)
    assert_clean(mgr)


def test_victim_policy_is_replaceable(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=8, slots=(4, 4)))
    kv = active(mgr, 0)
    assert kv.resize(8, 0)
    kv.suspend()
    order = mgr.eviction_order(0, 0)

    class Last:
        def choose(self, level: int, pool_group: int, queue: EvictionQueue) -> int | None:
            ids = queue.ordered()
            return ids[-1] if ids else None

    mgr.victim_policy = Last()
    assert mgr.pressure(0, 0, 1)
    assert mgr.last_choices()[0] == ("evict", 0, 0, order[-1])


def test_commit_and_prefix_reuse_with_data(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(12, 12), full=True))
    oracle = DecodeOracle(mgr)
    prompt = [5, 6, 7, 8, 9, 10, 11]
    a = active(mgr, 0)
    assert a.resize(len(prompt), 0)
    oracle.prefill(a, prompt)
    a.commit(prompt)
    assert a.num_committed_blocks == 3 and a.history == 7
    assert mgr.prefix_blocks() == 3
    assert_clean(mgr)
    a.close()
    snap = mgr.snapshot()
    assert all(p["status"] == "DROPPABLE" and p["committed"] for p in snap["pages"])
    b = mgr.create(1, prompt)  # 3 full blocks match
    assert (b.capacity, b.history, b.committed_tokens) == (6, 6, tuple(prompt[:6]))
    assert b.block_entries(0)[0].page_id is None  # stale for swa at h=6: no entry
    assert all(e.page_id is not None for e in b.block_entries(1))
    assert b.resume()
    oracle.prefill(b, prompt[:6], reused=6)
    oracle.verify(b)
    assert oracle.check() == [] and oracle.missing == []
    assert_clean(mgr)
    b.close()
    assert not mgr.shutdown()


def test_commit_conflict_stops_committing(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=8, slots=(8, 8)))
    a, b = active(mgr, 0), active(mgr, 1)
    for kv in (a, b):
        assert kv.resize(4, 0)
    a.commit([1, 2, 3, 4])
    b.commit([1, 2, 3, 4])
    assert b.commit_state is CommitState.USER_STOP and b.num_committed_blocks == 0
    assert a.commit_state is CommitState.ALLOWED
    assert_clean(mgr)


def test_suspend_resume_round_trip_preserves_data(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=5, slots=(8, 8, 8), full=True))
    oracle = DecodeOracle(mgr)
    a = active(mgr, 0)
    a.stop_committing()
    for _ in range(4):
        assert oracle.decode_step(a)
    a.suspend()
    assert mgr.pressure(0, 0, 8)  # everything of a goes to host
    assert mgr.pressure(1, 0, 8)  # ... and on to disk
    levels = {e.level for lc in range(2) for e in a.block_entries(lc) if e.page_id is not None}
    assert levels == {2}
    assert_clean(mgr)
    assert a.resume()
    levels = {e.level for lc in range(2) for e in a.block_entries(lc) if e.page_id is not None}
    assert levels == {0}
    oracle.verify(a)
    assert oracle.check() == [] and oracle.missing == []
    for _ in range(3):
        assert oracle.decode_step(a)
    assert oracle.check() == []
    assert_clean(mgr)


def test_resume_failure_is_all_or_nothing(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=8, slots=(2, 4)))
    a = active(mgr, 0)
    assert a.resize(4, 0)
    a.suspend()
    b = active(mgr, 1)
    assert b.resize(4, 0)  # a's pages migrated to host to make room
    before = mgr.snapshot()
    result = a.resume()  # GPU holds b's locked pages: nothing can move
    assert not result and result.error == "OutOfPagesError"
    assert mgr.snapshot() == before


def test_close_and_leak_report(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(6, 6)))
    a = active(mgr, 0)
    assert a.resize(4, 1)
    a.close()
    a.close()  # idempotent
    with pytest.raises(SequenceClosedError):
        a.suspend()
    b = active(mgr, 1)
    assert b.resize(2, 0)
    report = mgr.shutdown()
    assert report.open_sequences == (1,) and len(report.pages) == 1
    assert not report.corrupted and report.leaks.pages[0].owner == 1
    mgr2 = make_mgr(swa_config())
    k = active(mgr2, 0)
    assert k.resize(2, 0)
    with pytest.raises(LeakError):
        mgr2.shutdown(raise_on_leak=True)


def test_shrink_releases_trailing_blocks(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=8, slots=(6,)))
    a = active(mgr, 0)
    assert a.resize(8, 0)
    c0 = mgr.counters_of(0)
    assert a.resize(3, 0)
    assert a.num_blocks == 2 and mgr.counters_of(0).releases - c0.releases == 2
    assert_clean(mgr)


# ---- a long-running manager: state bounded whatever the number of sequences ever made ----


def test_closed_sequences_are_forgotten_beyond_a_bound() -> None:
    from kvpocket.impl.backend.numpy_sim import NumpyBackend
    from kvpocket.impl.manager import CLOSED_KEPT
    from kvpocket.verify.presets import preset

    backend = NumpyBackend()
    mgr = KVCacheManager(preset("tiny"), backend)
    cfg = mgr.cfg
    first = mgr.create(0, [1, 2])
    first.close()
    for sid in range(1, 3 * CLOSED_KEPT):
        kv = active(mgr, sid, (1, 2, 3))
        assert kv.resize(4, 2)
        kv.close()
    held = len(mgr.seqs)
    assert held <= cfg.num_sequences + CLOSED_KEPT + 1
    assert backend.sim.live_streams <= held + 2  # + copy and legacy streams
    with pytest.raises(UnknownSequenceError, match="forgotten"):
        mgr.get(0)
    with pytest.raises(SequenceClosedError):  # a forgotten handle is still closed
        first.resume()
    assert mgr.get(3 * CLOSED_KEPT - 1).status is SeqStatus.CLOSED  # a recent one is kept
    mgr.create(0, [1, 2]).close()  # an id forgotten may be created again
    assert mgr.check_invariants() == []
    assert not mgr.shutdown().leaks


def test_a_stream_with_queued_work_is_released_once_it_ran() -> None:
    from kvpocket.impl.backend.numpy_sim import NumpyBackend
    from kvpocket.impl.manager import CLOSED_KEPT
    from kvpocket.verify.presets import preset

    backend = NumpyBackend(eager=False)
    mgr = KVCacheManager(preset("tiny"), backend)
    kv = active(mgr, 0, (1, 2, 3))
    assert kv.resize(4, 2)
    kv.close()
    pending = backend.sim.pending(kv.stream.id)
    for sid in range(1, CLOSED_KEPT + 4):
        mgr.create(sid).close()
    assert 0 not in mgr.seqs  # forgotten ...
    if pending:  # ... its stream kept until its queued work runs
        assert backend.sim.live_streams > len(mgr.seqs)
        backend.sim.drain()
    assert backend.sim.pending(kv.stream.id) == 0
    assert kv.stream.id not in {s for s in backend.sim.runnable()}
    assert mgr.check_invariants() == []


def test_device_mirror_mode_keeps_a_separate_synced_page_table() -> None:
    """`NumpyBackend(device_mirror=True)`: `page_table` is a copy, synced by the path the
    CuPy backend takes (a dirty flag, an upload on the next read), so a change of the
    index that skips the flag shows on the CPU as a stale table."""
    cfg = swa_config(window=5, slots=(24, 24), pocket=True, full=True)
    plain = KVCacheManager(cfg)
    kv = plain.create(0)
    assert kv.resume() and np.shares_memory(kv.page_table(0), kv.index)  # the host array
    mgr = KVCacheManager(cfg, backend=NumpyBackend(device_mirror=True))
    read, bad = page_tables_through_steps(mgr)
    assert bad == [] and read >= 40, (read, bad)
    kv = mgr.create(2)
    assert kv.resume() and kv.resize(4, 3)
    table = kv.page_table(0)
    assert not np.shares_memory(table, kv.index) and table.tolist() == kv.index[0].tolist()
    kv.index[0, 0] = 7  # a write that skips `_set_index` (no dirty flag) ...
    assert int(kv.page_table(0)[0]) != 7  # ... never reaches the copy a kernel reads
    assert kv.resize(6, 5)  # a change through the index path uploads the whole table
    assert kv.page_table(0).tolist() == kv.index[0].tolist()
