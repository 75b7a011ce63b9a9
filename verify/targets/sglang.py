"""SGLang's real KV cache bookkeeping as a kvpocket target.

`SglangTarget.build` makes the pinned release's memory cache the way SGLang's own CPU unit
tests do (no GPU, no model, `device="cpu"`, the Python tree core): a `ReqToTokenPool`, a
`SWAKVPool` of tiny tensors with its `SWATokenToKVPoolAllocator` (a full-attention and a
sliding-window pool, token or paged), and a `UnifiedRadixCache` with FULL and SWA
components. `SglangInstance.step` plays the scheduler's part for one workload op with
SGLang's own scheduler-side functions and `Req` objects: `Req.init_next_round_input`
(the prefix match), `tree_cache.lock` (admission), `alloc_token_slots` /
`alloc_paged_token_slots_extend` / `alloc_paged_token_slots_decode` (which evict from the
tree under pressure, SWA only or both), the out-of-window SWA frees of
`ScheduleBatch.maybe_evict_swa` (`tree_cache.evict_sliding_windows`), `checkpoint_kv_cache`
after a chunk, `release_req` to retract and `release_kv_cache(checkpoint=True)` to finish
with the cache insert. After every op it runs the checks of `sglang_checks.py`
(docs/targets/sglang.md). The all-SWA presets (groups `("swa",)`) build what SGLang builds
for a model without full-attention layers instead: `PureSWATokenToKVPoolAllocator` (one
pool) and `PureSWARadixCache`; the scheduler's part is the same calls, with a
prefill-aware model's evict floor where the preset says so.

SGLang is imported lazily (tens of seconds of CPU) and only here; without it, `version`
raises `TargetUnavailable` with the one line that says what to install.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import inspect
import io
import logging
import os
from array import array
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kvpocket.verify.targets.base import (
    SCHEDULER_STEP,
    CheckFailure,
    KnownBug,
    StepStats,
    TargetConfig,
    TargetUnavailable,
    bugs_present,
    installed_version,
    is_installed,
    widened_avoidance,
)
from kvpocket.verify.targets.data_oracle import PrefixStamps
from kvpocket.verify.targets.sglang_checks import PoolState, check_state
from kvpocket.verify.targets.sglang_compat import Compat, cpu_paged_allocation
from kvpocket.verify.targets.workload import Identity, Op, Request, Requests

INSTALL_HINT = ("SGLang is not installed in this Python: run scripts/sglang.sh (pip cannot "
                "install sglang on a CPU machine: its metadata pins a CUDA torch; "
                "docs/targets/sglang.md)")

# Engine options a preset sets (TargetConfig.options).
OPT_SWA_TOKENS = "swa_tokens"  # size of the sliding-window pool, in tokens
OPT_MAX_REQUESTS = "max_requests"  # rows of the ReqToTokenPool
# An all-SWA model whose prefill stays out of the window frees (the model runner's
# `prefill_aware_swa`): the scheduler sets `req.kv.swa_evict_floor` to the end of each
# prefill batch's extend
OPT_PREFILL_AWARE = "prefill_aware_swa"

# The kinds of model a preset stands for (TargetConfig.groups).
HYBRID_GROUPS = ("full", "swa")
ALL_SWA_GROUPS = ("swa",)  # every layer sliding-window: PureSWARadixCache

# The rare states of the target (docs/targets/sglang.md), counted like vLLM's: a run that
# reaches none of one is a coverage gap (exit 3).
RARE_SWA_OUT_OF_WINDOW = "decode freed out-of-window SWA slots"
RARE_SWA_ONLY_EVICTION = "SWA-only eviction (tombstones made)"
RARE_FULL_EVICTION = "eviction of full and SWA"
RARE_TOMBSTONE_INSERT = "insert of a request with its SWA prefix freed"
RARE_HIT_FULL_POOL = "hit into a nearly full pool"
RARE_CHUNK_CHECKPOINT = "chunked prefill checkpointed into the tree"
RARE_RETRACT_HIT = "re-admitted after retraction with a hit"
RARE_SALT_HIT = "prefix hit under a cache salt"
RARE_LORA_HIT = "prefix hit under a LoRA adapter"
RARE_STATES = (RARE_SWA_OUT_OF_WINDOW, RARE_SWA_ONLY_EVICTION, RARE_FULL_EVICTION,
               RARE_TOMBSTONE_INSERT, RARE_HIT_FULL_POOL, RARE_CHUNK_CHECKPOINT,
               RARE_RETRACT_HIT, RARE_SALT_HIT, RARE_LORA_HIT)
# The all-SWA presets' (no full pool, no tombstones, nothing SWA-only to evict).
RARE_PURE_EVICTION = "eviction from the all-SWA tree"
RARE_PURE_FINISH_AFTER_WINDOW = "finished insert after out-of-window frees"
RARE_PURE_RETRACT_AFTER_WINDOW = "retracted after out-of-window frees"
RARE_PURE_HIT_AFTER_WINDOW = "prefix hit on a request finished after out-of-window frees"
RARE_PURE_RETRACT_SHIELDED = "retracted with KV past its evict floor before any window free"
PURE_RARE_STATES = (RARE_SWA_OUT_OF_WINDOW, RARE_PURE_EVICTION, RARE_PURE_FINISH_AFTER_WINDOW,
                    RARE_PURE_RETRACT_AFTER_WINDOW, RARE_PURE_HIT_AFTER_WINDOW,
                    RARE_HIT_FULL_POOL, RARE_CHUNK_CHECKPOINT, RARE_RETRACT_HIT,
                    RARE_SALT_HIT, RARE_LORA_HIT)

# Engine bugs the default still reports (base.KnownBug; `fuzz --avoid-known` steers clear of
# those of the release installed, docs/targets/sglang.md, "Real bugs"). Both are steered
# clear of through the request's SWA evict floor, set or cleared just before its release
# as SGLang's scheduler leaves it for a prefill-aware model (the floor at its prefill's
# end, which is its protected prefix) or for any other (0): the frees its decode made are
# the same either way (below the floor, the tree's prefix).
BUG_PURE_RECACHE = "pure-swa-recache-window-evicted"
BUG_PURE_REFREE = "pure-swa-refree-window-evicted"
BUG_PURE_TAIL = "pure-swa-tail-not-freed"
KNOWN_BUGS = {
    BUG_PURE_RECACHE: KnownBug(
        "all-SWA, evict floor 0 (a model that is not prefill-aware): the finished insert of "
        "a request that freed KV out of the window takes its whole row, the freed slots "
        "again (sglang#31486, closed unmerged)"),
    BUG_PURE_REFREE: KnownBug(
        "all-SWA, evict floor 0: a request released without the insert (retracted) after "
        "freeing KV out of the window frees those slots again (sglang#31486's other half; "
        "gone with 0.5.21's release path)", fixed_in="0.5.21"),
    BUG_PURE_TAIL: KnownBug(
        "all-SWA, evict floor set (a prefill-aware model): a request released without the "
        "insert before any window free leaks its KV past the floor (sglang#38349)",
        fixed_in="0.5.20"),
}

PRESETS: dict[str, TargetConfig] = {
    p.name: p for p in (
        TargetConfig("hybrid", block_size=1, num_blocks=24, groups=("full", "swa"),
                     sliding_window=4, max_model_len=20,
                     options=((OPT_MAX_REQUESTS, 4), (OPT_SWA_TOKENS, 12)),
                     description="UnifiedRadixCache with FULL and SWA components, token "
                     "pools (page size 1): 24 full-attention slots, 12 sliding-window "
                     "slots, window 4"),
        TargetConfig("hybrid-paged", block_size=2, num_blocks=12, groups=("full", "swa"),
                     sliding_window=4, max_model_len=20,
                     options=((OPT_MAX_REQUESTS, 4), (OPT_SWA_TOKENS, 12)),
                     description="the hybrid preset with paged pools (page size 2): 12 "
                     "full pages, 6 sliding-window pages"),
        TargetConfig("hybrid-paged-odd", block_size=2, num_blocks=12, groups=("full", "swa"),
                     sliding_window=3, max_model_len=20,
                     options=((OPT_MAX_REQUESTS, 4), (OPT_SWA_TOKENS, 12)),
                     description="paged pools (page size 2) with a window of 3, not a "
                     "whole number of pages: the out-of-window free's page rounding"),
        TargetConfig("hybrid-tight", block_size=1, num_blocks=16, groups=("full", "swa"),
                     sliding_window=3, max_model_len=16,
                     options=((OPT_MAX_REQUESTS, 3), (OPT_SWA_TOKENS, 8)),
                     description="a smaller pool and window (16 full slots, 8 "
                     "sliding-window slots, window 3): SWA pressure within a few ops"),
        TargetConfig("swa", block_size=1, num_blocks=16, groups=ALL_SWA_GROUPS,
                     sliding_window=4, max_model_len=16, options=((OPT_MAX_REQUESTS, 4),),
                     description="an all-SWA model (every layer sliding-window, as "
                     "Mistral-7B-v0.1): PureSWARadixCache over PureSWATokenToKVPoolAllocator, "
                     "one pool of 16 slots, window 4"),
        TargetConfig("swa-paged", block_size=2, num_blocks=8, groups=ALL_SWA_GROUPS,
                     sliding_window=4, max_model_len=16, options=((OPT_MAX_REQUESTS, 4),),
                     description="the swa preset at page size 2 (8 pages): no release "
                     "so far builds it (PureSWATokenToKVPoolAllocator asserts page size 1)"),
        TargetConfig("swa-prefill-aware", block_size=1, num_blocks=16, groups=ALL_SWA_GROUPS,
                     sliding_window=4, max_model_len=16,
                     options=((OPT_MAX_REQUESTS, 4), (OPT_PREFILL_AWARE, True)),
                     description="the swa preset for a prefill-aware model "
                     "(is_prefill_aware_swa): each prefill sets the request's SWA evict "
                     "floor, its prompt is never freed out of the window"),
    )
}


def sglang_version() -> str:
    """The installed SGLang's version, without importing it."""
    return installed_version(("sglang",), INSTALL_HINT)


