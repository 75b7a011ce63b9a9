"""One sequence's KV cache: block entries, index tables, pocket, and its operations.

Block entries per (life cycle, ordinal): no page, a *lock* on a page (ACTIVE,
non-stale: the page is at GPU and the index table holds its slot) or a
*hold* (SUSPENDED, or a stale uncommitted block kept for a later commit).
Every method validates first and mutates only through an `Op`, so a raised
misuse error or a failed (rolled back) operation leaves everything unchanged.

Layering: a handle knows the storage, the backend and the shared `Transactions`
(which runs its ops and keeps the choice record), never the manager, so this
module does not import `manager.py`; the manager builds handles and, for prefix
reuse, hands the matched radix-tree nodes to `adopt_prefix`.
"""

from __future__ import annotations

import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kvpocket.model.config import (
    BAD_PAGE_INDEX,
    GPU_LEVEL,
    NO_SLOT,
    CommitState,
    PocketPolicy,
    SeqStatus,
)

from . import window  # module attribute reads: a seeded bug patches `window` in place
from .allocator import Events
from .exceptions import (
    CapacityError,
    CapacityFailure,
    CommitNotAllowedError,
    CorruptionError,
    CorruptionWarning,
    HistoryDecreaseError,
    SequenceClosedError,
    SequenceStateError,
    UnknownLifeCycleError,
)
from .page import Page
from .radix import ROOT
from .results import (
    RESIZE_OK,
    RESUME_OK,
    BlockEntry,
    PocketEntry,
    ResizeResult,
    ResumeResult,
)
from .undo import Op

if TYPE_CHECKING:
    from kvpocket.model.config import KVConfig

    from .backend.protocol import Backend
    from .storage import Storage
    from .transactions import Transactions


def _del_tail(lst: list[Any], n: int) -> None:
    del lst[n:]


MAX_INT = 2**63  # ids, lengths and tokens fit a signed 64-bit value (the event-log format)
TOKENS_ALLOWED = "a sequence of token ids (ints in [-2**63, 2**63))"


def checked_tokens(tokens: object, call: str, parameter: str) -> list[int]:
    """`tokens` as a list, or a `CapacityError` naming the call, the parameter and what it
    takes (the model's category for a bad token list)."""
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
        raise CapacityError(f"{call}: {parameter} must be {TOKENS_ALLOWED}, got "
                            f"{type(tokens).__name__} {tokens!r:.60}", parameter=parameter)
    toks = list(tokens)
    for i, x in enumerate(toks):
        if isinstance(x, bool) or not isinstance(x, int) or not -MAX_INT <= x < MAX_INT:
            raise CapacityError(f"{call}: {parameter}[{i}] is {x!r:.40}; {parameter} must be "
                                f"{TOKENS_ALLOWED}", parameter=parameter)
    return toks


