"""The SGLang target's adapter between releases: one driver, the API a release speaks.

SGLang's scheduler-side API moved between releases; the target detects what the loaded
release has (an attribute, a module, a parameter name) rather than reading its version:

- the tree: `SWARadixCache` (`mem_cache/swa_radix_cache.py`, up to 0.5.20, the tree a
  hybrid model gets there) or `UnifiedRadixCache` with FULL and SWA components (the only
  hybrid tree from 0.5.21); `KVPOCKET_SGLANG_TREE=unified` picks the unified tree where
  both ship;
- a request's KV bookkeeping: on `Req.kv` (a `ReqKvInfo`, from 0.5.19) or on the `Req`;
- the admission lock: `tree.lock(node)` kept in `req.lock`, or `inc_lock_ref` through the
  scheduler's own `PrefillAdder._req_inc_lock_ref` (a receipt in `req.lock_receipt`, or
  the SWA uuid in `req.swa_uuid_for_lock`);
- the matched prefix: `tree.prefix_device_indices(req)` or `req.prefix_indices`;
- the chunk's range: `req.extend_end`, `req.set_extend_range(start, end)` or
  `req.fill_len`;
- the out-of-window SWA free: `tree.evict_sliding_windows` or the scheduler's own
  `ScheduleBatch._evict_swa`, inside a free group where the scheduler opens one (0.5.18
  on);
- the chunk checkpoint: `common.checkpoint_kv_cache` or `tree.cache_unfinished_req`, in
  a free group where the scheduler opens one (the prefill's end, from 0.5.18);
- `release_kv_cache(checkpoint=...)` or `(is_insert=...)`; `release_req`'s keywords;
- the paged allocator's CPU path: from 0.5.22 it runs its naive readings of the triton
  kernels where triton is missing; before, it launches the kernels whatever the device,
  and `cpu_paged_allocation` points its launchers at the release's own
  `alloc_extend_naive` (`paged.py`), so that the paged presets run there too.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import types
from collections.abc import Iterator
from typing import Any

TREE_ENV = "KVPOCKET_SGLANG_TREE"  # "unified": the unified tree where SWARadixCache ships


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


class _NaiveLaunch:
    """A triton launcher's face (`kernel[grid](...)`) over the release's own naive
    reading of its allocation kernel: `alloc_extend_naive(prefix_lens, seq_lens,
    last_loc, free_pages, out_indices, page_size, device)`. A decode is the extend of one
    token. When the pool has too few pages the kernel's output is never read (the
    allocator returns None after it), so nothing is computed."""

    def __init__(self, naive: Any, decode: bool) -> None:
        self.naive, self.decode = naive, decode

    def __getitem__(self, grid: Any) -> Any:
        return self._launch

    def _launch(self, *args: Any) -> None:
        if self.decode:
            seq_lens, last_loc, free_pages, out, _, page = args
            prefix_lens = seq_lens - 1
        else:
            prefix_lens, seq_lens, last_loc, free_pages, out, _, page = args
        new_pages = (seq_lens + page - 1) // page - (prefix_lens + page - 1) // page
        if int(new_pages.sum()) > len(free_pages):
            return
        self.naive(prefix_lens, seq_lens, last_loc, free_pages, out, page, out.device)


def cpu_paged_allocation() -> bool:
    """Points the paged allocator's kernel launchers at its naive reading where the
    release has no CPU path of its own (before 0.5.22: no `alloc_decode_naive`) and
    triton cannot run. True when it did (the target says so in its report)."""
    paged = _optional("sglang.srt.mem_cache.allocator.paged")
    if paged is None or hasattr(paged, "alloc_decode_naive") \
            or not hasattr(paged, "alloc_extend_naive"):
        return False
    if not isinstance(paged.alloc_extend_kernel, _NaiveLaunch):
        paged.alloc_extend_kernel = _NaiveLaunch(paged.alloc_extend_naive, decode=False)
        paged.alloc_decode_kernel = _NaiveLaunch(paged.alloc_extend_naive, decode=True)
    return True


class Compat:
    """What the loaded SGLang release offers, detected once (`api().compat`)."""

    def __init__(self, batch: Any, common: Any, unified: Any = None, *,
                 swa_tree: Any = None, policy: Any = None, base: Any = None,
                 stats: Any = None) -> None:
        """The modules of the loaded release (`load` imports them); `batch` is
        `managers.schedule_batch`, `common` is `mem_cache.common`, `unified` the unified
        tree's module or None, `stats` the pool-stats observer or None."""
        self.batch, self.common, self.unified = batch, common, unified
        self.swa_tree, self.policy, self.base = swa_tree, policy, base
        # SGLang's own count of what a request holds, where the release has it
        self.stats: Any = stats if hasattr(stats, "kv_private_swa_tokens") else None
        release = inspect.signature(common.release_kv_cache).parameters
        self.release_keyword = "checkpoint" if "checkpoint" in release else "is_insert"
        self.release_req_keywords = set(inspect.signature(batch.release_req).parameters)

    @staticmethod
    def server_args() -> Any:
        """The scheduler's server args (releases whose `release_req` takes them)."""
        return importlib.import_module("sglang.srt.server_args").get_global_server_args()

    @classmethod
    def load(cls, batch: Any, common: Any, unified: Any) -> Compat:
        return cls(batch, common, unified,
                   swa_tree=_optional("sglang.srt.mem_cache.swa_radix_cache"),
                   policy=_optional("sglang.srt.managers.schedule_policy"),
                   base=importlib.import_module("sglang.srt.mem_cache.base_prefix_cache"),
                   stats=_optional(
                       "sglang.srt.managers.scheduler_components.pool_stats_observer"))

    # -- the tree ---------------------------------------------------------------------

    def tree_kind(self) -> str:
        """"swa" (SWARadixCache) or "unified" (UnifiedRadixCache)."""
        if self.swa_tree is not None and (self.unified is None
                                          or os.environ.get(TREE_ENV, "") != "unified"):
            return "swa"
        return "unified"

    def make_tree(self, params: Any) -> Any:
        if self.tree_kind() == "swa":
            return self.swa_tree.SWARadixCache(params=params)
        return self.unified.UnifiedRadixCache(params=params)

    # -- a request's KV bookkeeping ---------------------------------------------------

    def kv(self, sreq: Any) -> Any:
        """Where a request's row, lengths and SWA cursor live: `Req.kv` (0.5.19 on),
        the `Req` itself (before 0.5.18), or, in 0.5.18, split between the `Req` and a
        `ReqKvInfo` of two fields that the allocation creates (`_SplitKv`)."""
        if not hasattr(sreq, "kv"):
            return sreq
        info = getattr(self.batch, "ReqKvInfo", None)
        if info is not None and "req_pool_idx" not in getattr(info, "__annotations__", {}):
            return _SplitKv(sreq, info)
        return sreq.kv

    def swa_evicted(self, sreq: Any) -> int:
        kv = self.kv(sreq)
        if hasattr(kv, "get_evicted_seqlen"):
            return int(kv.get_evicted_seqlen(self.unified_swa_component()))
        return int(kv.swa_evicted_seqlen)

    def swa_dead_lo(self, sreq: Any, page: int) -> int:
        """The lowest position the request itself frees out of the window (below it,
        the tree's prefix, and a prefill-aware model's prompt: its `swa_evict_floor`,
        0.5.15 on; before 0.5.19, `free_swa_out_of_window_slots`' own max of the two)."""
        kv = self.kv(sreq)
        if hasattr(kv, "swa_dead_lo"):
            return int(kv.swa_dead_lo(page))
        return max(int(kv.cache_protected_len or 0), int(getattr(kv, "swa_evict_floor", 0) or 0))

    def unified_swa_component(self) -> Any:
        return importlib.import_module(
            "sglang.srt.mem_cache.unified_cache.components").ComponentType.SWA

    def held_tokens(self, sreq: Any, page: int) -> tuple[int, int]:
        """Full and SWA slots the request holds itself (not the tree's): its allocated
        pages past its protected prefix, less the SWA it freed out of the window
        (SGLang's `kv_private_tokens` / `kv_private_swa_tokens` where it has them)."""
        kv = self.kv(sreq)
        if self.stats is not None:
            return (int(self.stats.kv_private_tokens(kv, page)),
                    int(self.stats.kv_private_swa_tokens(kv, page)))
        allocated = (int(kv.kv_allocated_len) + page - 1) // page * page
        protected = int(kv.cache_protected_len or 0)
        freed = max(0, self.swa_evicted(sreq) - self.swa_dead_lo(sreq, page))
        return allocated - protected, allocated - protected - freed

    # -- admission ------------------------------------------------------------------

    def lock(self, tree: Any, sreq: Any) -> None:
        if hasattr(tree, "lock") and hasattr(sreq, "lock"):
            sreq.lock = tree.lock(sreq.last_node)
            return
        adder = types.SimpleNamespace(tree_cache=tree, is_hybrid_swa=True)
        self.policy.PrefillAdder._req_inc_lock_ref(adder, sreq)

    def unlock(self, tree: Any, sreq: Any) -> None:
        if hasattr(tree, "unlock") and hasattr(sreq, "lock"):
            tree.unlock(sreq.lock)
            sreq.lock = None
            return
        if getattr(sreq, "lock_receipt", None) is not None:
            tree.dec_lock_ref(sreq.last_node, sreq.lock_receipt)
            sreq.lock_receipt = None
        else:
            params = self.base.DecLockRefParams(
                swa_uuid_for_lock=getattr(sreq, "swa_uuid_for_lock", None))
            tree.dec_lock_ref(sreq.last_node, params)

    def prefix_len(self, sreq: Any) -> int:
        if hasattr(sreq, "prefix_len"):
            return int(sreq.prefix_len)
        return len(sreq.prefix_indices)

    def set_prefix_len(self, sreq: Any, n: int) -> None:
        if hasattr(sreq, "prefix_len"):
            sreq.prefix_len = n

    def prefix_indices(self, tree: Any, sreq: Any) -> Any:
        if hasattr(tree, "prefix_device_indices"):
            return tree.prefix_device_indices(sreq)
        return sreq.prefix_indices[:self.prefix_len(sreq)]

    @staticmethod
    def set_extend(sreq: Any, start: int, end: int) -> None:
        """Where the step's tokens end (`get_fill_ids` reads it): `extend_end`
        (0.5.21 on), `set_extend_range` (0.5.17 to 0.5.20) or `fill_len` (before)."""
        if hasattr(sreq, "set_extend_range"):
            sreq.set_extend_range(start, end)
        elif hasattr(sreq, "extend_end"):
            sreq.extend_end = end
        else:
            sreq.fill_len = end

    # -- the scheduler's frees and inserts --------------------------------------------

    @contextlib.contextmanager
    def free_group(self, alloc: Any) -> Iterator[None]:
        """The scheduler's `free_group_begin` / `free_group_end` around a batch's
        out-of-window frees, where the allocator has them."""
        if not hasattr(alloc, "free_group_begin"):
            yield
            return
        alloc.free_group_begin()
        try:
            yield
        finally:
            alloc.free_group_end()

    def evict_out_of_window(self, tree: Any, r2t: Any, alloc: Any, sreq: Any,
                            pre_len: int) -> None:
        """`ScheduleBatch.maybe_evict_swa` for one request: inside a free group from
        0.5.18 (the release of `prefill_free_group`), outside any before."""
        group: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if self.prefill_free_group(alloc):
            group = self.free_group(alloc)
        with group:
            if hasattr(tree, "evict_sliding_windows"):
                tree.evict_sliding_windows(sreq, pre_len)
            else:
                batch = types.SimpleNamespace(tree_cache=tree, req_to_token_pool=r2t,
                                              token_to_kv_pool_allocator=alloc)
                self.batch.ScheduleBatch._evict_swa(batch, sreq, pre_len)

    # The scheduler's decode result processing finishes a batch's requests inside one free
    # group; its prefill result processing checkpoints them inside one from 0.5.18 (not
    # before), and the stash of a middle chunk (`stash_chunked_request`) is outside any.
    # The target's batch is one request.

    @staticmethod
    def prefill_free_group(alloc: Any) -> bool:
        """Whether the prefill result processing opens a free group: from 0.5.18, the
        release whose allocators also copy what a group holds (`_copy_for_free_group`);
        before, a free inside a group kept a view of the `req_to_token` row, which the
        checkpoint then re-points, and the scheduler opened none there."""
        return hasattr(alloc, "_copy_for_free_group")

    def checkpoint(self, tree: Any, sreq: Any, chunked: bool = True) -> None:
        """Publish a running request's computed tokens: `chunked`, a middle chunk of its
        prefill (the scheduler's stash), else its prefill's end (the result processor's)."""
        alloc = tree.token_to_kv_pool_allocator
        group: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if not chunked and self.prefill_free_group(alloc):
            group = self.free_group(alloc)
        with group:
            if hasattr(self.common, "checkpoint_kv_cache"):
                self.common.checkpoint_kv_cache(sreq, tree)
            elif chunked:
                tree.cache_unfinished_req(sreq, chunked=True)
            else:
                tree.cache_unfinished_req(sreq)

    def release(self, tree: Any, sreq: Any) -> None:
        with self.free_group(tree.token_to_kv_pool_allocator):
            self.common.release_kv_cache(sreq, tree, **{self.release_keyword: True})

    def release_req(self, sreq: Any, r2t: Any, alloc: Any, tree: Any) -> None:
        kwargs: dict[str, Any] = dict(
            req=sreq, remaing_req_count=0, req_to_token_pool=r2t,
            token_to_kv_pool_allocator=alloc, tree_cache=tree, hisparse_coordinator=None,
            offload_kv=False)
        if "server_args" in self.release_req_keywords:
            kwargs["server_args"] = self.server_args()
        self.batch.release_req(**{k: v for k, v in kwargs.items()
                                  if k in self.release_req_keywords})


class _SplitKv:
    """0.5.18's request bookkeeping as one object: `kv_allocated_len` and
    `swa_evicted_seqlen` on `req.kv` (a `ReqKvInfo`, made on the first allocation as
    SGLang's `alloc_for_extend` makes it), everything else on the `Req`."""

    _ON_INFO = ("kv_allocated_len", "swa_evicted_seqlen")

    def __init__(self, req: Any, info: Any) -> None:
        object.__setattr__(self, "_req", req)
        object.__setattr__(self, "_info", info)

    def __getattr__(self, name: str) -> Any:
        req = object.__getattribute__(self, "_req")
        if name in _SplitKv._ON_INFO:
            return 0 if req.kv is None else getattr(req.kv, name)
        return getattr(req, name)

    def __setattr__(self, name: str, value: Any) -> None:
        req = object.__getattribute__(self, "_req")
        if name in _SplitKv._ON_INFO:
            if req.kv is None:
                if not value:
                    return
                req.kv = object.__getattribute__(self, "_info")(
                    kv_allocated_len=0, swa_evicted_seqlen=0)
            setattr(req.kv, name, value)
        else:
            setattr(req, name, value)
