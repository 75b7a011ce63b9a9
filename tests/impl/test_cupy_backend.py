"""CuPy backend specifics (real streams, events, pinned host memory, disk level)."""

from __future__ import annotations

import numpy as np
import pytest
from impl_helpers import GPU_SKIP, assert_clean, swa_config

from kvpocket.impl import KVCacheManager, make_backend
from kvpocket.impl.oracle import DecodeOracle

pytestmark = [pytest.mark.gpu, GPU_SKIP]


def test_auto_picks_cupy_when_a_gpu_is_usable() -> None:
    be = make_backend("auto")
    assert be.name == "cupy"
    be.close()


def test_levels_live_on_device_pinned_host_and_disk() -> None:
    import cupy

    mgr = KVCacheManager(swa_config(slots=(4, 4, 4)), backend="cupy")
    assert isinstance(mgr.pool(0), cupy.ndarray)
    assert isinstance(mgr.pool(1), np.ndarray) and not isinstance(mgr.pool(1), np.memmap)
    assert isinstance(mgr.pool(2), np.memmap)
    mgr.backend.close()


def test_copy_slot_all_level_pairs_and_events() -> None:
    be = make_backend("cupy")
    s = be.new_stream("copy")
    pools = [be.create_pool(lv, 3, 8, np.int32) for lv in range(3)]
    pools[0][0] = be.xp.arange(8, dtype=np.int32)
    order = [(0, 0, 1, 1), (1, 1, 2, 2), (2, 2, 0, 1), (0, 1, 1, 0), (1, 0, 0, 2)]
    for src_l, src_s, dst_l, dst_s in order:
        be.copy_slot(s, pools[dst_l], dst_s, pools[src_l], src_s)
    ev = be.new_event()
    be.record(ev, s)
    be.synchronize(ev)
    assert be.query(ev)
    assert (be.to_numpy(pools[0][2]) == np.arange(8)).all()
    be.close()


def test_decode_with_migration_and_pocket_on_gpu() -> None:
    mgr = KVCacheManager(swa_config(window=5, slots=(10, 6, 6), pocket=True), backend="cupy")
    oracle = DecodeOracle(mgr)
    kvs = []
    for sid in range(2):
        kv = mgr.create(sid)
        assert kv.resume()
        kv.stop_committing()
        kvs.append(kv)
    for step in range(48):
        for kv in kvs:
            assert oracle.decode_step(kv)
        if step % 5 == 2:
            assert mgr.pressure(0, 0, 2)
        if step == 20:
            kvs[1].suspend()
            assert mgr.pressure(0, 0, 6) and mgr.pressure(1, 0, 6)
            assert kvs[1].resume()
    assert oracle.check() == [] and oracle.missing == []
    assert mgr.counters_of().migrations > 0
    assert_clean(mgr)
    for kv in kvs:
        kv.close()
    assert not mgr.shutdown()
