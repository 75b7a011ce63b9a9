"""The data oracle: clean on correct runs, and a missing event wait shows up as wrong data."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from impl_helpers import assert_clean, decoder, swa_config

from kvpocket.impl import KVCacheManager
from kvpocket.impl.backend import NumpyBackend
from kvpocket.impl.backend.protocol import EventRef, StreamRef
from kvpocket.impl.exceptions import SimulatorError
from kvpocket.model.config import BAD_PAGE_INDEX, KVConfig, LifeCycle, SeqStatus
from kvpocket.verify.oracles.data import DecodeOracle


class NoWaitBackend(NumpyBackend):
    """A mutant: stream.wait_event is dropped (the classic missing-wait bug)."""

    def wait_event(self, stream: StreamRef, event: EventRef) -> None:
        return None


def _resume_race(backend: NumpyBackend) -> list[Any]:
    mgr = KVCacheManager(swa_config(window=5, slots=(6, 6), full=True), backend=backend)
    oracle = DecodeOracle(mgr)
    a = mgr.create(0)
    assert a.resume()
    a.stop_committing()
    for _ in range(5):
        assert oracle.decode_step(a)
    mgr.synchronize()
    a.suspend()
    assert mgr.pressure(0, 0, 6)  # all of a's pages go to host
    mgr.synchronize()
    mgr.pool(0)[:] = 0  # freed GPU slots get overwritten by another tenant
    assert a.resume()  # copies host -> GPU are enqueued on the copy stream, not run yet
    assert any(c[0] == "migrate" for c in mgr.last_choices())
    oracle.verify(a)
    backend.sim.advance(a.stream.id, 100)  # the consumer stream goes first
    backend.sim.drain()
    found = oracle.check()
    assert oracle.missing == []
    if not isinstance(backend, NoWaitBackend):
        assert mgr.counters_of(0).cross_stream_waits > 0
        assert_clean(mgr)
    return found


def test_resume_waits_on_the_copy_events() -> None:
    assert _resume_race(NumpyBackend(eager=False)) == []


def test_missing_wait_is_caught_deterministically() -> None:
    found = _resume_race(NoWaitBackend(eager=False))
    assert found and found[0].seq == 0 and found[0].found == 0
    assert "expected" in str(found[0])


def test_prefix_reuse_data_and_stamps_are_content_addressed(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(8, 8)))
    oracle = DecodeOracle(mgr)
    assert oracle.stamps.__name__ == "stamps"
    oracle.add_tokens(0, [1, 2, 3])
    oracle.add_tokens(1, [1, 2, 4])
    s0, s1 = oracle.stamps(0, 0, np.arange(3)), oracle.stamps(1, 0, np.arange(3))
    assert (s0[:2] == s1[:2]).all() and not (s0[2] == s1[2]).all()
    assert not (oracle.stamps(0, 1, np.arange(3)) == s0).all()


def test_oracle_reports_a_corrupted_slot(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=5, slots=(8, 8)))
    oracle = DecodeOracle(mgr)
    a = mgr.create(0)
    assert a.resume()
    for _ in range(4):
        assert oracle.decode_step(a, verify=False)
    assert oracle.check() == []
    mgr.synchronize()
    slot = int(a.index[0][1])
    mgr.pool(0)[slot, 0] += 1  # token 2 of block 1
    oracle.verify(a)
    bad = oracle.check()
    assert [(m.seq, m.lc, m.block, m.token, m.slot) for m in bad] == [(0, 0, 1, 2, slot)]


@pytest.mark.parametrize("steps", [40])
def test_long_decode_with_two_sequences_and_host_level(make_mgr: Any, steps: int) -> None:
    mgr = make_mgr(swa_config(window=5, slots=(10, 6), pocket=True))
    oracle = DecodeOracle(mgr)
    seqs = [decoder(mgr, sid) for sid in range(2)]
    for step in range(steps):
        for kv in seqs:
            assert oracle.decode_step(kv)
        if step % 7 == 3:
            assert mgr.pressure(0, 0, 2)
        if step == 12:
            seqs[0].suspend()
            assert mgr.pressure(0, 0, 6)  # past the parked pages: held ones migrate
            assert seqs[0].resume()
            oracle.verify(seqs[0])
        assert_clean(mgr)
    assert oracle.check() == [] and oracle.missing == []
    refusals = mgr.counters_of().pocket_refusals
    migrations = mgr.counters_of().migrations
    assert migrations > 0 and refusals >= 0


def test_missing_wait_is_a_race_for_the_race_detector() -> None:
    """With the race detector on, the mutant fails at the racy read itself (whatever
    the interleaving), not only when the harness happens to pick the bad order."""
    with pytest.raises(SimulatorError, match=r"read by 'oracle read' on stream 'seq0'"):
        _resume_race(NoWaitBackend(eager=False, race_check=True))
    assert _resume_race(NumpyBackend(eager=False, race_check=True)) == []


def _decode(mgr: KVCacheManager, steps: int, nseq: int = 2) -> tuple[DecodeOracle, list[Any]]:
    oracle = DecodeOracle(mgr)
    kvs = [decoder(mgr, sid) for sid in range(nseq)]
    for _ in range(steps):
        for kv in kvs:
            assert oracle.decode_step(kv, verify=False)
    return oracle, kvs


@pytest.mark.parametrize("slot_elems", [8, 12, 32, 128])
def test_32_tokens_per_block_with_any_slot_size(slot_elems: int) -> None:
    """The default slot_elems (8) with 32 tokens per block used to be refused: positions
    now share elements (ppe of them each, carrying the group's first stamp)."""
    cfg = KVConfig(tokens_per_block=32, life_cycles=(LifeCycle("swa", window=40),),
                   slots_per_level=(8, 4), num_sequences=2, max_blocks=8)
    mgr = KVCacheManager(cfg, slot_elems=slot_elems)
    oracle, kvs = _decode(mgr, 70)
    assert (oracle.ppe, oracle.ept) == ((-(-32 // slot_elems), 1) if slot_elems < 32
                                        else (1, slot_elems // 32))
    assert int(oracle.cols.max()) < slot_elems  # every position has an element of its own
    assert oracle.sweep() == [] and oracle.missing == []
    assert oracle.verified_positions == 2 * 40
    mgr.synchronize()
    slot = int(kvs[1].index[0][60 // 32])  # token 60 of sequence 1: block 1
    col = int(oracle.cols[60 % 32][0])
    mgr.pool(0)[slot, col] ^= 1
    bad = oracle.sweep()
    group = [p for p in range(32, 70) if int(oracle.cols[p % 32][0]) == col]
    assert {m.token for m in bad} == set(group) and 60 in group
    assert all((m.seq, m.lc, m.block, m.slot) == (1, 0, 1, slot) for m in bad)
    assert all(m.found == m.expected ^ 1 for m in bad)


def test_sweep_and_stream_reads_agree_and_copy_back_only_mismatches(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=7, slots=(32, 8), sink=2, full=True))
    oracle, kvs = _decode(mgr, 12)
    assert oracle.sweep() == []
    # sink 2 + window 7 per SWA life cycle, 12 positions of full attention, two sequences
    assert oracle.verified_positions == 2 * (2 + 7 + 12)
    mgr.synchronize()
    slot = int(kvs[0].index[1][3])  # full attention, block 3: tokens 6 and 7
    mgr.pool(0)[slot] += 5
    swept = oracle.sweep()
    for kv in kvs:
        oracle.verify(kv)
    read = oracle.check()
    key = [(m.seq, m.lc, m.token, m.slot, m.expected, m.found) for m in swept]
    assert key == [(m.seq, m.lc, m.token, m.slot, m.expected, m.found) for m in read]
    assert [(m.seq, m.lc, m.token) for m in swept] == [(0, 1, 6), (0, 1, 7)]
    assert oracle.mismatches == swept + read


def test_sweep_reports_positions_without_a_page() -> None:
    cfg = swa_config(window=5, slots=(8, 8))
    mgr = KVCacheManager(cfg)
    oracle, kvs = _decode(mgr, 6, nseq=1)
    kvs[0].index[0][2] = BAD_PAGE_INDEX  # a broken page table (the stale-index class)
    assert oracle.sweep() == []
    assert oracle.missing == [f"seq 0 lc 0 token {q}: block 2 has no page (stale range 0..0)"
                              for q in (4, 5)]


def test_sweep_orders_after_each_sequence_stream() -> None:
    """On a lazy simulator a write still queued on a sequence's stream is waited for."""
    be = NumpyBackend(eager=False)
    mgr = KVCacheManager(swa_config(window=5, slots=(8, 8)), backend=be)
    oracle, kvs = _decode(mgr, 4, nseq=1)
    assert be.sim.pending(kvs[0].stream.id) > 0  # the stamp writes have not run
    assert oracle.sweep() == [] and oracle.missing == []
    assert oracle.verified_positions == 4


# ---- the sweep's caches: what it reuses between sweeps must never hide a change ---------
def _two_group_config() -> KVConfig:
    return KVConfig(tokens_per_block=4,
                    life_cycles=(LifeCycle("swa", window=9, sink_tokens=2, priority=20),
                                 LifeCycle("full", pool_group=1, priority=35)),
                    slots_per_level=(40, 40), num_sequences=3, max_blocks=16)


def _key(found: list[Any]) -> list[tuple[int, ...]]:
    return [(m.seq, m.lc, m.block, m.token, m.expected, m.found, m.slot) for m in found]


def test_sweep_agrees_with_stream_reads_under_random_corruption() -> None:
    """Decode three sequences at different speeds, corrupt pool elements and page-table
    entries at random, and suspend/resume: every sweep (which reuses its structure and
    expected rows) reports what verify + check (planned afresh) report."""
    rng = np.random.default_rng(7)
    for race_check in (False, True):
        mgr = KVCacheManager(_two_group_config(), backend=NumpyBackend(race_check=race_check))
        oracle, kvs = _decode(mgr, 3, nseq=3)
        sweeps = 0
        for step in range(40):
            for i, kv in enumerate(kvs):
                if kv.status is SeqStatus.ACTIVE and rng.random() < 0.4 + 0.2 * i:
                    assert oracle.decode_step(kv, verify=False)
            mgr.synchronize()
            if step == 15:
                kvs[1].suspend()
            if step == 25:
                assert kvs[1].resume()
            r = rng.random()
            if r < 0.3:
                g = int(rng.integers(2))
                pool = mgr.pool(0, g)
                pool[int(rng.integers(pool.shape[0])), int(rng.integers(pool.shape[1]))] ^= 4
            elif r < 0.4:
                kv = kvs[int(rng.integers(3))]
                if kv.num_blocks:
                    kv.index[int(rng.integers(2)), int(rng.integers(kv.num_blocks))] = int(
                        rng.integers(-1, 40))
            missing = len(oracle.missing)
            swept = oracle.sweep()
            swept_missing = oracle.missing[missing:]
            for kv in kvs:
                oracle.verify(kv)
            read = oracle.check()
            assert sorted(_key(swept)) == sorted(_key(read)), step
            assert sorted(swept_missing) == sorted(oracle.missing[missing + len(swept_missing):])
            sweeps += bool(swept or swept_missing)
        assert sweeps > 5  # the corruption was seen, not only the clean case
        mgr.shutdown()


def test_sweep_reports_in_pool_group_then_plan_order() -> None:
    """Two pool groups: the compare runs the segments' end blocks first, yet mismatches
    come back as before: by pool group, then segment, sequence, block and token."""
    mgr = KVCacheManager(_two_group_config())
    oracle, _ = _decode(mgr, 30, nseq=2)
    assert oracle.sweep() == []
    mgr.synchronize()
    for g in (0, 1):
        mgr.pool(0, g)[:] ^= 1  # every element of every slot
    bad = oracle.sweep()
    group_of_lc = {0: 0, 1: 1}
    order = [(group_of_lc[m.lc], m.lc, m.lc == 0 and m.token >= 2, m.seq, m.block, m.token)
             for m in bad]  # (pool group, segment: sink tokens first, sequence, block, token)
    assert len({key[:3] for key in order}) == 3  # sink tokens, window, full attention
    assert order == sorted(order)
    assert oracle.verified_positions == 2 * 2 * (2 + 9 + 30)  # 2 sweeps of 2 sequences


def test_sweep_reads_page_tables_and_new_stamps_afresh() -> None:
    """Between two sweeps of the same structure a page-table entry changes, and a new
    token's slot is overwritten: both are reported."""
    cfg = KVConfig(tokens_per_block=8, life_cycles=(LifeCycle("swa", window=24),),
                   slots_per_level=(16, 8), num_sequences=2, max_blocks=8)
    mgr = KVCacheManager(cfg, slot_elems=32)
    oracle, kvs = _decode(mgr, 20, nseq=2)
    assert oracle.sweep() == []
    mgr.synchronize()
    a, b = int(kvs[0].index[0, 1]), int(kvs[1].index[0, 1])
    kvs[0].index[0, 1], kvs[1].index[0, 1] = b, a  # aliasing: same blocks, swapped slots
    assert {(m.seq, m.block) for m in oracle.sweep()} == {(0, 1), (1, 1)}
    kvs[0].index[0, 1], kvs[1].index[0, 1] = a, b
    assert oracle.sweep() == []
    for kv in kvs:
        assert oracle.decode_step(kv, verify=False)  # token 20: block 2, stamps stored now
    mgr.synchronize()
    mgr.pool(0)[int(kvs[1].index[0, 2]), (20 % 8) * 4] ^= 1
    assert [(m.seq, m.token) for m in oracle.sweep()] == [(1, 20)]


def test_sweep_is_stream_ordered_for_the_race_detector() -> None:
    """With the race detector on, the sweep's compare is a launch that declares the slots
    it reads: without the event waits it is a race; with them it is clean. Keeping a
    trace also keeps the compare a launch."""
    cfg = swa_config(window=5, slots=(8, 8))
    mgr = KVCacheManager(cfg, backend=NoWaitBackend(eager=False, race_check=True))
    oracle, _ = _decode(mgr, 4, nseq=1)
    with pytest.raises(SimulatorError, match=r"read by 'oracle compare' on stream 'oracle'"):
        oracle.sweep()
    be = NumpyBackend(race_check=True)
    oracle, _ = _decode(KVCacheManager(cfg, backend=be), 4, nseq=1)
    assert oracle.sweep() == [] and oracle.missing == []
    be = NumpyBackend()
    be.sim.keep_trace = True
    oracle, _ = _decode(KVCacheManager(cfg, backend=be), 4, nseq=1)
    assert oracle.sweep() == []
    assert "oracle compare" in {label for _, label in be.sim.trace}
