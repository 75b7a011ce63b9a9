"""Shared helpers of the implementation tests (a uniquely named module, not a package)."""

from __future__ import annotations

import pytest

from kvpocket.impl import KVCacheManager, gpu_available
from kvpocket.model.config import (
    EvictParked,
    KVConfig,
    LifeCycle,
    PocketConfig,
    PocketPolicy,
)

GPU_SKIP = pytest.mark.skipif(
    not gpu_available(), reason="no usable CUDA GPU: CuPy backend tests need one"
)
BACKENDS = [
    pytest.param("numpy", id="numpy"),
    pytest.param("cupy", id="cupy", marks=[pytest.mark.gpu, GPU_SKIP]),
]


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
