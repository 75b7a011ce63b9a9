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

Layering: this module sits on top of `impl/`. The op plumbing (run, roll back,
choice record, shut-down flag) lives in `transactions.py`, shared with every
`KVCache` handle; snapshot, invariants and the event log read the manager through
the `ManagerView` protocol (`view.py`). Nothing in `impl/` imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from kvpocket.model.config import KVConfig, SeqStatus

from .allocator import SlotPolicy
from .backend import Backend, make_backend
from .counters import CounterBook, Counters
from .eventlog import EventLog
from .eviction import VictimPolicy
from .exceptions import (
    CapacityError,
    DuplicateSequenceError,
    LeakError,
    UnknownLevelError,
    UnknownSequenceError,
)
from .kvcache import KVCache
from .selfcheck import check_invariants
from .snapshot import build_snapshot, page_record
from .storage import Storage
from .transactions import Transactions
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
        # Runs every API call (the manager's and its handles'); owns the choice record.
        self.transactions = Transactions(self.storage, self.counters)
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
        """A new SUSPENDED cache; full prompt blocks found in the radix tree are reused."""
        self.transactions.check_open()
        if isinstance(seq_id, bool) or not isinstance(seq_id, int) or seq_id < 0:
            raise UnknownSequenceError(f"sequence id must be a non-negative int, got {seq_id!r}")
        if seq_id in self.seqs:
            raise DuplicateSequenceError(f"sequence {seq_id} already exists "
                                         f"({self.seqs[seq_id].status.name})")
        prompt = list(prompt_tokens)
        if any(isinstance(x, bool) or not isinstance(x, int) for x in prompt):
            raise CapacityError("prompt tokens must be ints")
        nodes = self.storage.tree.match(prompt)[: self.cfg.max_blocks]
        kv = KVCache(seq_id, cfg=self.cfg, storage=self.storage, backend=self.backend,
                     transactions=self.transactions)
        if self.events is not None:  # the event log wraps this handle's API methods
            self.events.instrument_sequence(kv)
        self.transactions.run(lambda op: kv.adopt_prefix(nodes, prompt, op))
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
        self.transactions.check_open()
        self._check_level(level, pool_group)
        most = self.cfg.slots_per_level[level]
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= most:
            raise CapacityError(f"pressure: slots must be an int in [0, {most}] (the slots of "
                                f"level {level}), got {n!r}")
        return self.transactions.run_bool(
            lambda op: self.storage.make_room(level, pool_group, n, op, None))

    def inject_allocation_failure(self) -> None:
        """The next slot allocation raises OutOfPagesError (its API call fails cleanly)."""
        self.storage.fail_next_alloc = True

    def inject_copy_failure(self) -> None:
        """The next migration copy fails (its API call fails cleanly)."""
        self.storage.fail_next_copy = True

    # ---- observation -------------------------------------------------------------------
    def last_choices(self) -> list[Choice]:
        """Choices made by the last API call, in order (see `snapshot.py` for the schema)."""
        return self.transactions.last_choices()

    def counters_of(self, seq_id: int | None = None) -> Counters:
        return self.counters.of(seq_id)

    def pool(self, level: int, pool_group: int = 0) -> Any:
        self._check_level(level, pool_group)
        return self.storage.pools[level][pool_group]

    def snapshot(self) -> dict[str, Any]:
        return build_snapshot(self)

    def check_invariants(self) -> list[str]:
        return check_invariants(self)

    def synchronize(self) -> None:
        self.backend.synchronize_all()

    # ---- shutdown ----------------------------------------------------------------------
    def shutdown(self, raise_on_leak: bool = False) -> LeakReport:
        """Drop the reusable (tree-only) pages and report whatever is still alive."""
        self.transactions.check_open()
        self.backend.synchronize_all()
        st = self.storage

        def body(op: Op) -> None:
            for page in list(st.pages.values()):
                if page.alive and page.committed and page.holds == 0 and page.locks == 0:
                    st.drop(page, op, None)

        self.transactions.run(body)
        self.backend.synchronize_all()
        report = LeakReport()
        report.open_sequences = sorted(s for s, kv in self.seqs.items()
                                       if kv.status is not SeqStatus.CLOSED)
        report.pages = [page_record(self, p) for p in st.pages.values()]
        owned = {(p.level, p.group, p.slot) for p in st.pages.values() if p.has_slot}
        for level, allocs in enumerate(st.allocs):
            for g, a in enumerate(allocs):
                report.orphan_slots += [(level, g, s) for s in sorted(a.occupied)
                                        if (level, g, s) not in owned]
        self.transactions.shut()
        self.backend.close()
        if self.events is not None:
            self.events.close()
        if raise_on_leak and report:
            raise LeakError(str(report))
        return report