def sglang_available() -> bool:
    return is_installed(("sglang",))


class _Api:
    """The parts of SGLang the target uses, imported once."""

    def __init__(self) -> None:
        # SGLang's own CPU tests run the unified tree's Python core.
        os.environ.setdefault("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")
        from kvpocket.verify.targets import sglang_stubs  # stubs go in only when SGLang loads

        sglang_stubs.install()
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # CUDA-only quantization warnings
                self.torch: Any = importlib.import_module("torch")
                self.server_args: Any = importlib.import_module("sglang.srt.server_args")
                # the SWA allocator moved to allocator/swa.py in 0.5.13
                self.swa_alloc: Any = _first_module("sglang.srt.mem_cache.allocator.swa",
                                                    "sglang.srt.mem_cache.swa_memory_pool")
                self.swa_pool: Any = importlib.import_module("sglang.srt.mem_cache.swa_memory_pool")
                self.memory_pool: Any = importlib.import_module("sglang.srt.mem_cache.memory_pool")
                self.init_params: Any = importlib.import_module(
                    "sglang.srt.mem_cache.cache_init_params")
                # the unified tree with its components (0.5.17 on; the one hybrid tree
                # from 0.5.21); before, SWARadixCache alone
                self.unified: Any = _optional_module("sglang.srt.mem_cache.unified_radix_cache")
                # the all-SWA tree (0.5.15 on)
                self.pure_tree: Any = _optional_module(
                    "sglang.srt.mem_cache.pure_swa_radix_cache")
                self.components: Any = _optional_module(
                    "sglang.srt.mem_cache.unified_cache.components")
                if self.components is None:
                    self.unified = None
                self.batch: Any = importlib.import_module("sglang.srt.managers.schedule_batch")
                self.sampling: Any = importlib.import_module(
                    "sglang.srt.sampling.sampling_params")
                self.common: Any = importlib.import_module("sglang.srt.mem_cache.common")
                # the allocation helpers left common.py in 0.5.16
                self.allocation: Any = _first_module("sglang.srt.mem_cache.allocation",
                                                     "sglang.srt.mem_cache.common")
                self.compat = Compat.load(self.batch, self.common, self.unified)
                self.naive_paged = cpu_paged_allocation()
        except ImportError as exc:
            raise TargetUnavailable(f"{INSTALL_HINT} ({exc})") from None
        for name in ("sglang", "sglang.srt"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        # `Req` takes the cache salt apart from the extra key from 0.5.18 on
        self.req_takes_salt = "cache_salt" in inspect.signature(self.batch.Req).parameters


def _accepted(cls: Any, **optional: Any) -> dict[str, Any]:
    """The keyword arguments of `optional` that `cls` takes by name (a parameter a
    release added or dropped: SWAKVPool's `enable_kvcache_transpose`, 0.5.14 and before)."""
    params = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in optional.items() if k in params}


