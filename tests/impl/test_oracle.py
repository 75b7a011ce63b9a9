"""The data oracle: clean on correct runs, and a missing event wait shows up as wrong data."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from impl_helpers import assert_clean, swa_config

from kvpocket.impl import KVCacheManager
from kvpocket.impl.backend import NumpyBackend
from kvpocket.impl.backend.protocol import EventRef, StreamRef
from kvpocket.impl.oracle import DecodeOracle


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
    seqs = []
    for sid in range(2):
        kv = mgr.create(sid)
        assert kv.resume()
        kv.stop_committing()
        seqs.append(kv)
    for step in range(steps):
        for kv in seqs:
            assert oracle.decode_step(kv)
        if step % 7 == 3:
            assert mgr.pressure(0, 0, 2)
        if step == 12:
            seqs[0].suspend()
            assert mgr.pressure(0, 0, 4)
            assert seqs[0].resume()
            oracle.verify(seqs[0])
        assert_clean(mgr)
    assert oracle.check() == [] and oracle.missing == []
    refusals = mgr.counters_of().pocket_refusals
    migrations = mgr.counters_of().migrations
    assert migrations > 0 and refusals >= 0
