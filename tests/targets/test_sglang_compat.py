"""The SGLang target's release adapter (`sglang_compat.Compat`) on stand-in release
modules: which API it picks is decided by what a release has, not by its version. These
run in every interpreter (no SGLang needed)."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest

from kvpocket.verify.targets.sglang_compat import TREE_ENV, Compat


def _release_kv_cache_new(req: Any, tree: Any, *, checkpoint: bool) -> None:
    tree.calls.append(("release", checkpoint))


def _release_kv_cache_old(req: Any, tree: Any, is_insert: bool = True) -> None:
    tree.calls.append(("release", is_insert))


def _release_req_old(*, req: Any, remaing_req_count: int, server_args: Any,
                     req_to_token_pool: Any, token_to_kv_pool_allocator: Any,
                     tree_cache: Any, hisparse_coordinator: Any,
                     offload_kv: bool = True) -> None:
    tree_cache.calls.append(("release_req", server_args))


def _release_req_new(*, req: Any, remaing_req_count: int, req_to_token_pool: Any,
                     token_to_kv_pool_allocator: Any, tree_cache: Any,
                     hisparse_coordinator: Any, offload_kv: bool = True) -> None:
    tree_cache.calls.append(("release_req", offload_kv))


@dataclasses.dataclass
class FullKvInfo:  # 0.5.19 on: the whole bookkeeping on Req.kv
    req_pool_idx: int | None = None
    kv_allocated_len: int = 0
    cache_protected_len: int = 0
    swa_evicted_seqlen: int = 0


@dataclasses.dataclass
class TwoFieldKvInfo:  # 0.5.18: two fields on Req.kv, the rest on the Req
    kv_allocated_len: int
    swa_evicted_seqlen: int


def compat(*, new: bool, kv_info: type | None = None) -> Compat:
    batch = types.SimpleNamespace(release_req=_release_req_new if new else _release_req_old)
    if kv_info is not None:
        batch.ReqKvInfo = kv_info
    common = types.SimpleNamespace(
        release_kv_cache=_release_kv_cache_new if new else _release_kv_cache_old)
    return Compat(batch, common)


class Tree:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.token_to_kv_pool_allocator = types.SimpleNamespace()


def test_release_speaks_the_keyword_the_release_takes() -> None:
    for new in (True, False):
        tree = Tree()
        compat(new=new).release(tree, object())
        assert tree.calls == [("release", True)]
    assert compat(new=True).release_keyword == "checkpoint"
    assert compat(new=False).release_keyword == "is_insert"


def test_release_req_passes_server_args_only_where_taken() -> None:
    new, old = Tree(), Tree()
    compat(new=True).release_req(object(), None, None, new)
    assert new.calls == [("release_req", False)]
    c = compat(new=False)
    c.server_args = lambda: "the server args"  # type: ignore[method-assign]
    c.release_req(object(), None, None, old)
    assert old.calls == [("release_req", "the server args")]


def test_kv_is_where_the_release_keeps_it() -> None:
    whole = types.SimpleNamespace(kv=FullKvInfo(req_pool_idx=3))
    assert compat(new=True, kv_info=FullKvInfo).kv(whole) is whole.kv
    flat = types.SimpleNamespace(req_pool_idx=2, kv_allocated_len=5)
    assert compat(new=False).kv(flat) is flat


def test_split_kv_routes_two_fields_to_a_record_made_on_first_write() -> None:
    req: Any = types.SimpleNamespace(kv=None, req_pool_idx=1, cache_protected_len=4)
    kv = compat(new=False, kv_info=TwoFieldKvInfo).kv(req)
    assert kv.kv_allocated_len == 0 and kv.req_pool_idx == 1
    kv.kv_allocated_len = 0  # nothing to record yet: no record made
    assert req.kv is None
    kv.kv_allocated_len = 7
    assert req.__dict__["kv"] == TwoFieldKvInfo(kv_allocated_len=7, swa_evicted_seqlen=0)
    kv.cache_protected_len = 6
    assert req.cache_protected_len == 6 and not hasattr(req.kv, "cache_protected_len")
    assert kv.swa_evicted_seqlen == 0


@pytest.mark.parametrize("fields, expected", [
    ({"set_extend_range": True}, "range"), ({"extend_end": None}, "extend_end"),
    ({}, "fill_len")])
def test_the_extend_end_goes_where_get_fill_ids_reads_it(fields: dict[str, Any],
                                                         expected: str) -> None:
    req = types.SimpleNamespace(**{k: v for k, v in fields.items() if k != "set_extend_range"})
    if "set_extend_range" in fields:
        req.set_extend_range = lambda start, end: setattr(req, "range", (start, end))
    Compat.set_extend(req, 2, 6)
    assert getattr(req, expected) == ((2, 6) if expected == "range" else 6)


def test_held_tokens_without_sglangs_counters() -> None:
    c = compat(new=False)
    req = types.SimpleNamespace(kv_allocated_len=9, cache_protected_len=2,
                                swa_evicted_seqlen=5)
    # pages of 2: 10 allocated, 2 the tree's; SWA freed out of the window: [2, 5)
    assert c.held_tokens(req, 2) == (8, 5)
    req.swa_evicted_seqlen = 0
    assert c.held_tokens(req, 1) == (7, 7)


def test_tree_kind_prefers_the_legacy_tree_where_it_ships(monkeypatch: pytest.MonkeyPatch) -> None:
    c = compat(new=True)
    c.swa_tree = types.SimpleNamespace(SWARadixCache=lambda params: ("swa", params))
    c.unified = types.SimpleNamespace(UnifiedRadixCache=lambda params: ("unified", params))
    monkeypatch.delenv(TREE_ENV, raising=False)
    assert c.tree_kind() == "swa" and c.make_tree(1) == ("swa", 1)
    monkeypatch.setenv(TREE_ENV, "unified")
    assert c.tree_kind() == "unified" and c.make_tree(2) == ("unified", 2)
    c.swa_tree = None
    monkeypatch.delenv(TREE_ENV)
    assert c.tree_kind() == "unified"


def test_free_group_wraps_only_where_the_allocator_has_one() -> None:
    c = compat(new=True)
    seen: list[str] = []
    alloc = types.SimpleNamespace(free_group_begin=lambda: seen.append("begin"),
                                  free_group_end=lambda: seen.append("end"))
    with c.free_group(alloc):
        seen.append("free")
    assert seen == ["begin", "free", "end"]
    with c.free_group(types.SimpleNamespace()):
        seen.append("bare")
    assert seen[-1] == "bare" and seen.count("begin") == 1


def test_a_release_without_a_cpu_paged_path_runs_its_own_naive_reading() -> None:
    """Before 0.5.22 the paged allocator launches its triton kernels on any device; the
    target points the launchers at the release's own `alloc_extend_naive` (a decode as
    the extend of one token), and computes nothing where the pool lacks the pages (the
    allocator returns None after the launch)."""
    import torch

    from kvpocket.verify.targets.sglang_compat import _NaiveLaunch

    calls: list[tuple[list[int], list[int]]] = []

    def naive(prefix_lens: Any, seq_lens: Any, last_loc: Any, free_pages: Any, out: Any,
              page: int, device: Any) -> None:
        calls.append((prefix_lens.tolist(), seq_lens.tolist()))
        out.fill_(7)

    t = torch.tensor
    out = torch.zeros(1, dtype=torch.int64)
    # decode: position 4 of a 5-token sequence starts page 2 (page size 2): one new page
    _NaiveLaunch(naive, decode=True)[(1,)](t([5]), t([3]), t([9]), out, 1, 2)
    assert calls == [([4], [5])] and out.tolist() == [7]
    # an extend of 1 to 7 tokens needs 3 new pages; the pool has 2: nothing computed
    _NaiveLaunch(naive, decode=False)[(1,)](t([1]), t([7]), t([0]), t([3, 4]),
                                             torch.zeros(6, dtype=torch.int64), 1, 2)
    assert len(calls) == 1


@pytest.mark.parametrize(("copies", "chunked", "grouped"), [
    (True, False, True), (True, True, False), (False, False, False), (False, True, False)])
def test_a_checkpoint_is_grouped_where_the_scheduler_groups_it(copies: bool, chunked: bool,
                                                               grouped: bool) -> None:
    # the prefill's end from 0.5.18 (whose allocators copy a group's frees); a middle
    # chunk's stash never
    seen: list[str] = []
    alloc = types.SimpleNamespace(free_group_begin=lambda: seen.append("begin"),
                                  free_group_end=lambda: seen.append("end"))
    if copies:
        alloc._copy_for_free_group = lambda index: index
    tree = types.SimpleNamespace(
        token_to_kv_pool_allocator=alloc,
        cache_unfinished_req=lambda req, chunked=False: seen.append(f"insert {chunked}"))
    compat(new=False).checkpoint(tree, object(), chunked=chunked)
    assert seen == (["begin", "insert False", "end"] if grouped else [f"insert {chunked}"])