def _optional_module(name: str) -> Any:
    """The module, or None where the release does not have it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not name.startswith(exc.name):
            raise
        return None


def _first_module(*names: str) -> Any:
    """The first of `names` that imports (a module that moved between releases)."""
    for name in names[:-1]:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
    return importlib.import_module(names[-1])


_API: _Api | None = None


def api() -> _Api:
    global _API
    if _API is None:
        _API = _Api()
    return _API


def _ceil(n: int, page: int) -> int:
    return (n + page - 1) // page * page


class SglangInstance:
    """One SGLang memory cache under test plus the scheduler state that drives it.

    `allocator_class` replaces the SWA allocator's class with a subclass (a deliberately
    broken copy, in tests); the installed package is never patched.
    """

    def __init__(self, cfg: TargetConfig, allocator_class: type | None = None,
                 avoid: frozenset[str] = frozenset()) -> None:
        self.cfg = cfg
        self.avoid = avoid  # the known engine bugs (KNOWN_BUGS) this run steers clear of
        self.api = a = api()
        self.stats = StepStats()
        self.page = cfg.block_size
        self.window = cfg.sliding_window
        # An all-SWA model (every layer sliding-window): one pool, PureSWARadixCache
        self.pure = tuple(cfg.groups) == ALL_SWA_GROUPS
        self.prefill_aware = bool(cfg.option(OPT_PREFILL_AWARE, False))
        if self.pure:
            self.full_size, self.swa_size = 0, cfg.num_blocks * cfg.block_size
        else:
            self.full_size = cfg.num_blocks * cfg.block_size
            self.swa_size = int(cfg.option(OPT_SWA_TOKENS, self.full_size))
        a.server_args.set_global_server_args_for_scheduler(
            a.server_args.ServerArgs(model_path="dummy", page_size=self.page))
        self.r2t = a.memory_pool.ReqToTokenPool(
            size=int(cfg.option(OPT_MAX_REQUESTS, 4)), max_context_len=cfg.max_model_len + 4,
            device="cpu", enable_memory_saver=False)
        self.compat = a.compat
        if self.pure:
            self.alloc, self.tree = self._build_pure(allocator_class)
        else:
            self.alloc, self.tree = self._build_hybrid(allocator_class)
        self.requests = Requests(cfg.shape())
        self.sreqs: dict[str, Any] = {}
        self.prefix = PrefixStamps()
        self.prefix_ids: dict[str, list[int]] = {}
        self.retracted: set[str] = set()
        # stamps of the positions requests that had freed out of the window held when
        # they finished (a later hit on them: RARE_PURE_HIT_AFTER_WINDOW)
        self.finished_after_window: set[int] = set()
        self.state = PoolState(self.full_size, self.swa_size, self.page, self.window,
                               pure=self.pure)

    def _kv_pool(self, full_layers: list[int]) -> Any:
        a = self.api
        return a.swa_pool.SWAKVPool(
            size=self.full_size, size_swa=self.swa_size, page_size=self.page,
            dtype=a.torch.float32, head_num=1, head_dim=1, swa_attention_layer_ids=[0],
            full_attention_layer_ids=full_layers, device="cpu",
            **_accepted(a.swa_pool.SWAKVPool, enable_kvcache_transpose=False))

    def _build_hybrid(self, allocator_class: type | None) -> tuple[Any, Any]:
        """A hybrid model's: two pools, the hybrid tree (`Compat.make_tree`)."""
        a = self.api
        kv = self._kv_pool([1])
        cls = allocator_class or a.swa_alloc.SWATokenToKVPoolAllocator
        alloc = cls(size=self.full_size, size_swa=self.swa_size, page_size=self.page,
                    dtype=a.torch.float32, device="cpu", kvcache=kv, need_sort=False)
        extra: dict[str, Any] = {}
        if a.components is not None:
            ct = a.components.ComponentType
            extra["tree_components"] = (ct.FULL, ct.SWA)
        return alloc, self.compat.make_tree(self._params(alloc, **extra))

    def _build_pure(self, allocator_class: type | None) -> tuple[Any, Any]:
        """An all-SWA model's, as the model runner and `registry.py` build it when the
        model has no full-attention layer (`full_max_total_num_tokens == 0`): an
        `SWAKVPool` without full layers, `PureSWATokenToKVPoolAllocator` (one pool,
        `full_attn_allocator is swa_attn_allocator`), `PureSWARadixCache`."""
        a = self.api
        pure_alloc = getattr(a.swa_alloc, "PureSWATokenToKVPoolAllocator", None)
        if a.pure_tree is None or pure_alloc is None:
            raise TargetUnavailable(
                f"SGLang {sglang_version()} has no all-SWA cache (PureSWARadixCache, "
                f"PureSWATokenToKVPoolAllocator: 0.5.15.post1 has them, 0.5.14 not): "
                f"config {self.cfg.name} needs it")
        kv = self._kv_pool([])
        cls = allocator_class or pure_alloc
        try:
            alloc = cls(size_swa=self.swa_size, page_size=self.page, dtype=a.torch.float32,
                        device="cpu", kvcache=kv, need_sort=False)
        except AssertionError:
            if self.page == 1:
                raise
            raise TargetUnavailable(
                f"SGLang {sglang_version()}'s PureSWATokenToKVPoolAllocator takes page size "
                f"1 only (it asserts page_size == 1, so an all-SWA model does not start "
                f"paged): config {self.cfg.name} has page size {self.page}") from None
        return alloc, a.pure_tree.PureSWARadixCache(params=self._params(alloc))

    def _params(self, alloc: Any, **extra: Any) -> Any:
        return self.api.init_params.CacheInitParams(
            req_to_token_pool=self.r2t, token_to_kv_pool_allocator=alloc,
            page_size=self.page, disable=False, sliding_window_size=self.window,
            eviction_policy="lru", **extra)

    # -- the scheduler's part ---------------------------------------------------------

    def _quiet(self) -> contextlib.AbstractContextManager[Any]:
        """SGLang prints its tree when an allocation fails; the target handles that."""
        return contextlib.redirect_stdout(io.StringIO())

    def _new_req(self, req: Request) -> Any:
        a = self.api
        sp = a.sampling.SamplingParams(temperature=0, max_new_tokens=self.cfg.max_model_len)
        sreq = a.batch.Req(rid=req.rid, origin_input_text="",
                           origin_input_ids=array("q", req.tokens), sampling_params=sp,
                           **self._namespace(req.identity))
        return sreq

    def _namespace(self, ident: Identity) -> dict[str, Any]:
        """The `Req` arguments that namespace its radix keys, as SGLang's server sets them:
        a LoRA adapter's unique id (`lora_id`, a uuid's 32 hex digits; `Req` appends it to
        the extra key), and the cache salt (`cache_salt` where `Req` takes one, from
        0.5.18; before, the OpenAI layer passed the salt as the extra key)."""
        out: dict[str, Any] = {}
        if ident.adapter is not None:
            out["lora_id"] = f"{ident.adapter[1]:032x}"
        if ident.salt is not None:
            out["cache_salt" if self.api.req_takes_salt else "extra_key"] = ident.salt
        return out

    def _stamp_root(self, ident: Identity) -> int:
        """An adapter's weights change every token's KV; a salt changes none."""
        return 0 if ident.adapter is None else self.prefix.rooted(("lora", ident.adapter[2]))

    def step(self, op: Op) -> None:
        self.stats.hit(op.kind)
        if op.kind in ("arrive", "again"):
            req = self.requests.new(*op.args) if op.kind == "arrive" \
                else self.requests.again(op.args[0])
            if req is None:
                self.stats.hit("no_request")
            else:
                self._arrived(req)
                if op.kind == "again":
                    self._schedule(req, op.args[1] if len(op.args) > 1 else 1)
        elif op.kind == "reset":
            self._reset(bool(op.args and op.args[0] % 2))
        elif op.kind == "fill":
            self._fill(op.args[0] if op.args else 0)
        elif op.kind == "load":
            # No KV connector here: a load admits the waiting request it names.
            waiting = [r for r in self.requests.live if not r.running]
            if not waiting:
                self.stats.hit("no_waiting_request")
            else:
                self.stats.hit("load_as_admission")
                self._schedule(waiting[op.args[0] % len(waiting)], op.args[1])
        else:
            picked = self.requests.pick(op.args[0])
            if picked is None:
                self.stats.hit("no_request")
            elif op.kind == "schedule":
                for _ in range(op.args[2] if len(op.args) > 2 else 1):
                    if picked not in self.requests.live:
                        break
                    self._schedule(picked, op.args[1])
                    if not picked.running:
                        break
            elif op.kind == "preempt":
                self._retract(picked)
            else:
                self._finish(picked)
        self.check()

    def _arrived(self, req: Request) -> None:
        self.sreqs[req.rid] = self._new_req(req)
        self.prefix_ids[req.rid] = self.prefix.of(req.tokens, [], self._stamp_root(req.identity))

    def _fill(self, over: int) -> None:
        """`fill(over)`: a fresh request, prefilled whole at once, sized to the free slots
        (the fewer of the two pools', page-floored; `over` pages past them evicts the
        tree's oldest evictable pages): what is left free is then the tree's evictable
        pages, as in a warm server."""
        free = min(int(self.alloc.full_available_size()), int(self.alloc.swa_available_size()))
        n = min(self.cfg.max_model_len - 1, (free // self.page + over) * self.page)
        if n <= 0:
            self.stats.hit("fill_nothing")
            return
        req = self.requests.filler(n)
        self._arrived(req)
        self._schedule(req, n)
        if req.running:
            self.stats.hit("filled")

    def _schedule(self, req: Request, budget: int) -> None:
        if not req.running:
            self._admit(req, budget)
        elif req.computed < len(req.tokens) and req.computed < self._prefill_len(req):
            self._extend(req, budget)
        else:
            self._decode(req)

    def _prefill_len(self, req: Request) -> int:
        """Tokens the request's prefill covers: its prompt, and after a retraction its
        output so far (SGLang re-prefills origin + output)."""
        return len(self.sreqs[req.rid].origin_input_ids) + len(self.sreqs[req.rid].output_ids)

    def _chunk_end(self, start: int, budget: int, total: int) -> int:
        """Where a prefill chunk of up to `budget` tokens from `start` ends: the end of
        the prefill, or a page boundary (SGLang's chunks are page-aligned)."""
        if start + budget >= total:
            return total
        end = (start + budget) // self.page * self.page
        if end <= start:
            end = min(total, (start // self.page + 1) * self.page)
        return end

    def _admit(self, req: Request, budget: int) -> None:
        """A waiting request's admission, as `PrefillAdder` and `alloc_for_extend` do it:
        the match, the lock on its last node, a row, the chunk's slots."""
        sreq = self.sreqs[req.rid]
        sreq.init_next_round_input(self.tree)
        c = self.compat
        hit = c.prefix_len(sreq)
        total = self._prefill_len(req)
        end = self._chunk_end(hit, budget, total)
        self.stats.hit(SCHEDULER_STEP)
        before = self.state.tree_sizes(self)
        c.set_extend(sreq, hit, end)
        c.lock(self.tree, sreq)
        prefix: Any = c.prefix_indices(self.tree, sreq) if hit else None
        if hit:
            self.stats.hit("prefix_hit")
            if req.rid in self.retracted:
                self.stats.hit(RARE_RETRACT_HIT)
            if req.identity.salt is not None:
                self.stats.hit(RARE_SALT_HIT)
            if req.identity.adapter is not None:
                self.stats.hit(RARE_LORA_HIT)
            self.state.check_hit(self, req, [int(x) for x in prefix.tolist()], hit)
            if self.finished_after_window.intersection(self.prefix_ids[req.rid][:hit]):
                self.stats.hit(RARE_PURE_HIT_AFTER_WINDOW)
        if self.r2t.available_size() < 1:
            c.unlock(self.tree, sreq)
            self.stats.hit("admission_refused_no_row")
            return
        self.r2t.alloc([sreq])
        kv = c.kv(sreq)
        idx = kv.req_pool_idx
        if hit:
            self.r2t.write((idx, slice(0, hit)), prefix.to(self.api.torch.int32))
        got = self._alloc_extend(sreq, hit, end)
        if got is None:  # the pool is full even after eviction: not admitted
            c.unlock(self.tree, sreq)
            self.r2t.free(sreq)
            kv.req_pool_idx = None
            kv.kv_allocated_len = kv.kv_committed_len = 0
            c.set_prefix_len(sreq, 0)
            self.stats.hit("admission_refused")
            return
        self.state.note_evictions(self, before)
        if hit and self.state.evicted_now:
            self.stats.hit(RARE_HIT_FULL_POOL)
        req.running = True
        kv.cache_protected_len = kv.cache_protected_len or 0
        self._shield_prefill(sreq, end)
        self._compute(req, hit, end)
        self._after_extend(req, end, total)

    def _extend(self, req: Request, budget: int) -> None:
        """The next prefill chunk of a running request."""
        sreq = self.sreqs[req.rid]
        start = req.computed
        end = self._chunk_end(start, budget, self._prefill_len(req))
        self.stats.hit(SCHEDULER_STEP)
        before = self.state.tree_sizes(self)
        self.compat.set_prefix_len(sreq, start)
        self.compat.set_extend(sreq, start, end)
        if self._alloc_extend(sreq, start, end) is None:
            self.stats.hit("out_of_memory")
            self._retract(req)
            return
        self.state.note_evictions(self, before)
        self._shield_prefill(sreq, end)
        self._compute(req, start, end)
        self._after_extend(req, end, self._prefill_len(req))

    def _shield_prefill(self, sreq: Any, end: int) -> None:
        """A prefill-aware model's: after `prepare_for_extend` the scheduler sets every
        admitted request's `swa_evict_floor` to its extend's end (`prefill_aware_swa`)."""
        if self.prefill_aware:
            self.compat.kv(sreq).swa_evict_floor = end

    def _after_extend(self, req: Request, end: int, total: int) -> None:
        """What the computed chunk puts into the tree, as the scheduler does: a middle
        chunk is stashed (`stash_chunked_request`), and the last one too, since the
        result processor checkpoints every unfinished request after a prefill batch
        (`checkpoint_kv_cache`, `maybe_cache_unfinished_req` before 0.5.21). Skipping
        the last one left a branch point pending that 0.5.22's finished insert tripped
        over: docs/targets/sglang.md, "Older releases"."""
        sreq = self.sreqs[req.rid]
        self.stats.hit("prefill_chunk")
        evicted = self.compat.swa_evicted(sreq)
        self.compat.checkpoint(self.tree, sreq, chunked=end < total)
        if end < total:
            self.stats.hit(RARE_CHUNK_CHECKPOINT)
        else:
            self.compat.set_prefix_len(sreq, end)
            self.stats.hit("prefill_end_checkpoint")
        if evicted and not self.pure:
            self.stats.hit(RARE_TOMBSTONE_INSERT)

    def _fits(self, tokens: int) -> bool:
        """The scheduler's capacity check before it allocates (`PrefillAdder`'s budget,
        `check_decode_mem`): available + evictable in each pool. SGLang's paged SWA
        allocator keeps the full pages it took when the SWA side then fails
        (`alloc_extend` / `alloc_decode` return None without giving them back), a path
        the scheduler's checks keep it from; docs/targets/sglang.md."""
        t, a = self.tree, self.alloc
        swa = int(a.swa_available_size()) + int(t.swa_evictable_size()) >= tokens
        if self.pure:  # the one pool (`SWAPrefillBudget(all_swa=True)`)
            return swa
        return swa and int(a.full_available_size()) + int(t.full_evictable_size()) >= tokens

    def _alloc_extend(self, sreq: Any, start: int, end: int) -> Any:
        """Slots for positions [start, end) of the request's row, written into it as
        `alloc_for_extend` does; None when the pool cannot hold them."""
        a, torch = self.api, self.api.torch
        kv = self.compat.kv(sreq)
        idx = kv.req_pool_idx
        n = end - start
        if not self._fits(_ceil(end, self.page) - _ceil(start, self.page) + self.page):
            return None
        try:
            with self._quiet():
                if self.page == 1:
                    loc = a.allocation.alloc_token_slots(self.tree, n)
                else:
                    last = self.r2t.req_to_token[idx, start - 1:start].to(torch.int64) \
                        if start else torch.full((1,), -1, dtype=torch.int64)
                    loc = a.allocation.alloc_paged_token_slots_extend(
                        tree_cache=self.tree,
                        prefix_lens=torch.tensor([start], dtype=torch.int64),
                        prefix_lens_cpu=torch.tensor([start], dtype=torch.int64),
                        seq_lens=torch.tensor([end], dtype=torch.int64),
                        seq_lens_cpu=torch.tensor([end], dtype=torch.int64),
                        last_loc=last, extend_num_tokens=n)
        except RuntimeError:
            return None
        self.r2t.write((idx, slice(start, end)), loc.to(torch.int32))
        kv.kv_allocated_len = kv.kv_committed_len = end
        return loc

    def _decode(self, req: Request) -> None:
        """One decode step, as `prepare_for_decode` does it: the sampled token is
        appended, out-of-window SWA slots are freed (`maybe_evict_swa`), one slot is
        allocated for the new position."""
        a, torch = self.api, self.api.torch
        sreq = self.sreqs[req.rid]
        n = req.next_chunk(1, self.cfg.max_model_len)
        if n == 0:
            self.stats.hit("finished_at_max_len")
            self._finish(req)
            return
        sreq.output_ids.append(req.tokens[-1])
        self.prefix.of(req.tokens, self.prefix_ids[req.rid])
        self.stats.hit(SCHEDULER_STEP)
        seqlen = len(req.tokens)
        before = self.state.tree_sizes(self)
        if sreq.decode_batch_idx >= 1:  # the scheduler's gate (the overlap schedule)
            was = self.compat.swa_evicted(sreq)
            self.compat.evict_out_of_window(self.tree, self.r2t, self.alloc, sreq, seqlen - 1)
            if self.compat.swa_evicted(sreq) > was:
                self.stats.hit(RARE_SWA_OUT_OF_WINDOW)
        kv = self.compat.kv(sreq)
        idx = kv.req_pool_idx
        fits = self._fits(self.page if (seqlen - 1) % self.page == 0 else 0)
        try:
            if not fits:
                raise RuntimeError("check_decode_mem: not enough memory")
            with self._quiet():
                if self.page == 1:
                    loc = a.allocation.alloc_token_slots(self.tree, 1)
                else:
                    last = self.r2t.req_to_token[idx, seqlen - 2:seqlen - 1].to(torch.int64)
                    loc = a.allocation.alloc_paged_token_slots_decode(
                        tree_cache=self.tree,
                        seq_lens=torch.tensor([seqlen], dtype=torch.int64),
                        seq_lens_cpu=torch.tensor([seqlen], dtype=torch.int64),
                        last_loc=last)
        except RuntimeError:  # the scheduler retracts a decoding request
            self.stats.hit("out_of_memory")
            req.tokens.pop()
            sreq.output_ids.pop()
            self.prefix_ids[req.rid] = self.prefix_ids[req.rid][:len(req.tokens)]
            self._retract(req)
            return
        self.state.note_evictions(self, before)
        self.r2t.write((idx, slice(seqlen - 1, seqlen)), loc.to(torch.int32))
        kv.kv_allocated_len = kv.kv_committed_len = seqlen
        self.compat.set_prefix_len(sreq, seqlen - 1)
        self.compat.set_extend(sreq, seqlen - 1, seqlen)
        sreq.decode_batch_idx += 1
        self.stats.hit("decode")
        self._compute(req, seqlen - 1, seqlen)

    def _compute(self, req: Request, start: int, end: int) -> None:
        """The model runs positions [start, end): their KV is written through the
        request's row (full slots) and the full-to-SWA mapping (SWA slots), then
        attention reads back everything it attends to."""
        req.computed = end
        self.state.write(self, req, start, end)
        self.state.check_reads(self, req, start, end, "attention of this step")

    @contextlib.contextmanager
    def _steered_floor(self, sreq: Any, insert: bool) -> Iterator[None]:
        """Steers the release inside clear of the known bugs avoided (`KNOWN_BUGS`): a
        request that freed KV out of the window gets the floor a prefill-aware model's has
        (its protected prefix: the release then keeps or frees nothing below the window
        frees' start twice); one released without the insert before its first window free
        (its SWA cursor still 0), the floor of a model that is not (0: its whole own part
        is freed). The request's own floor comes back after the release: a retracted
        request is admitted again as the model it is."""
        if not self.pure:  # the known bugs steered clear of here are all-SWA ones
            yield
            return
        kv = self.compat.kv(sreq)
        own = getattr(kv, "swa_evict_floor", None)
        try:
            self._steer_floor(sreq, kv, insert)
            yield
        finally:
            if own is not None:
                kv.swa_evict_floor = own

    def _steer_floor(self, sreq: Any, kv: Any, insert: bool) -> None:
        floor = int(getattr(kv, "swa_evict_floor", 0) or 0)
        protected = int(kv.cache_protected_len or 0)
        recache = BUG_PURE_RECACHE if insert else BUG_PURE_REFREE
        if recache in self.avoid and floor == 0 and protected and self._window_freed(sreq):
            kv.swa_evict_floor = protected
            self.stats.hit("steered clear: " + recache)
        elif BUG_PURE_TAIL in self.avoid and not insert and floor \
                and not self.compat.swa_evicted(sreq) and int(kv.kv_allocated_len) > floor:
            kv.swa_evict_floor = 0
            self.stats.hit("steered clear: " + BUG_PURE_TAIL)

    def _window_freed(self, sreq: Any) -> bool:
        """Whether the request freed any of its own KV out of the window."""
        return self.compat.swa_evicted(sreq) > self.compat.swa_dead_lo(sreq, self.page)

    def _retract(self, req: Request) -> None:
        sreq = self.sreqs[req.rid]
        if not req.running:
            self.stats.hit("preempt_waiting")
            return
        if self.pure:
            kv = self.compat.kv(sreq)
            if self._window_freed(sreq):
                self.stats.hit(RARE_PURE_RETRACT_AFTER_WINDOW)
            floor = int(getattr(kv, "swa_evict_floor", 0) or 0)
            if floor and int(kv.kv_allocated_len) > floor and not self.compat.swa_evicted(sreq):
                self.stats.hit(RARE_PURE_RETRACT_SHIELDED)
        with self._steered_floor(sreq, insert=False):
            self.compat.release_req(sreq, self.r2t, self.alloc, self.tree)
        req.running, req.computed = False, 0
        self.retracted.add(req.rid)
        self.stats.hit("retracted")

    def _finish(self, req: Request) -> None:
        sreq = self.sreqs.pop(req.rid)
        self.requests.remove(req)
        self.stats.hit("finished")
        if not req.running:
            return
        sreq.finished_reason = self.api.batch.FINISH_LENGTH(length=len(sreq.output_ids))
        evicted = self.compat.swa_evicted(sreq)
        window_freed = self.pure and self._window_freed(sreq)
        with self._steered_floor(sreq, insert=True):
            self.compat.release(self.tree, sreq)
        if window_freed:
            self.stats.hit(RARE_PURE_FINISH_AFTER_WINDOW)
            self.finished_after_window.update(self.prefix_ids[req.rid])
        elif evicted and not self.pure:
            self.stats.hit(RARE_TOMBSTONE_INSERT)

    def _reset(self, under_load: bool) -> None:
        """`Scheduler.flush_cache`: only when idle; `under_load` retracts every running
        request first (as a weight update does)."""
        if under_load:
            for req in reversed([r for r in self.requests.live if r.running]):
                self._retract(req)
        if any(r.running for r in self.requests.live):
            self.stats.hit("reset_refused")
            return
        self.tree.reset()
        self.r2t.clear()
        self.alloc.clear()
        self.state.reset()
        self.stats.hit("reset_done")

    # -- checks -----------------------------------------------------------------------

    def running(self) -> list[tuple[Request, Any]]:
        return [(r, self.sreqs[r.rid]) for r in self.requests.live if r.running]

    def check(self) -> None:
        check_state(self)
        for req, _ in self.running():
            self.state.check_reads(self, req, req.computed, req.computed,
                                   "the next step's attention")

    def observe(self) -> dict[str, Any]:
        return {"full_available": int(self.alloc.full_available_size()),
                "swa_available": int(self.alloc.swa_available_size()),
                "full_evictable": int(self.tree.full_evictable_size()),
                "swa_evictable": int(self.tree.swa_evictable_size()),
                "requests": dict(self.requests.summary())}

    def finish(self) -> None:
        for req in list(self.requests.live):
            self._finish(req)
        self.check()
        with self._quiet():
            self.tree.sanity_check()
        swa = int(self.alloc.swa_available_size()) + int(self.tree.swa_evictable_size())
        if self.pure and swa != self.swa_size:
            raise CheckFailure("pool", f"after every request is freed, the all-SWA pool: "
                               f"available + evictable = {swa} of {self.swa_size}: a leak")
        full = int(self.alloc.full_available_size()) + int(self.tree.full_evictable_size())
        if not self.pure and (full != self.full_size or swa != self.swa_size):
            raise CheckFailure("pool", f"after every request is freed, full: available + "
                               f"evictable = {full} of {self.full_size}, SWA: {swa} of "
                               f"{self.swa_size}: a leak")
        self.stats.hit("sanity_check")


class SglangTarget:
    name = "sglang"
    # Chosen by measurement (docs/targets/sglang.md, "Rare states"): every rare state of
    # every preset reached by seed 0 with a margin.
    default_examples = 3000

    def __init__(self, allocator_class: type | None = None,
                 on_build: Callable[[SglangInstance], None] | None = None,
                 avoid_known: bool = False, only: tuple[str, ...] | None = None) -> None:
        self.allocator_class = allocator_class
        self.on_build = on_build
        # steer clear of the installed release's KNOWN_BUGS, or of `only`
        self.avoid_known = avoid_known
        self.only = only

    def version(self) -> str:
        return sglang_version()

    def presets(self) -> Mapping[str, TargetConfig]:
        return PRESETS

    def rare_states(self, cfg: TargetConfig) -> tuple[str, ...]:
        """The hybrid presets' states, or the all-SWA presets' (no tombstones, one pool;
        a prefill-aware model's retraction past its evict floor besides)."""
        if tuple(cfg.groups) != ALL_SWA_GROUPS:
            return RARE_STATES
        if cfg.option(OPT_PREFILL_AWARE, False):
            return (*PURE_RARE_STATES, RARE_PURE_RETRACT_SHIELDED)
        return PURE_RARE_STATES

    def checks_line(self) -> str:
        return ("every check passed (data oracle through req_to_token and the full-to-SWA "
                "mapping, pool conservation, ownership, SGLang's sanity_check)")

    def without_known_bugs(self, only: tuple[str, ...] | None = None) -> SglangTarget | None:
        """This target steered clear of the installed release's known engine bugs, or of
        those named in `only`, on top of those it already avoids; None when that adds
        none."""
        names = widened_avoidance(self.present_bugs(), self.avoided(), only)
        if names is None:
            return None
        return SglangTarget(self.allocator_class, self.on_build, avoid_known=True, only=names)

    def present_bugs(self) -> tuple[str, ...]:
        """The known engine bugs present in the installed release (`KNOWN_BUGS`)."""
        return tuple(bugs_present(KNOWN_BUGS, sglang_version()))

    def avoided(self) -> tuple[str, ...]:
        """The known engine bugs this target steers clear of."""
        return tuple(self.known_bugs()) if self.avoid_known else ()

    def known_bugs(self) -> dict[str, str]:
        """The known engine bugs of the installed release: name -> what."""
        return {name: what for name, what in bugs_present(KNOWN_BUGS, sglang_version()).items()
                if self.only is None or name in self.only}

    def build(self, cfg: TargetConfig) -> SglangInstance:
        sglang_version()
        avoid = frozenset(self.known_bugs()) if self.avoid_known else frozenset()
        inst = SglangInstance(cfg, self.allocator_class, avoid)
        if self.on_build is not None:
            self.on_build(inst)
        return inst
