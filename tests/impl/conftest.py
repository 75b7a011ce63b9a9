"""Fixtures of the implementation tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from impl_helpers import BACKENDS

from kvpocket.impl import KVCacheManager
from kvpocket.model.config import KVConfig


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
