"""`KVCacheManager`: the public entry point.

Owns the backend, the storage (levels, allocators, queues, pages, radix tree)
and the sequences. Every API call runs as one `Op`: validation first, then
mutations with inverses, then (on success) the deferred stream work and the
counter increments. A capacity failure rolls the op back exactly and the call
returns False (or raises `OutOfPagesError` where it returns nothing).

Documented simplifications relative to the upstream manager:
* beam width 1, no SSM life cycles, no scratch slots;
* committing a block whose prefix already has a committed block in the tree
  stops committing (commit state USER_STOP) instead of rebasing;
* a committed page keeps its page id (converted in place);
* resize allocates ordinal-major (for each new block, for each life cycle);
* sequence streams are created at `create`, one compute stream per sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from kvpocket.model.config import KVConfig, SeqStatus, stale_range

from .allocator import SlotPolicy
from .backend import Backend, make_backend
from .counters import CounterBook, Counters
from .errors import (
    CapacityError,
    CapacityFailure,
    DuplicateSequenceError,
    LeakError,
    ManagerShutdownError,
    UnknownLevelError,
    UnknownSequenceError,
)
from .eventlog import EventLog
from .eviction import VictimPolicy
from .kvcache import KVCache
from .storage import Storage
from .undo import Choice, Op


@dataclass
class LeakReport:
    """What `shutdown` found still alive after dropping the reusable (tree-only) pages."""

    open_sequences: list[int] = field(default_factory=list)
    pages: list[dict[str, Any]] = field(default_factory=list)
    orphan_slots: list[tuple[int, int, int]] = field(default_factory=list)  # (level, pg, slot)

    def __bool__(self) -> bool:
        return bool(self.open_sequences or self.pages or self.orphan_slots)

    def __str__(self) -> str:
        if not self:
            return "no leaks"
        return (f"leaks: open sequences {self.open_sequences}; "
                f"{len(self.pages)} live pages {[p['id'] for p in self.pages]}; "
                f"occupied slots without a page {self.orphan_slots}")


class KVCacheManager:
    """Paged KV-cache manager with levels, eviction and the SWA reuse pocket.

    `backend`: "numpy" | "cupy" | "auto" or a built `Backend`; `backend_options`
    go to its constructor (e.g. `eager=False` for a manually driven simulator).
    `slot_elems` elements of `dtype` per slot (per page). `event_log` (a path or a text
    stream) writes one NDJSON event per API call for `kvpocket trace check`.
    """

    def __init__(
        self, cfg: KVConfig, backend: str | Backend = "numpy", *, slot_elems: int = 8,
        dtype: Any = np.int32, slot_policy: SlotPolicy | None = None,
        victim_policy: VictimPolicy | None = None, backend_options: dict[str, Any] | None = None,
        event_log: str | Path | TextIO | None = None,
    ) -> None:
        if isinstance(slot_elems, bool) or not isinstance(slot_elems, int) or slot_elems < 1:
            raise CapacityError(f"slot_elems must be a positive int, got {slot_elems!r}")
        self.cfg = cfg
        self.backend: Backend = make_backend(backend, **(backend_options or {}))
        self.slot_elems = slot_elems
        self.dtype = np.dtype(dtype)
        self.storage = Storage(cfg, self.backend, slot_elems, self.dtype, slot_policy,
                               victim_policy)
        self.seqs: dict[int, KVCache] = {}
        self.counters = CounterBook()
        self._choices: list[Choice] = []
        self._shut = False
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

    # ---- op plumbing -------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._shut:
            raise ManagerShutdownError("the manager was shut down")

    def _run(self, fn: Callable[[Op], None]) -> None:
        op = Op()
        self.storage.begin_op()
        try:
            fn(op)
        except BaseException as exc:
            op.rollback()
            self._choices = [*op.choices, ("fail", type(exc).__name__)]
            self.storage.begin_op()
            raise
        self._choices = op.choices
        for work in op.deferred:
            work()
        self.counters.merge(op.counts)
        self.storage.begin_op()

    def _run_bool(self, fn: Callable[[Op], None]) -> bool:
        try:
            self._run(fn)
        except CapacityFailure:
            return False
        return True

    # ---- sequences ---------------------------------------------------------------------
    def create(self, seq_id: int, prompt_tokens: Sequence[int] = ()) -> KVCache:
        """A new SUSPENDED cache; full prompt blocks found in the radix tree are reused."""
        self._check_open()
        if isinstance(seq_id, bool) or not isinstance(seq_id, int) or seq_id < 0:
            raise UnknownSequenceError(f"sequence id must be a non-negative int, got {seq_id!r}")
        if seq_id in self.seqs:
            raise DuplicateSequenceError(f"sequence {seq_id} already exists "
                                         f"({self.seqs[seq_id].status.name})")
        prompt = list(prompt_tokens)
        if any(isinstance(x, bool) or not isinstance(x, int) for x in prompt):
            raise CapacityError("prompt tokens must be ints")
        t = self.cfg.tokens_per_block
        nodes = self.storage.tree.match(prompt)[: self.cfg.max_blocks]
        kv = KVCache(self, seq_id)

        def body(op: Op) -> None:
            m = len(nodes) * t
            kv.committed = prompt[:m]
            kv.capacity = kv.history = m
            kv.num_blocks = kv.num_committed_blocks = len(nodes)
            kv.tree_nodes = list(nodes)
            for nid in nodes:
                self.storage.tree.acquire(nid, op)
            for i, lc in enumerate(self.cfg.life_cycles):
                s, e = stale_range(lc, m, t)
                kv._stale[i] = (s, e)
                kv.pages[i] = [None] * len(nodes)
                kv.locked[i] = [False] * len(nodes)
                for b, nid in enumerate(nodes):
                    if s <= b < e:
                        continue
                    pid = self.storage.tree.nodes[nid].pages[i]
                    assert pid is not None
                    page = self.storage.pages[pid]
                    kv.pages[i][b] = page
                    op.set(page, "holds", page.holds + 1)
                    self.storage.requeue(page, op)
            from .kvcache import _next_stale_change

            kv._next_change = _next_stale_change(self.cfg.life_cycles, m, t)

        self._run(body)
        self.seqs[seq_id] = kv
        return kv

    def get(self, seq_id: int) -> KVCache:
        try:
            return self.seqs[seq_id]
        except KeyError:
            raise UnknownSequenceError(f"sequence {seq_id!r} was never created") from None

    # ---- environment operations (for fuzzers) ------------------------------------------
    def _check_level(self, level: int, pool_group: int) -> None:
        for name, v, hi in (("level", level, self.cfg.num_levels),
                            ("pool_group", pool_group, self.cfg.num_pool_groups)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < hi:
                raise UnknownLevelError(f"{name} {v!r} does not exist (have 0..{hi - 1})")

    def pressure(self, level: int, pool_group: int, n: int) -> bool:
        """Another tenant needs `n` free slots at (level, pool group): make them free
        (without taking them). False, and nothing changed, if impossible."""
        self._check_open()
        self._check_level(level, pool_group)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise CapacityError(f"pressure needs a non-negative int, got {n!r}")
        return self._run_bool(lambda op: self.storage.make_room(level, pool_group, n, op, None))

    def inject_allocation_failure(self) -> None:
        """The next slot allocation raises OutOfPagesError (its API call fails cleanly)."""
        self.storage.fail_next_alloc = True

    def inject_copy_failure(self) -> None:
        """The next migration copy fails (its API call fails cleanly)."""
        self.storage.fail_next_copy = True

    # ---- observation -------------------------------------------------------------------
    def last_choices(self) -> list[Choice]:
        """Choices made by the last API call, in order (see `snapshot.py` for the schema)."""
        return list(self._choices)

    def counters_of(self, seq_id: int | None = None) -> Counters:
        return self.counters.of(seq_id)

    def pool(self, level: int, pool_group: int = 0) -> Any:
        self._check_level(level, pool_group)
        return self.storage.pools[level][pool_group]

    def snapshot(self) -> dict[str, Any]:
        from .snapshot import build_snapshot

        return build_snapshot(self)

    def check_invariants(self) -> list[str]:
        from .invariants import check_invariants

        return check_invariants(self)

    def synchronize(self) -> None:
        self.backend.synchronize_all()

    # ---- shutdown ----------------------------------------------------------------------
    def shutdown(self, raise_on_leak: bool = False) -> LeakReport:
        """Drop the reusable (tree-only) pages and report whatever is still alive."""
        self._check_open()
        self.backend.synchronize_all()
        st = self.storage

        def body(op: Op) -> None:
            for page in list(st.pages.values()):
                if page.alive and page.committed and page.holds == 0 and page.locks == 0:
                    st.drop(page, op, None)

        self._run(body)
        self.backend.synchronize_all()
        report = LeakReport()
        report.open_sequences = sorted(s for s, kv in self.seqs.items()
                                       if kv.status is not SeqStatus.CLOSED)
        from .snapshot import page_record

        report.pages = [page_record(self, p) for p in st.pages.values()]
        owned = {(p.level, p.group, p.slot) for p in st.pages.values() if p.has_slot}
        for level, allocs in enumerate(st.allocs):
            for g, a in enumerate(allocs):
                report.orphan_slots += [(level, g, s) for s in sorted(a.occupied)
                                        if (level, g, s) not in owned]
        self._shut = True
        self.backend.close()
        if self.events is not None:
            self.events.close()
        if raise_on_leak and report:
            raise LeakError(str(report))
        return report