class KVCache:
    """Handle of one sequence. Create it with `KVCacheManager.create`."""

    def __init__(self, seq_id: int, *, cfg: KVConfig, storage: Storage, backend: Backend,
                 transactions: Transactions,
                 on_corruption: Callable[[str], None] | None = None) -> None:
        self._cfg = cfg
        self._backend = backend
        self._txn = transactions
        self._st = storage
        self._lcs = cfg.life_cycles
        self._t = cfg.tokens_per_block
        self.seq_id = seq_id
        self.stream = backend.new_stream(f"seq{seq_id}")
        self.status = SeqStatus.SUSPENDED
        self.capacity = 0
        self.history = 0
        self.committed: list[int] = []
        self.commit_state = CommitState.ALLOWED
        self.num_committed_blocks = 0
        self.tree_nodes: list[int] = []
        self.num_blocks = 0
        n = cfg.num_life_cycles
        self.pages: list[list[Page | None]] = [[] for _ in range(n)]
        self.locked: list[list[bool]] = [[] for _ in range(n)]
        self.index = np.full((n, cfg.max_blocks), BAD_PAGE_INDEX, dtype=np.int32)
        self.pocket: list[deque[Page]] = [deque() for _ in range(n)]
        self._stale = [window.out_of_window(lc, 0, self._t) for lc in self._lcs]
        self._next_change = window.next_window_move(self._lcs, 0, self._t)
        self._pocket_on = cfg.pocket.enabled
        self._max_cap = cfg.max_capacity
        self._device_index: Any = None
        self._index_dirty = True
        self._on_corruption = on_corruption

    # ---- public queries ----------------------------------------------------------------
    @property
    def history_length(self) -> int:
        return self.history

    @property
    def num_committed_tokens(self) -> int:
        return len(self.committed)

    def page_table(self, lc: int) -> Any:
        """The page-index table of a life cycle (int32, `max_blocks` long, BAD = -1):
        a NumPy view on the NumPy backend, a device array on CuPy (and a separate copy on
        the simulator's device-mirror mode, synced by the same path)."""
        self._check_lc(lc)
        if not self._backend.device_copies:
            return self.index[lc]
        if self._index_dirty or self._device_index is None:
            # On the sequence's stream: ordered before its next kernels, and a freed table is
            # reused only after the work enqueued there before (stream-ordered memory).
            self._device_index = self._backend.device_table(self.index, self.stream)
            self._index_dirty = False
        return self._device_index[lc]

    def stale_range(self, lc: int) -> tuple[int, int]:
        """The blocks `[start, end)` of life cycle `lc` out of the window (unlocked, their
        index entries BAD). An empty range names no block, whatever its start."""
        self._check_lc(lc)
        return window.out_of_window(self._lcs[lc], self.history, self._t)

    def pocket_pages(self, lc: int) -> list[int]:
        """Page ids of the life cycle's parked pages, oldest first (`pocket_entries` has
        their slots)."""
        self._check_lc(lc)
        return [p.pid for p in self.pocket[lc]]

    # ---- read-only views (immutable values, built per call) ----------------------------
    @property
    def committed_tokens(self) -> tuple[int, ...]:
        """The committed token ids, in order."""
        return tuple(self.committed)

    @property
    def next_window_change(self) -> int:
        """A history length above the current one below which every stale range stays
        as it is: a `resize` that keeps the number of blocks and the history below it
        changes no page (a lower bound of the next real change)."""
        return self._next_change

    @property
    def remembered_stale_ranges(self) -> tuple[tuple[int, int], ...]:
        """The stale range of each life cycle as the handle remembers it (speed: updated
        only where a range may move, see `next_window_change`); it must equal
        `stale_range(lc)` for every life cycle (`selfcheck.stale_range_memo`)."""
        return tuple(self._stale)

    def block_table(self, lc: int) -> tuple[int, ...]:
        """The life cycle's page-index row over the sequence's `num_blocks` blocks: the
        GPU slot of each locked page, `BAD_PAGE_INDEX` (-1) for a stale, held or missing
        block. A copy (`page_table` is the live array kernels read)."""
        self._check_lc(lc)
        return tuple(int(x) for x in self.index[lc, : self.num_blocks].tolist())

    def block_entries(self, lc: int) -> tuple[BlockEntry, ...]:
        """Every block of the life cycle: its page (None if none), where the page is,
        whether this sequence locks it, and whether the block is out of the window."""
        self._check_lc(lc)
        s, e = window.out_of_window(self._lcs[lc], self.history, self._t)
        out: list[BlockEntry] = []
        for b in range(self.num_blocks):
            page = self.pages[lc][b] if b < len(self.pages[lc]) else None
            locked = page is not None and self.locked[lc][b]
            if page is None:
                out.append(BlockEntry(b, None, None, None, False, s <= b < e))
            else:
                out.append(BlockEntry(b, page.pid, page.level, page.slot, locked, s <= b < e))
        return tuple(out)

    def pocket_entries(self, lc: int) -> tuple[PocketEntry, ...]:
        """The life cycle's parked pages, oldest first, with where each sits now and
        whether its slot is still valid for reuse (live, at GPU, with a slot)."""
        self._check_lc(lc)
        return tuple(PocketEntry(p.pid, p.level, p.group, p.slot,
                                 p.alive and p.level == GPU_LEVEL and p.has_slot)
                     for p in self.pocket[lc])

    # ---- prefix reuse (the manager's `create`) -----------------------------------------
    def adopt_prefix(self, nodes: Sequence[int], prompt: Sequence[int], op: Op) -> None:
        """Start as the committed prefix of the radix-tree `nodes` (matched from `prompt`):
        acquire the nodes and hold every in-window page. Only for a fresh handle inside
        `create`'s op: the handle's own fields are set directly (a failed create drops the
        handle), the shared pages and nodes through `op`."""
        t, st = self._t, self._st
        m = len(nodes) * t
        self.committed = list(prompt[:m])
        self.capacity = self.history = m
        self.num_blocks = self.num_committed_blocks = len(nodes)
        self.tree_nodes = list(nodes)
        for nid in nodes:
            st.tree.acquire(nid, op)
        for i, lc in enumerate(self._lcs):
            s, e = window.out_of_window(lc, m, t)
            self._stale[i] = (s, e)
            self.pages[i] = [None] * len(nodes)
            self.locked[i] = [False] * len(nodes)
            for b, nid in enumerate(nodes):
                if s <= b < e:
                    continue
                pid = st.tree.nodes[nid].pages[i]
                assert pid is not None
                page = st.pages[pid]
                self.pages[i][b] = page
                op.set(page, "holds", page.holds + 1)
                st.requeue(page, op)
        self._next_change = window.next_window_move(self._lcs, m, t)

    # ---- checks ------------------------------------------------------------------------
    def _check_lc(self, lc: int) -> None:
        if isinstance(lc, bool) or not isinstance(lc, int) or not 0 <= lc < len(self._lcs):
            raise UnknownLifeCycleError(
                f"life cycle {lc!r} does not exist (have 0..{len(self._lcs) - 1})"
            )

    def _require(self, what: str, *allowed: SeqStatus) -> None:
        self._txn.check_open()
        if self.status is SeqStatus.CLOSED:
            raise SequenceClosedError(f"sequence {self.seq_id} is closed; cannot {what}")
        if self.status not in allowed:
            names = "/".join(s.name for s in allowed)
            raise SequenceStateError(
                f"sequence {self.seq_id} is {self.status.name}; {what} needs {names}"
            )

    # ---- entry helpers -----------------------------------------------------------------
    def _set_index(self, i: int, b: int, value: int, op: Op) -> None:
        op.setitem(self.index, (i, b), value)
        self._index_dirty = True

    def _unlock(self, i: int, b: int, page: Page, op: Op) -> None:
        op.set(page, "locks", page.locks - 1)
        if all(s.id != self.stream.id for s in page.users):
            op.set(page, "users", (*page.users, self.stream))
        op.setitem(self.locked[i], b, False)
        self._set_index(i, b, BAD_PAGE_INDEX, op)

    def _release_entry(self, i: int, b: int, op: Op) -> None:
        page = self.pages[i][b]
        if page is None:
            return
        if self.locked[i][b]:
            self._unlock(i, b, page, op)
        else:
            op.set(page, "holds", page.holds - 1)
        op.setitem(self.pages[i], b, None)
        self._st.settle(page, op, self.seq_id)

    def _install(self, i: int, b: int, slot: int, evs: Events, op: Op, wait: bool) -> None:
        page = self._st.new_page(i, GPU_LEVEL, slot, self.seq_id, b, op)
        page.locks = 1  # a fresh object: the registry undo entry covers it
        if wait:
            self._st.wait_for(self.stream, evs, op, self.seq_id)
        op.setitem(self.pages[i], b, page)
        op.setitem(self.locked[i], b, True)
        self._set_index(i, b, slot, op)

    # ---- stale transition (shared by resize and commit) --------------------------------
    def _stale_transition(self, h: int, op: Op) -> list[Page]:
        """Unlock blocks that leave the window at history `h`. Returns the orphans:
        uncommitted pages no entry keeps, HELD by the caller until it settles them."""
        orphans: list[Page] = []
        if h < self._next_change:
            return orphans  # no stale range moves below this history
        st = self._st
        for i, lc in enumerate(self._lcs):
            if lc.window is None:
                continue
            s0, e0 = self._stale[i]
            s1, e1 = window.out_of_window(lc, h, self._t)
            if (s0, e0) == (s1, e1):
                continue
            op.setitem(self._stale, i, (s1, e1))
            for b in range(max(e0, s1), min(self.num_blocks, e1)):
                page = self.pages[i][b]
                if page is None or not self.locked[i][b]:
                    continue
                self._unlock(i, b, page, op)
                if b >= self.num_committed_blocks and self.commit_state is CommitState.ALLOWED:
                    op.set(page, "holds", page.holds + 1)  # kept for a later commit
                    st.requeue(page, op)
                else:
                    op.setitem(self.pages[i], b, None)
                    # A backup holder keeps the page (committed ones too) until growth has
                    # succeeded, as upstream's backup_holders: it may migrate, not drop.
                    op.set(page, "holds", page.holds + 1)
                    st.requeue(page, op)
                    orphans.append(page)
        op.set(self, "_next_change", window.next_window_move(self._lcs, h, self._t))
        return orphans

    def _parkable(self, page: Page) -> bool:
        pc = self._cfg.pocket
        return (pc.enabled and self._lcs[page.lc].is_swa
                and not page.committed
                and self.commit_state is not CommitState.ALLOWED
                and page.level == GPU_LEVEL and page.has_slot
                and len(self.pocket[page.lc]) < pc.capacity)

    def _settle_orphans(self, orphans: list[Page], op: Op, park: bool) -> None:
        for page in orphans:
            if park and self._parkable(page):
                pocket = self.pocket[page.lc]
                pocket.append(page)
                op.on_undo(pocket.pop)
                op.set(page, "pocket_owner", self.seq_id)
                self._st.requeue(page, op)  # under `pin` this unqueues it
                op.choose(("park", self.seq_id, page.lc, page.pid))
                op.count("pocket_parks", self.seq_id)
            else:
                op.set(page, "holds", page.holds - 1)
                self._st.settle(page, op, self.seq_id)

    def _pop(self, i: int, op: Op) -> tuple[int, Events, bool] | None:
        """Take a slot from the pocket (oldest first). Returns (slot, events, wait)."""
        pocket, st, seq = self.pocket[i], self._st, self.seq_id
        policy = self._cfg.pocket.policy
        while pocket:
            page = pocket.popleft()
            op.on_undo(pocket.appendleft, page)
            op.set(page, "pocket_owner", None)
            if policy is PocketPolicy.REVALIDATE and not (
                page.alive and page.level == GPU_LEVEL and page.has_slot
            ):
                op.choose(("refuse", seq, i, page.pid))
                op.count("pocket_refusals", seq)
                op.set(page, "holds", page.holds - 1)
                st.settle(page, op, seq)
                continue
            # `unsafe` takes the slot id whatever level the page is at now: the bug (a host
            # slot id after a migration, NO_SLOT after evict_parked=drop released it).
            st.unqueue(page, op)
            evs = page.events + tuple(
                st.stream_fence(s, op, seq) for s in page.users if s.id != self.stream.id
            )
            slot = page.slot
            op.set(page, "slot", NO_SLOT)
            op.set(page, "holds", page.holds - 1)
            st.settle(page, op, seq)
            op.choose(("pop", seq, i, page.pid))
            op.count("pocket_pops", seq)
            return slot, evs, policy is not PocketPolicy.UNSAFE
        return None

    def _drain_pocket(self, op: Op) -> None:
        for pocket in self.pocket:
            while pocket:
                page = pocket.popleft()
                op.on_undo(pocket.appendleft, page)
                op.set(page, "pocket_owner", None)
                op.set(page, "holds", page.holds - 1)
                self._st.settle(page, op, self.seq_id)

    def _on_stop_committing(self, op: Op) -> None:
        """Held uncommitted stale entries lose their reason to exist: they die."""
        for i, lc in enumerate(self._lcs):
            if lc.window is None:
                continue
            s, e = self._stale[i]
            for b in range(max(s, self.num_committed_blocks), min(e, self.num_blocks)):
                page = self.pages[i][b]
                if page is not None and not self.locked[i][b] and not page.committed:
                    self._release_entry(i, b, op)

    # ---- resize ------------------------------------------------------------------------
    def resize(self, capacity: int | None = None,
               history_length: int | None = None) -> ResizeResult:
        """Set capacity and history (None: keep). A falsy result naming the capacity
        failure (and no change) if out of pages."""
        self._require("resize", SeqStatus.ACTIVE)
        cap = self.capacity if capacity is None else capacity
        h = self.history if history_length is None else history_length
        max_cap = self._max_cap
        for name, v in (("capacity", cap), ("history_length", h)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise CapacityError(
                    f"resize: {name} must be an int in [0, {max_cap}] (max_blocks * "
                    f"tokens_per_block), got {v!r:.40}", parameter=name)
        if h < self.history:
            raise HistoryDecreaseError(
                f"sequence {self.seq_id}: history_length may not decrease ({self.history} -> {h})",
                parameter="history_length")
        if cap < h:
            raise CapacityError(f"sequence {self.seq_id}: capacity {cap} < history_length {h}",
                                parameter="capacity")
        if cap > max_cap:
            raise CapacityError(
                f"sequence {self.seq_id}: capacity {cap} exceeds max_blocks * tokens_per_block"
                f" = {max_cap}", parameter="capacity")
        nb = -(-cap // self._t)
        if nb == self.num_blocks and h < self._next_change:
            # Fast path: same blocks, same stale ranges; nothing to allocate or unlock.
            self.capacity = cap
            self.history = h
            self._txn.reset_choices()
            return RESIZE_OK
        try:
            self._txn.run(lambda op: self._resize_slow(cap, h, nb, op))
        except CapacityFailure as exc:
            return ResizeResult.failed(exc)
        return RESIZE_OK

    def _resize_slow(self, cap: int, h: int, nb: int, op: Op) -> None:
        orphans = self._stale_transition(h, op)
        if nb < self.num_blocks:
            self._shrink(nb, op)
        elif nb > self.num_blocks:
            self._grow(nb, op)
        op.set(self, "capacity", cap)
        op.set(self, "history", h)
        self._settle_orphans(orphans, op, park=True)  # only after growth succeeded

    def _shrink(self, nb: int, op: Op) -> None:
        for b in range(self.num_blocks - 1, nb - 1, -1):
            for i in range(len(self._lcs)):
                self._release_entry(i, b, op)
        for pl in self.pages:
            self._truncate(pl, nb, op)
        for ll in self.locked:
            self._truncate(ll, nb, op)
        op.set(self, "num_blocks", nb)

    @staticmethod
    def _truncate(lst: list[Any], n: int, op: Op) -> None:
        tail = lst[n:]
        del lst[n:]
        op.on_undo(lst.extend, tail)

    def _grow(self, nb: int, op: Op) -> None:
        old = self.num_blocks
        for i in range(len(self._lcs)):
            self.pages[i].extend([None] * (nb - old))
            op.on_undo(_del_tail, self.pages[i], old)
            self.locked[i].extend([False] * (nb - old))
            op.on_undo(_del_tail, self.locked[i], old)
        op.set(self, "num_blocks", nb)
        pocket_on = self._pocket_on
        need: list[tuple[int, int]] = []
        per_group = [0] * self._st.num_groups
        for b in range(old, nb):
            for i, lc in enumerate(self._lcs):
                if lc.window is not None:
                    s, e = self._stale[i]
                    if s <= b < e:
                        continue  # born out of window: no page
                    if pocket_on:
                        got = self._pop(i, op)
                        if got is not None:
                            self._install(i, b, got[0], got[1], op, wait=got[2])
                            continue
                need.append((i, b))
                per_group[lc.pool_group] += 1
        for g, n in enumerate(per_group):
            if n:
                self._st.make_room(GPU_LEVEL, g, n, op, self.seq_id)
        for i, b in need:
            slot, evs = self._st.alloc(GPU_LEVEL, self._lcs[i].pool_group, op, self.seq_id)
            self._install(i, b, slot, evs, op, wait=True)

    # ---- commit ------------------------------------------------------------------------
    def commit(self, tokens: Sequence[int]) -> None:
        """Append committed tokens; full blocks go into the radix tree."""
        self._require("commit", SeqStatus.ACTIVE)
        if self.commit_state is not CommitState.ALLOWED:
            raise CommitNotAllowedError(
                f"sequence {self.seq_id}: commit after stop_committing (state USER_STOP)"
            )
        toks = checked_tokens(tokens, f"commit (sequence {self.seq_id})", "tokens")
        if len(self.committed) + len(toks) > self.capacity:
            raise CapacityError(
                f"sequence {self.seq_id}: {len(self.committed)} committed + {len(toks)} "
                f"new tokens exceed capacity {self.capacity}", parameter="tokens"
            )
        self._txn.run(lambda op: self._commit(toks, op))

    def _commit(self, toks: list[int], op: Op) -> None:
        st, tree, t = self._st, self._st.tree, self._t
        self.committed.extend(toks)
        op.on_undo(_del_tail, self.committed, len(self.committed) - len(toks))
        while (self.commit_state is CommitState.ALLOWED
               and self.num_committed_blocks < len(self.committed) // t):
            b = self.num_committed_blocks
            parent = self.tree_nodes[-1] if b else ROOT
            key = tuple(self.committed[b * t:(b + 1) * t])
            nid = tree.find(parent, key)
            if nid is not None and tree.nodes[nid].has_page():
                # Simplification: no rebasing onto an existing block; stop committing.
                op.set(self, "commit_state", CommitState.USER_STOP)
                self._on_stop_committing(op)
                break
            if nid is None:
                nid = tree.add(parent, key, op)
            for i in range(len(self._lcs)):
                page = self.pages[i][b] if b < self.num_blocks else None
                if page is None:
                    continue
                op.set(page, "committed", True)
                op.set(page, "owner", None)
                # Readers that reuse the block must wait for this stream's writes to it
                # (upstream: convert_to_committed records the committer's finish event).
                if all(u.id != self.stream.id for u in page.users):
                    op.set(page, "users", (*page.users, self.stream))
                op.set(page, "node", nid)
                tree.set_page(nid, i, page.pid, op)
                s, e = self._stale[i]
                if s <= b < e and not self.locked[i][b]:
                    self._release_entry(i, b, op)  # committed stale: only the tree keeps it
                else:
                    st.requeue(page, op)
            self.tree_nodes.append(nid)
            op.on_undo(self.tree_nodes.pop)
            tree.acquire(nid, op)
            op.set(self, "num_committed_blocks", b + 1)
        if self.history < len(self.committed):
            h = len(self.committed)
            orphans = self._stale_transition(h, op)
            op.set(self, "history", h)
            self._settle_orphans(orphans, op, park=False)

    def stop_committing(self) -> None:
        self._require("stop_committing", SeqStatus.ACTIVE, SeqStatus.SUSPENDED)
        if self.commit_state is CommitState.USER_STOP:
            self._txn.reset_choices()
            return

        def body(op: Op) -> None:
            op.set(self, "commit_state", CommitState.USER_STOP)
            self._on_stop_committing(op)

        self._txn.run(body)

    # ---- suspend / resume / close ------------------------------------------------------
    def suspend(self) -> None:
        self._require("suspend", SeqStatus.ACTIVE)

        def body(op: Op) -> None:
            self._drain_pocket(op)
            for i in range(len(self._lcs)):
                for b in range(self.num_blocks):
                    page = self.pages[i][b]
                    if page is not None and self.locked[i][b]:
                        self._unlock(i, b, page, op)
                        op.set(page, "holds", page.holds + 1)
                        self._st.requeue(page, op)
            op.set(self, "status", SeqStatus.SUSPENDED)

        self._txn.run(body)

    def resume(self) -> ResumeResult:
        """Bring every in-window page to GPU and lock it; all or nothing (a falsy result
        naming the capacity failure, and no change, if out of pages)."""
        self._require("resume", SeqStatus.SUSPENDED)
        try:
            self._txn.run(self._resume)
        except CapacityFailure as exc:
            return ResumeResult.failed(exc)
        return RESUME_OK

    def _resume(self, op: Op) -> None:
        st = self._st
        own: list[Page] = []
        targets: list[tuple[int, int, Page]] = []
        for i, lc in enumerate(self._lcs):
            s, e = window.out_of_window(lc, self.history, self._t)
            for b in range(self.num_blocks):
                page = self.pages[i][b]
                if page is None:
                    continue
                own.append(page)
                if not (s <= b < e):
                    targets.append((i, b, page))
        for _, _, page in targets:  # pin: making room must never evict what we bring back
            st.unqueue(page, op)
        st.bring_to_gpu([p for _, _, p in targets], op, self.seq_id)
        for i, b, page in targets:
            # Order after every earlier user's work on the page (e.g. the sequence that
            # wrote a reused prefix block), not only after its last fenced events.
            evs = st.fence(page, op, self.seq_id)
            st.wait_for(self.stream, evs, op, self.seq_id)
            op.set(page, "holds", page.holds - 1)
            op.set(page, "locks", page.locks + 1)
            op.setitem(self.locked[i], b, True)
            self._set_index(i, b, page.slot, op)
        for page in own:
            st.requeue(page, op)
        op.set(self, "status", SeqStatus.ACTIVE)

    def close(self) -> None:
        """Release everything (last block first). Idempotent.

        Never raises a `CorruptionError`: on a corrupted manager (a slot this sequence
        releases is already free, or another live page claims it, e.g. after the `unsafe`
        pocket policy aliased it) the slot is left to its other claimant, the corruption
        is reported (`CorruptionWarning`, `KVCacheManager.corruption`, the shutdown
        report) and the close completes; if even that fails, the sequence stays open and
        the shutdown report lists it."""
        self._txn.check_open()
        if self.status is SeqStatus.CLOSED:
            self._txn.reset_choices()
            return
        try:
            self._txn.run(self._close)
        except CorruptionError as exc:
            self._corruption(f"close of sequence {self.seq_id}: {exc}")
            findings: list[str] = []

            def salvage(op: Op) -> None:
                findings.clear()
                self._detach_unsafe_slots(op, findings)
                self._close(op)

            try:
                self._txn.run(salvage)
            except CorruptionError as again:
                self._corruption(f"close of sequence {self.seq_id} failed; it stays "
                                 f"open: {again}")
                return
            for finding in findings:
                self._corruption(finding)

    def _close(self, op: Op) -> None:
        self._drain_pocket(op)
        for b in range(self.num_blocks - 1, -1, -1):
            for i in range(len(self._lcs)):
                self._release_entry(i, b, op)
        for nid in reversed(self.tree_nodes):
            self._st.tree.release(nid, op)
        op.set(self, "tree_nodes", [])
        op.set(self, "commit_state", CommitState.USER_STOP)
        op.set(self, "status", SeqStatus.CLOSED)

    def _corruption(self, finding: str) -> None:
        if self._on_corruption is not None:
            self._on_corruption(finding)
        else:
            warnings.warn(finding, CorruptionWarning, stacklevel=3)

    def _detach_unsafe_slots(self, op: Op, findings: list[str]) -> None:
        """Salvage after a corruption: a page of this sequence whose slot another live
        page also claims, or that its allocator holds free, gives the slot up (NO_SLOT),
        so releasing the page frees nothing that is not its own."""
        st = self._st
        claims = Counter((p.level, p.group, p.slot) for p in st.pages.values() if p.has_slot)
        mine: dict[int, Page] = {}
        for row in self.pages:
            mine.update((p.pid, p) for p in row if p is not None)
        for pocket in self.pocket:
            mine.update((p.pid, p) for p in pocket)
        for page in mine.values():
            if not page.has_slot:
                continue
            where = (page.level, page.group, page.slot)
            free = page.slot not in st.allocs[page.level][page.group].occupied
            if claims[where] > 1 or free:
                why = "free in its allocator" if free else "also claimed by another page"
                findings.append(f"page {page.pid} of sequence {self.seq_id}: slot "
                                f"(level, pool group, slot) {where} is {why}; the page gave "
                                "it up unreleased")
                claims[where] -= 1
                op.set(page, "slot", NO_SLOT)
