"""`KVCacheManager`: the public entry point.

Owns the backend, the storage (levels, allocators, queues, pages, radix tree)
and the sequences. Every API call runs as one `Op`: validation first, then
mutations with inverses, then (on success) the deferred stream work and the
counter increments. A capacity failure rolls the op back exactly and the call
returns a falsy typed result naming it (`results.py`; or raises `OutOfPagesError`
where it returns nothing).

The public API for integrators (docs/adapter-guide.md): the calls, their typed results,
the read-only views (free slots, pages, eviction order, a sequence's block table and
pocket), the usage errors (`exceptions.UsageError`, each with the model's category) and
the shutdown report (leaks and detected corruption).

Documented simplifications relative to the upstream manager:
* beam width 1, no SSM life cycles, no scratch slots;
* committing a block whose prefix already has a committed block in the tree
  stops committing (commit state USER_STOP) instead of rebasing;
* a committed page keeps its page id (converted in place);
* resize allocates ordinal-major (for each new block, for each life cycle);
* sequence streams are created at `create`, one compute stream per sequence.

Layering: this module sits on top of `impl/`. The op plumbing (run, roll back,
choice record, shut-down flag) lives in `transactions.py`, shared with every
`KVCache` handle; snapshot, invariants and the event log read the manager through
the `ManagerView` protocol (`view.py`). Nothing in `impl/` imports this module.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

import numpy as np

from kvpocket.model.config import NO_SLOT, KVConfig, SeqStatus, check_fits

from .allocator import SlotPolicy
from .backend import Backend, make_backend
from .counters import CounterBook, Counters
from .eventlog import EventLog
from .eviction import VictimPolicy
from .exceptions import (
    CapacityError,
    CapacityFailure,
    CorruptionError,
    CorruptionWarning,
    DuplicateSequenceError,
    LeakError,
    TooManySequencesError,
    UnknownLevelError,
    UnknownSequenceError,
)
from .kvcache import MAX_INT, KVCache, checked_tokens
from .page import Page
from .results import (
    PRESSURE_OK,
    LeakReport,
    PageInfo,
    PressureResult,
    ShutdownReport,
    SlotCount,
    SlotRef,
)
from .selfcheck import check_invariants
from .snapshot import build_snapshot
from .storage import Storage
from .transactions import Transactions
from .undo import Choice, Op

__all__ = ["KVCacheManager", "LeakReport", "ShutdownReport"]

MAX_CORRUPTION_FINDINGS = 100  # kept per manager: the first ones found
# Closed handles kept for `get`, `complete_stream`, `counters_of` and snapshots, beyond the
# open ones; older closed ones are forgotten (their streams released), so memory and the
# cost of `create` do not grow with the number of sequences ever created (a server never
# reuses ids). A forgotten handle still refuses every call as closed.
CLOSED_KEPT = 64


def _page_info(p: Page) -> PageInfo:
    return PageInfo(p.pid, p.lc, p.group, p.level, p.slot, p.status.name, p.committed,
                    p.locks, p.holds, p.owner, p.pocket_owner)


class KVCacheManager:
    """Paged KV-cache manager with levels, eviction and the SWA reuse pocket.

    `backend`: "numpy" | "cupy" | "auto" or a built `Backend`; `backend_options`
    go to its constructor (e.g. `eager=False` for a manually driven simulator).
    `slot_elems` elements of `dtype` per slot (per page); default: one per token of a
    block, at least 8 (`max(8, tokens_per_block)`, what `DecodeOracle` needs).
    `event_log` (a path or a text stream) writes one NDJSON event per API call for
    `kvpocket trace check`.
    """

    def __init__(
        self, cfg: KVConfig, backend: str | Backend = "numpy", *, slot_elems: int | None = None,
        dtype: Any = np.int32, slot_policy: SlotPolicy | None = None,
        victim_policy: VictimPolicy | None = None, backend_options: dict[str, Any] | None = None,
        event_log: str | Path | TextIO | None = None,
    ) -> None:
        if not isinstance(cfg, KVConfig):
            raise TypeError(f"cfg must be a KVConfig, got {type(cfg).__name__}")
        if slot_elems is None:
            slot_elems = max(8, cfg.tokens_per_block)
        if (isinstance(slot_elems, bool) or not isinstance(slot_elems, int)
                or not 1 <= slot_elems <= 1 << 24):
            raise CapacityError(f"slot_elems must be an int in [1, 2**24], got {slot_elems!r}",
                                parameter="slot_elems")
        check_fits(cfg, "impl", slot_elems)  # the pools' size, before any is allocated
        self.cfg = cfg
        self.backend: Backend = make_backend(backend, **(backend_options or {}))
        self.slot_elems = slot_elems
        self.dtype = np.dtype(dtype)
        self.storage = Storage(cfg, self.backend, slot_elems, self.dtype, slot_policy,
                               victim_policy)
        self.seqs: dict[int, KVCache] = {}
        self.counters = CounterBook()
        # Runs every API call (the manager's and its handles'); owns the choice record.
        self.transactions = Transactions(self.storage, self.counters)
        self._corruption: dict[str, None] = {}  # detected corruption, in order, unique
        # One NDJSON event per API call (`impl/eventlog.py`, docs/adapter-guide.md).
        self.events: EventLog | None = None
        if event_log is not None:
            self.events = EventLog(event_log, self)
            self.events.instrument_manager(self)

    # ---- policies (replaceable to force a trace's choices) ---------------------------
    @property
    def slot_policy(self) -> SlotPolicy:
        return self.storage.slot_policy

    @slot_policy.setter
    def slot_policy(self, policy: SlotPolicy) -> None:
        self.storage.slot_policy = policy

    @property
    def victim_policy(self) -> VictimPolicy:
        return self.storage.victim_policy

    @victim_policy.setter
    def victim_policy(self, policy: VictimPolicy) -> None:
        self.storage.victim_policy = policy

    # ---- sequences ---------------------------------------------------------------------
    def create(self, seq_id: int, prompt_tokens: Sequence[int] = ()) -> KVCache:
        """A new SUSPENDED cache; full prompt blocks found in the radix tree are reused.

        `seq_id`: any int in [0, 2**63) that is not open; a CLOSED id is created afresh
        (as the model's `create` of a CLOSED sequence; the old handle stays closed, and
        `counters_of(seq_id)` goes on counting). At most `cfg.num_sequences` sequences
        may be open (not CLOSED) at once."""
        self.transactions.check_open()
        if isinstance(seq_id, bool) or not isinstance(seq_id, int) or not 0 <= seq_id < MAX_INT:
            raise UnknownSequenceError(
                f"create: seq_id must be an int in [0, 2**63), got {seq_id!r:.40}",
                parameter="seq_id")
        old = self.seqs.get(seq_id)
        if old is not None and old.status is not SeqStatus.CLOSED:
            raise DuplicateSequenceError(f"create: seq_id {seq_id} is open ({old.status.name}); "
                                         "close it first", parameter="seq_id")
        prompt = checked_tokens(prompt_tokens, "create", "prompt_tokens")
        open_now = self.open_sequences()
        if len(open_now) >= self.cfg.num_sequences:
            raise TooManySequencesError(
                f"create: {len(open_now)} sequences are open {list(open_now)}, the most "
                f"the configuration allows (num_sequences = {self.cfg.num_sequences}); close "
                "one first", parameter="seq_id")
        nodes = self.storage.tree.match(prompt)[: self.cfg.max_blocks]
        kv = KVCache(seq_id, cfg=self.cfg, storage=self.storage, backend=self.backend,
                     transactions=self.transactions, on_corruption=self._record_corruption)
        if self.events is not None:  # the event log wraps this handle's API methods
            self.events.instrument_sequence(kv)
        self.transactions.run(lambda op: kv.adopt_prefix(nodes, prompt, op))
        if old is not None:
            self._release(old)
        self.seqs[seq_id] = kv
        self._forget_closed()
        return kv

    def _forget_closed(self) -> None:
        """Forget the oldest closed handles beyond CLOSED_KEPT (creation order)."""
        excess = len(self.seqs) - self.cfg.num_sequences - CLOSED_KEPT
        if excess <= 0:
            return
        for sid, kv in list(self.seqs.items()):
            if kv.status is SeqStatus.CLOSED:
                del self.seqs[sid]
                self.counters.per_seq.pop(sid, None)
                self._release(kv)
                excess -= 1
                if excess <= 0:
                    return

    def _release(self, kv: KVCache) -> None:
        """A closed handle's stream gets no more work: the backend may drop it."""
        release = getattr(self.backend, "release_stream", None)
        if release is not None:
            release(kv.stream)

    def get(self, seq_id: int) -> KVCache:
        """The handle of a created sequence (the newest, for an id created again)."""
        try:
            return self.seqs[seq_id]
        except (KeyError, TypeError):
            raise UnknownSequenceError(f"get: seq_id {seq_id!r:.40}: the sequence was never "
                                       f"created (or was closed before the last {CLOSED_KEPT} "
                                       "closed ones, and forgotten)", parameter="seq_id"
                                       ) from None

    def open_sequences(self) -> tuple[int, ...]:
        """Ids of the sequences that are not CLOSED, ascending."""
        return tuple(sorted(s for s, kv in self.seqs.items()
                            if kv.status is not SeqStatus.CLOSED))

    # ---- environment operations (for fuzzers) ------------------------------------------
    def _check_level(self, level: int, pool_group: int, call: str) -> None:
        for name, v, hi in (("level", level, self.cfg.num_levels),
                            ("pool_group", pool_group, self.cfg.num_pool_groups)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < hi:
                raise UnknownLevelError(f"{call}: {name} must be an int in [0, {hi - 1}], "
                                        f"got {v!r:.40}", parameter=name)

    def pressure(self, level: int, pool_group: int, n: int) -> PressureResult:
        """Another tenant needs `n` free slots at (level, pool group): make them free
        (without taking them). A falsy result naming the failure, and nothing changed,
        if impossible."""
        self.transactions.check_open()
        self._check_level(level, pool_group, "pressure")
        most = self.cfg.slots_per_level[level]
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= most:
            raise CapacityError(f"pressure: n (slots) must be an int in [0, {most}] (the slots "
                                f"of level {level}), got {n!r:.40}", parameter="n")
        try:
            self.transactions.run(
                lambda op: self.storage.make_room(level, pool_group, n, op, None))
        except CapacityFailure as exc:
            return PressureResult.failed(exc)
        return PRESSURE_OK

    def inject_allocation_failure(self) -> None:
        """The next slot allocation raises OutOfPagesError (its API call fails cleanly)."""
        self.storage.fail_next_alloc = True

    def inject_copy_failure(self) -> None:
        """The next migration copy fails (its API call fails cleanly)."""
        self.storage.fail_next_copy = True

    def complete_stream(self, stream: int | Literal["copy"]) -> int:
        """Let a stream's queued GPU work complete: a sequence's compute stream (its id)
        or the copy stream ("copy"); the event log records it as `advance`. On the NumPy
        simulator with `eager=False` this runs the stream's queued work up to its first
        unsatisfied wait and returns how many items ran; elsewhere work runs by itself
        and this waits for all of it (returns 0)."""
        self.transactions.check_open()
        if stream == "copy":
            ref = self.storage.copy_stream
        elif isinstance(stream, int) and not isinstance(stream, bool) and stream in self.seqs:
            ref = self.seqs[stream].stream
        else:
            raise UnknownSequenceError(f"complete_stream: stream must be a created sequence's "
                                       f"id or 'copy', got {stream!r:.40}",
                                       parameter="stream")
        sim = getattr(self.backend, "sim", None)
        if sim is not None:
            ran = int(sim.advance(ref.id, 1 << 30))
        else:
            self.backend.synchronize_all()
            ran = 0
        if self.events is not None:
            self.events.stream_completed(stream)
        return ran

    # ---- observation -------------------------------------------------------------------
    def last_choices(self) -> list[Choice]:
        """Choices made by the last API call, in order (see `snapshot.py` for the schema)."""
        return self.transactions.last_choices()

    def counters_of(self, seq_id: int | None = None) -> Counters:
        return self.counters.of(seq_id)

    def pool(self, level: int, pool_group: int = 0) -> Any:
        self._check_level(level, pool_group, "pool")
        return self.storage.pools[level][pool_group]

    def free_slots(self, level: int, pool_group: int = 0) -> int:
        """Slots an allocation at (level, pool group) can take now."""
        self._check_level(level, pool_group, "free_slots")
        return self.storage.allocs[level][pool_group].num_free

    def slot_counts(self) -> tuple[SlotCount, ...]:
        """Free and total slots of every (level, pool group), level-major."""
        return tuple(SlotCount(a.level, a.group, a.num_free, a.capacity)
                     for allocs in self.storage.allocs for a in allocs)

    def pages(self) -> tuple[PageInfo, ...]:
        """Every live page, by id."""
        return tuple(_page_info(p) for _, p in sorted(self.storage.pages.items()))

    def page(self, page_id: int) -> PageInfo | None:
        """A live page, or None (never created, or dead: released or dropped)."""
        p = self.storage.pages.get(page_id)
        return None if p is None else _page_info(p)

    @property
    def pages_created(self) -> int:
        """How many pages were ever created (page ids are issued 0, 1, ...)."""
        return self.storage.next_pid

    def eviction_order(self, level: int, pool_group: int = 0) -> tuple[int, ...]:
        """Page ids queued for eviction at (level, pool group), next victim first (the
        default victim policy's order)."""
        self._check_level(level, pool_group, "eviction_order")
        return tuple(self.storage.queues[level][pool_group].ordered())

    def prefix_blocks(self) -> int:
        """Committed blocks in the prefix tree (reusable by `create`'s prompt match)."""
        return len(self.storage.tree.nodes)

    def snapshot(self, sequences: Collection[int] | None = None) -> dict[str, Any]:
        """The whole state as JSON-able data (`snapshot.py` documents the shape);
        `sequences` limits the per-sequence part to those ids."""
        return build_snapshot(self, sequences)

    def check_invariants(self) -> list[str]:
        """Structural invariant violations (empty: consistent). Any found is recorded as
        corruption (`corruption`, the shutdown report)."""
        bad = check_invariants(self)
        for v in bad:
            self._record_corruption(f"invariant: {v}", warn=False)  # the caller has them
        return bad

    @property
    def corruption(self) -> tuple[str, ...]:
        """The corruption detected so far (invariant violations found by
        `check_invariants`, double releases `close`/`shutdown` survived), first found
        first, each once; the first `MAX_CORRUPTION_FINDINGS` are kept."""
        return tuple(self._corruption)

    def _record_corruption(self, finding: str, warn: bool = True, stacklevel: int = 4) -> None:
        """Record a corruption finding (once) and warn. The default stack level names the
        caller of `KVCache.close`, whose salvage reports through here."""
        if finding in self._corruption:
            return
        if len(self._corruption) < MAX_CORRUPTION_FINDINGS:
            self._corruption[finding] = None
        if warn:
            warnings.warn(finding, CorruptionWarning, stacklevel=stacklevel)

    def synchronize(self) -> None:
        self.backend.synchronize_all()

    # ---- shutdown ----------------------------------------------------------------------
    def shutdown(self, raise_on_leak: bool = False) -> ShutdownReport:
        """Drop the reusable (tree-only) pages and report whatever is still alive, and
        any corruption detected (the invariants are checked first). Never raises a
        `CorruptionError`: a page whose slot another page also claims is dropped without
        releasing that slot. `raise_on_leak`: raise `LeakError` if the report is not
        clean (after shutting down)."""
        self.transactions.check_open()
        self.backend.synchronize_all()
        st = self.storage
        self.check_invariants()

        def droppable() -> list[Page]:
            return [p for p in st.pages.values()
                    if p.alive and p.committed and p.holds == 0 and p.locks == 0]

        def drop_all(op: Op) -> None:
            for page in droppable():
                st.drop(page, op, None)

        try:
            self.transactions.run(drop_all)
        except CorruptionError as exc:
            self._record_corruption(f"shutdown: {exc}", stacklevel=3)
            for page in droppable():
                self._salvage_drop(page)
        self.backend.synchronize_all()
        owned = {(p.level, p.group, p.slot) for p in st.pages.values() if p.has_slot}
        orphans = [SlotRef(level, g, s) for level, allocs in enumerate(st.allocs)
                   for g, a in enumerate(allocs) for s in sorted(a.occupied)
                   if (level, g, s) not in owned]
        report = ShutdownReport(LeakReport(self.open_sequences(), self.pages(), tuple(orphans)),
                                self.corruption)
        self.transactions.shut()
        self.backend.close()
        if self.events is not None:
            self.events.close()
        if raise_on_leak and report:
            raise LeakError(str(report))
        return report

    def _salvage_drop(self, page: Page) -> None:
        """Drop one tree-only page after a corruption; if its slot is not its own (free,
        or claimed by another page too), drop it without releasing the slot."""
        st = self.storage
        where = (page.level, page.group, page.slot)
        shared = sum(1 for p in st.pages.values()
                     if p.has_slot and (p.level, p.group, p.slot) == where) > 1
        free = page.has_slot and page.slot not in st.allocs[page.level][page.group].occupied

        if not page.alive:
            return

        def body(op: Op) -> None:
            if page.has_slot and (shared or free):
                op.set(page, "slot", NO_SLOT)
            st.drop(page, op, None)

        try:
            self.transactions.run(body)
        except CorruptionError as exc:
            self._record_corruption(f"shutdown: page {page.pid} could not be dropped: {exc}")
            return
        if shared or free:
            why = "free in its allocator" if free else "also claimed by another page"
            self._record_corruption(f"shutdown: page {page.pid}: slot (level, pool group, "
                                    f"slot) {where} is {why}; dropped without releasing it")
