"""CuPy backend specifics (real streams, events, pinned host memory, disk level)."""

from __future__ import annotations

import numpy as np
import pytest
from impl_helpers import (
    GPU_SKIP,
    assert_clean,
    decode_under_pressure,
    page_tables_through_steps,
    swa_config,
)

from kvpocket.impl import KVCacheManager, make_backend
from kvpocket.verify.oracles.data import DecodeOracle

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
    """The copy chain that once read zeros on an H200: the fill ran on CuPy's current
    (legacy default) stream, the copies on the backend's non-blocking stream, with no
    event between them. The contract: external writes are joined with `join_current`
    (tests/impl/test_stream_sim.py shows the simulator catching the unjoined version)."""
    be = make_backend("cupy")
    s = be.new_stream("copy")
    pools = [be.create_pool(lv, 3, 8, np.int32) for lv in range(3)]
    pools[0][0] = be.xp.arange(8, dtype=np.int32)  # external: on the current stream
    be.join_current()
    order = [(0, 0, 1, 1), (1, 1, 2, 2), (2, 2, 0, 1), (0, 1, 1, 0), (1, 0, 0, 2)]
    for src_l, src_s, dst_l, dst_s in order:
        be.copy_slot(s, pools[dst_l], dst_s, pools[src_l], src_s)
    ev = be.new_event()
    be.record(ev, s)
    be.synchronize(ev)
    assert be.query(ev)
    for lv, slot in ((1, 1), (2, 2), (0, 1), (1, 0), (0, 2)):
        assert (be.to_numpy(pools[lv][slot]) == np.arange(8)).all(), (lv, slot)
    be.close()


def test_pools_are_ready_when_created() -> None:
    be = make_backend("cupy")
    s = be.new_stream("copy")
    host = be.create_pool(1, 64, 1 << 14, np.int32)
    host[:] = 7
    gpu = be.create_pool(0, 64, 1 << 14, np.int32)  # its zero fill must not land late
    be.copy_slots(s, gpu, list(range(64)), host, list(range(64)))
    be.synchronize_all()
    assert int(be.to_numpy(gpu).min()) == 7
    be.close()


@pytest.mark.parametrize("mode", ["auto", "runs", "staged"])
@pytest.mark.parametrize("pattern", ["contiguous", "scattered"])
def test_copy_slots_every_level_pair(mode: str, pattern: str) -> None:
    be = make_backend("cupy", copy_mode=mode)
    s = be.new_stream("copy")
    n, rows = 24, 40
    rng = np.random.default_rng(1)
    src_slots = np.arange(n) if pattern == "contiguous" else rng.permutation(rows)[:n]
    dst_slots = np.arange(3, 3 + n) if pattern == "contiguous" else rng.permutation(rows)[:n]
    data = rng.integers(0, 1 << 30, size=(rows, 33), dtype=np.int32)
    for src_l in range(3):
        for dst_l in range(3):
            if src_l == dst_l:
                continue
            src, dst = be.create_pool(src_l, rows, 33, np.int32), be.create_pool(
                dst_l, rows, 33, np.int32)
            if src_l == 0:
                src.set(data)
            else:
                src[:] = data
            be.copy_slots(s, dst, dst_slots.tolist(), src, src_slots.tolist())
            be.synchronize_all()
            got = be.to_numpy(dst)
            assert (got[dst_slots] == data[src_slots]).all(), (src_l, dst_l)
            untouched = np.setdiff1d(np.arange(rows), dst_slots)
            assert (got[untouched] == 0).all(), (src_l, dst_l)
    be.close()


def test_device_table_upload_is_complete() -> None:
    be = make_backend("cupy")
    host = np.arange(1 << 20, dtype=np.int32)
    dev = be.device_table(host)
    assert int(dev[-1]) == (1 << 20) - 1 and int(dev.sum(dtype=np.int64)) == int(
        host.sum(dtype=np.int64))
    s = be.new_stream("consumer")
    on_s = be.device_table(host, stream=s)
    out: list[int] = []
    be.launch(s, lambda: out.append(int(on_s.sum(dtype=np.int64))))
    assert out == [int(host.sum(dtype=np.int64))]
    be.close()


def test_page_table_is_a_device_copy_of_the_index() -> None:
    import cupy

    mgr = KVCacheManager(swa_config(window=5, slots=(8, 8)), backend="cupy")
    kv = mgr.create(0)
    assert kv.resume() and kv.resize(6, 5)
    table = kv.page_table(0)
    assert isinstance(table, cupy.ndarray)
    assert (cupy.asnumpy(table) == kv.index[0]).all()
    kv.close()
    mgr.shutdown()


def test_oracle_sweep_on_gpu_catches_a_corrupted_slot() -> None:
    mgr = KVCacheManager(swa_config(window=9, slots=(16, 8), full=True), backend="cupy",
                         slot_elems=4)
    oracle = DecodeOracle(mgr)
    kv = mgr.create(0)
    assert kv.resume()
    kv.stop_committing()
    for _ in range(12):
        assert oracle.decode_step(kv, verify=False)
    assert oracle.sweep() == [] and oracle.verified_positions == 9 + 12
    slot = int(kv.index[1][2])
    mgr.pool(0)[slot, 1] += 1  # external write (current stream) ...
    mgr.backend.join_current()  # ... joined before the oracle stream reads it
    bad = oracle.sweep()
    assert [(m.lc, m.token, m.slot) for m in bad] == [(1, 4, slot)]
    assert bad[0].found == (bad[0].expected + 1) & 0xFFFFFFFF
    kv.close()
    mgr.shutdown()


def test_decode_with_migration_and_pocket_on_gpu() -> None:
    mgr = KVCacheManager(swa_config(window=5, slots=(10, 6, 6), pocket=True), backend="cupy")
    oracle = DecodeOracle(mgr)
    kvs = decode_under_pressure(mgr, oracle, 48)
    assert oracle.check() == [] and oracle.missing == []
    assert mgr.counters_of().migrations > 0
    assert_clean(mgr)
    for kv in kvs:
        kv.close()
    assert not mgr.shutdown()


def test_page_tables_stay_synced_through_many_steps() -> None:
    """The device table is read after every step (not once): each change of the index must
    reach the copy the kernels read (the same walk runs on the simulator's device-mirror
    mode, tests/impl/test_manager.py)."""
    mgr = KVCacheManager(swa_config(window=5, slots=(24, 24), pocket=True, full=True),
                         backend="cupy")
    read, bad = page_tables_through_steps(mgr)
    assert bad == [] and read >= 40, (read, bad)
    mgr.shutdown()
