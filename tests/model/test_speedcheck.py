"""The model's speed-structure checks (`model/speedcheck.py: SPEED_CHECKS`): clean on a
model that ran a workload, and each one fails when its structure is broken by hand."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from kvpocket.model import keyindex, speedcheck
from kvpocket.model.config import KVConfig, LifeCycle
from kvpocket.model.machine import Model
from kvpocket.model.sparse import SparseArray

CFG = KVConfig(tokens_per_block=2, life_cycles=(LifeCycle("swa", window=3),),
               slots_per_level=(6, 6), num_sequences=2, max_blocks=8)  # 16 tokens


def _busy(sparse_above: int = 256) -> Model:
    m = Model(CFG, sparse_above=sparse_above)
    m.create(0, [1, 2, 3, 4])
    m.resume(0)
    assert m.resize(0, 4, 0)
    m.commit(0, [1, 2, 3, 4])
    for h in range(5, 9):
        assert m.resize(0, h + 1, h)
        m.violations()
    m.create(1, [1, 2, 3, 4, 5])  # the prefix is found in the block-key table
    m.violations()
    assert speedcheck.check_speed_structures(m) == []
    return m


def _break_held(m: Model) -> None:
    m.checker._held.add("refcounts_match")
    last = m.checker.last
    assert last is not None
    m.checker._last = replace(last, holds=(9, *last.holds[1:]))


def _break_refs(m: Model) -> None:
    refs = m.checker.refs
    refs.positions.setdefault(12345, set()).add(0)


def _break_key_tables(m: Model) -> None:
    _, at, _ = keyindex.remembered(m.layout)[0]
    key = next(iter(at))
    at[key] = at[key] + 1 if at[key] else 1


def _break_resize_memo(m: Model) -> None:
    memo = m.layout.memo["resize_blocks"]
    key = next(k for k, (_, visits) in memo.items() if visits[2])
    conds, visits = memo[key]
    memo[key] = (conds, (visits[0], visits[1], visits[2][1:]))


def _break_sparse(m: Model) -> None:
    arr = m.state.alive
    assert isinstance(arr, SparseArray)
    arr._counts = (arr._counts[0] + 1, *arr._counts[1:])


BREAKS: dict[str, tuple[Callable[[Model], None], int]] = {  # name -> (break, sparse_above)
    "incremental checker's memory": (_break_held, 256),
    "entries-by-page index": (_break_refs, 256),
    "block-key tables": (_break_key_tables, 256),
    "remembered resize answers": (_break_resize_memo, 256),
    "sparse arrays": (_break_sparse, 0),
}


def test_every_speed_check_has_a_hand_made_break() -> None:
    assert set(BREAKS) == set(speedcheck.SPEED_CHECKS)


@pytest.mark.parametrize("name", list(BREAKS))
def test_a_broken_structure_fails_its_check(name: str) -> None:
    breaker, sparse_above = BREAKS[name]
    m = _busy(sparse_above)
    breaker(m)
    assert speedcheck.SPEED_CHECKS[name](m), f"{name}: the check passed a broken structure"
    assert any(line.startswith(f"{name}: ")
               for line in speedcheck.check_speed_structures(m))
