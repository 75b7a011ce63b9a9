"""Allocator, eviction queue, radix tree, undo log and backend selection."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from kvpocket.impl import backend as backend_mod
from kvpocket.impl.allocator import FirstSlotPolicy, SlotAllocator
from kvpocket.impl.backend import NumpyBackend, gpu_available, make_backend
from kvpocket.impl.eviction import EvictionQueue
from kvpocket.impl.exceptions import DoubleReleaseError, SlotChoiceError
from kvpocket.impl.radix import ROOT, RadixTree
from kvpocket.impl.undo import Op


def test_allocator_preference_ready_then_fresh_then_not_ready() -> None:
    b = NumpyBackend(eager=False)
    s = b.new_stream("s")
    a = SlotAllocator(0, 0, 4)
    op = Op()
    for want in (0, 1, 2):
        assert FirstSlotPolicy().choose(0, 0, a.candidates(lambda e: True)) == want
        a.take(want, op)
    busy = b.new_event()
    b.launch(s, lambda: None)
    b.record(busy, s)
    a.release(0, (busy,), op)  # not ready yet
    a.release(1, (), op)  # ready
    ready = lambda evs: all(b.query(e) for e in evs)  # noqa: E731
    assert list(a.candidates(ready)) == [1, 3, 0]
    b.sim.drain()
    assert list(a.candidates(ready)) == [0, 1, 3]
    assert a.num_free == 3


def test_allocator_double_release_and_undo_restores_order() -> None:
    a = SlotAllocator(1, 0, 3)
    op = Op()
    for s in (0, 1, 2):
        a.take(s, op)
    a.release(2, (), op)
    a.release(0, (), op)
    with pytest.raises(DoubleReleaseError):
        a.release(0, (), op)
    with pytest.raises(DoubleReleaseError):
        a.release(7, (), op)
    state = (list(a.recycled), set(a.occupied), a.next_fresh)
    op2 = Op()
    a.take(0, op2)
    a.release(1, (), op2)
    op2.rollback()
    assert (list(a.recycled), set(a.occupied), a.next_fresh) == state
    with pytest.raises(SlotChoiceError):
        a.take(1, Op())  # occupied


def test_eviction_queue_order_and_exact_undo() -> None:
    q = EvictionQueue(0, 0)
    op = Op()
    q.push(10, 35, op)
    q.push(11, 20, op)
    q.push(12, 35, op)
    q.push(13, 20, op)
    assert q.ordered() == [11, 13, 10, 12]
    assert q.first() == 11
    op2 = Op()
    q.remove(13, op2)
    q.remove(11, op2)
    assert q.first() == 10
    op2.rollback()
    assert q.ordered() == [11, 13, 10, 12] and q.first() == 11
    op.rollback()
    assert len(q) == 0 and q.first() is None


def test_radix_tree_match_and_prune() -> None:
    tree = RadixTree(num_lcs=2, tokens_per_block=2)
    op = Op()
    n1 = tree.add(ROOT, (1, 2), op)
    n2 = tree.add(n1, (3, 4), op)
    tree.set_page(n1, 0, 100, op)
    tree.set_page(n1, 1, 101, op)
    tree.set_page(n2, 0, 102, op)
    assert tree.key(n2) == [1, 2, 3, 4]
    assert tree.match([1, 2, 3, 4, 5]) == [n1]  # n2 lacks lc 1
    tree.set_page(n2, 1, 103, op)
    assert tree.match([1, 2, 3, 4, 5]) == [n1, n2]
    assert tree.match([1, 9, 3, 4]) == []
    tree.unset_page(n2, 0, op)
    tree.unset_page(n2, 1, op)
    assert n2 not in tree.nodes and tree.nodes[n1].children == 0
    op.rollback()
    assert tree.nodes == {} and tree.index == {}


def test_make_backend_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match="numpy"):
        make_backend("tpu")


def test_auto_falls_back_to_numpy_without_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """cupy is installed here but there is no driver: auto must give NumPy, not crash."""
    monkeypatch.setattr(backend_mod, "_GPU_OK", None)
    if gpu_available(refresh=True):
        pytest.skip("a GPU is usable here; the fallback path is not reachable")
    be = make_backend("auto")
    assert isinstance(be, NumpyBackend) and be.name == "numpy"


def test_auto_falls_back_when_cupy_is_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        class cuda:
            class runtime:
                @staticmethod
                def getDeviceCount() -> int:
                    raise RuntimeError("cudaErrorInsufficientDriver")

    monkeypatch.setitem(sys.modules, "cupy", Broken())
    monkeypatch.setattr(backend_mod, "_GPU_OK", None)
    assert gpu_available(refresh=True) is False
    be: Any = make_backend("auto")
    assert isinstance(be, NumpyBackend)
    monkeypatch.setattr(backend_mod, "_GPU_OK", None)


def test_importing_impl_never_needs_cuda() -> None:
    import kvpocket.impl as impl

    assert hasattr(impl, "KVCacheManager")
    assert "kvpocket.impl.backend.cupy_backend" not in sys.modules or gpu_available()
