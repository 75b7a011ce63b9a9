"""Shared helpers of the tests that build a manager (`tests/impl`, `tests/oracles`): a
uniquely named module, not a package, at the top of `tests/` so that every folder imports
it (`tests/conftest.py` puts `tests/` on the path). The fixtures `backend` and `make_mgr`
are defined here, typed, and taken into a folder by its `conftest.py`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvpocket.impl import KVCache, KVCacheManager, gpu_available
from kvpocket.model.config import (
    EvictParked,
    KVConfig,
    LifeCycle,
    PocketConfig,
    PocketPolicy,
)
from kvpocket.verify.oracles.data import DecodeOracle

GPU_SKIP = pytest.mark.skipif(
    not gpu_available(), reason="no usable CUDA GPU: CuPy backend tests need one"
)
BACKENDS = [
    pytest.param("numpy", id="numpy"),
    pytest.param("cupy", id="cupy", marks=[pytest.mark.gpu, GPU_SKIP]),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_mgr(backend: str) -> Iterator[Any]:
    made: list[KVCacheManager] = []

    def make(cfg: KVConfig, **kw: Any) -> KVCacheManager:
        m = KVCacheManager(cfg, backend=backend, **kw)
        made.append(m)
        return m

    yield make
    for m in made:
        m.backend.close()


def swa_config(
    window: int = 3, slots: tuple[int, ...] = (6, 6), pocket: bool = False,
    policy: str = "revalidate", full: bool = False, sink: int = 0, max_blocks: int = 64,
    capacity: int = 2, evict_parked: str | None = None,
) -> KVConfig:
    lcs: tuple[LifeCycle, ...] = (LifeCycle("swa", window=window, sink_tokens=sink,
                                            priority=20),)
    if full:
        lcs = (*lcs, LifeCycle("full", priority=35))
    return KVConfig(
        tokens_per_block=2, life_cycles=lcs, slots_per_level=slots, num_sequences=4,
        max_blocks=max_blocks,
        pocket=PocketConfig(enabled=pocket, capacity=capacity,
                            policy=PocketPolicy.parse(policy))
        if evict_parked is None else
        PocketConfig(enabled=pocket, capacity=capacity, policy=PocketPolicy.parse(policy),
                     evict_parked=EvictParked.parse(evict_parked)),
    )


def assert_clean(mgr: KVCacheManager) -> None:
    bad = mgr.check_invariants()
    assert not bad, "\n".join(bad)


def decoder(mgr: KVCacheManager, sid: int) -> KVCache:
    """A created, resumed sequence that never commits (disaggregated-decode style)."""
    kv = mgr.create(sid)
    assert kv.resume()
    kv.stop_committing()
    return kv


def decode_under_pressure(mgr: KVCacheManager, oracle: DecodeOracle, steps: int,
                          after_step: Callable[[int], None] | None = None) -> list[KVCache]:
    """Two sequences decode with the oracle; another tenant takes GPU slots every fifth
    step, and at step 20 one sequence is suspended, pushed down to the last level and
    resumed. `after_step(step)` runs after each step's traffic."""
    kvs = [decoder(mgr, sid) for sid in range(2)]
    for step in range(steps):
        for kv in kvs:
            assert oracle.decode_step(kv)
        if step % 5 == 2:
            assert mgr.pressure(0, 0, 2)
        if step == 20:
            kvs[1].suspend()
            assert mgr.pressure(0, 0, 6) and mgr.pressure(1, 0, 6)  # down to disk too
            assert kvs[1].resume()
        if after_step is not None:
            after_step(step)
    return kvs


def page_tables_through_steps(mgr: KVCacheManager) -> tuple[int, list[str]]:
    """Two sequences through several steps (decode past the window with the pocket popping,
    suspend, pressure, resume, a jump, close); after each, every life cycle's page table
    as a kernel reads it (`page_table`, on the device where the backend keeps a copy)
    against the host index. Returns (tables read, differences)."""
    kvs = [mgr.create(0), mgr.create(1)]
    read, bad = 0, []

    def look(what: str) -> None:
        nonlocal read
        for kv in kvs:
            if kv.status.name == "CLOSED":
                continue
            for lc in range(mgr.cfg.num_life_cycles):
                got = [int(x) for x in mgr.backend.to_numpy(kv.page_table(lc)).tolist()]
                read += 1
                if got != kv.index[lc].tolist():
                    bad.append(f"after {what}: seq {kv.seq_id} lc {lc}: {got} != "
                               f"{kv.index[lc].tolist()}")

    for kv in kvs:
        assert kv.resume()
        kv.stop_committing()
    look("resume")
    for h in range(1, 10):
        for kv in kvs:
            assert kv.resize(h + 1, h)
        look(f"decode to {h}")
    kvs[0].suspend()
    look("suspend")
    mgr.pressure(0, 0, 2)
    look("pressure")
    assert kvs[0].resume()
    look("resume after pressure")
    assert kvs[1].resize(16, 11)  # several blocks at once
    look("grow")
    kvs[1].close()
    look("close")
    return read, bad
