"""The invariant catalogue: named predicates with one-line English statements.

Scope `step`: holds after every page-layer action (Z3 proves these inductive).
Scope `api`: holds between API actions only; inside an API action a page may
be briefly unqueued, unlocked or migrating. `aux` invariants are strengthening
lemmas the induction proof needs; they are stated here like the others.
All predicates use the `Ops` vocabulary, so Z3 reads them too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from .config import (
    BAD_PAGE_INDEX,
    GPU_LEVEL,
    NO_SLOT,
    NONE,
    CommitState,
    PageStatus,
    PocketPolicy,
    SeqStatus,
)
from .logic import Ops, Term
from .pages import in_pocket, moving, page_slot_ix, pool_group
from .state import Layout, State, evictable, stale, status

Scope = Literal["step", "api"]


PageTerm = Callable[[Ops, Layout, State, Term], Term]


@dataclass(frozen=True)
class ForEachPage:
    """An invariant of the form "for every page record p: when(p) implies then(p)" (no
    `when`: then(p) for every p). Written once, on one page, it is read four ways: as the
    predicate over every record (what the bounded Z3 engines and the executable model
    read), as the fast full check over the records in use and the local check over the
    records a step changed (`fastcheck.derived_checks`), and quantified over the page sort
    (`verify/proofs/parametric.py`). `when` is evaluated first on plain values, so the
    conclusion is built only for the records it selects."""

    then: PageTerm
    when: PageTerm | None = None

    def at(self, ops: Ops, lay: Layout, s: State, p: Term) -> Term:
        """The statement for one page record (p: an int or a term)."""
        body = self.then(ops, lay, s, p)
        return body if self.when is None else ops.implies(self.when(ops, lay, s, p), body)

    def __call__(self, ops: Ops, lay: Layout, s: State) -> Term:
        return ops.and_(*(self.at(ops, lay, s, p) for p in range(lay.pages)))


class EntryAt(NamedTuple):
    """One block entry: its sequence, life cycle and ordinal, and its flat position `ix`
    (an int, or a term on the symbolic engines) in the entry arrays."""

    seq: int
    lc: int
    ordinal: int
    ix: Term


EntryTerm = Callable[[Ops, Layout, State, EntryAt], Term]


@dataclass(frozen=True)
class ForEachEntry:
    """An invariant of the form "for every block entry e of every sequence: when(e) implies
    then(e)" (no `when`: then(e) for every e). A statement reads the fields of its entry
    (at `e.ix`), of its sequence (at `e.seq`), and of the page its entry references (a
    lookup at `s.entry[e.ix]`) only: the fast full and local checks are derived from it on
    that understanding (`fastcheck.derived_entry_full`, `fastcheck.derived_entry_local`),
    and the predicate over every entry is what the bounded Z3 engines and the executable
    model read."""

    then: EntryTerm
    when: EntryTerm | None = None

    def at(self, ops: Ops, lay: Layout, s: State, e: EntryAt) -> Term:
        """The statement for one block entry."""
        body = self.then(ops, lay, s, e)
        return body if self.when is None else ops.implies(self.when(ops, lay, s, e), body)

    def __call__(self, ops: Ops, lay: Layout, s: State) -> Term:
        return ops.and_(*(
            self.at(ops, lay, s, EntryAt(seq, lc, o, lay.entry_ix(ops, seq, lc, o)))
            for seq in range(lay.seqs) for lc in range(lay.lcs) for o in range(lay.blocks)))


SeqTerm = Callable[[Ops, Layout, State, Term], Term]


@dataclass(frozen=True)
class ForEachSeq:
    """An invariant of the form "for every sequence q: then(q)". A statement reads the
    fields of its sequence (at q), its pocket positions (`Layout.pocket_range(q)`) and the
    fields of the pages those name only: the fast full and local checks are derived from
    it on that understanding (`fastcheck.derived_seq_full`, `fastcheck.derived_seq_local`:
    a real manager declares hundreds of sequences and runs a few), and the predicate over
    every sequence is what the bounded Z3 engines and the executable model read."""

    then: SeqTerm

    def at(self, ops: Ops, lay: Layout, s: State, q: Term) -> Term:
        """The statement for one sequence."""
        return self.then(ops, lay, s, q)

    def __call__(self, ops: Ops, lay: Layout, s: State) -> Term:
        return ops.and_(*(self.then(ops, lay, s, q) for q in range(lay.seqs)))


@dataclass(frozen=True)
class Invariant:
    name: str
    statement: str
    scope: Scope
    predicate: Callable[[Ops, Layout, State], Term]
    aux: bool = False  # a strengthening lemma rather than a safety property

    @property
    def per_page(self) -> ForEachPage | None:
        """The one-page form the engines derive from, when it is written in that form."""
        return self.predicate if isinstance(self.predicate, ForEachPage) else None

    @property
    def per_entry(self) -> ForEachEntry | None:
        """The one-entry form the executable checks derive from, when written in that form."""
        return self.predicate if isinstance(self.predicate, ForEachEntry) else None

    @property
    def per_seq(self) -> ForEachSeq | None:
        """The one-sequence form the executable checks derive from, when written in that form."""
        return self.predicate if isinstance(self.predicate, ForEachSeq) else None


def _pages(lay: Layout) -> range:
    return range(lay.pages)


def slot_owned_once(ops: Ops, lay: Layout, s: State) -> Term:
    conds = []
    for p in _pages(lay):
        ix = page_slot_ix(ops, lay, s, p)
        conds.append(ops.implies(
            ops.and_(s.alive[p], ops.ne(s.slot[p], NO_SLOT)),
            ops.and_(ops.ne(ix, -1), ops.eq(ops.lookup(s.slot_owner, ix, NONE), p)),
        ))
    for flat, owner in enumerate(s.slot_owner):
        level, pg, slot = lay.slot_coords(flat)
        holds_it = []
        for p in _pages(lay):
            own = ops.and_(ops.eq(s.level[p], level), ops.eq(s.slot[p], slot))
            reserved = ops.and_(ops.eq(s.dst_level[p], level), ops.eq(s.dst_slot[p], slot))
            holds_it.append(ops.and_(
                ops.eq(owner, p), s.alive[p], ops.eq(pool_group(ops, lay, s.lc[p]), pg),
                ops.or_(own, reserved),
            ))
        conds.append(ops.implies(ops.ne(owner, NONE), ops.or_(*holds_it)))
    return ops.and_(*conds)


dead_pages_are_blank = ForEachPage(
    when=lambda ops, lay, s, p: ops.not_(s.alive[p]),
    then=lambda ops, lay, s, p: ops.and_(
        ops.eq(s.slot[p], NO_SLOT), ops.not_(s.queued[p]), ops.eq(s.locks[p], 0),
        ops.eq(s.holds[p], 0), ops.eq(s.dst_level[p], NONE)))


locked_at_gpu = ForEachPage(
    when=lambda ops, lay, s, p: ops.lt(0, s.locks[p]),
    then=lambda ops, lay, s, p: ops.and_(
        s.alive[p], ops.eq(s.level[p], GPU_LEVEL), ops.ne(s.slot[p], NO_SLOT),
        ops.not_(s.queued[p]), ops.not_(moving(ops, s, p))))


queued_are_evictable = ForEachPage(
    when=lambda ops, lay, s, p: s.queued[p],
    then=lambda ops, lay, s, p: ops.and_(
        s.alive[p], ops.ne(s.slot[p], NO_SLOT), ops.not_(moving(ops, s, p)),
        evictable(ops, lay.cfg, s, p)))


def _entry_refs(ops: Ops, lay: Layout, s: State, p: int, locked: bool) -> Term:
    return ops.count([
        ops.and_(ops.eq(s.entry[e], p), s.entry_locked[e] if locked else ops.not_(s.entry_locked[e]))
        for e in range(len(s.entry))
    ])


def refcounts_match(ops: Ops, lay: Layout, s: State) -> Term:
    conds = []
    for p in _pages(lay):
        pocket_refs = ops.count([ops.eq(x, p) for x in s.pocket])
        conds.append(ops.eq(s.locks[p], _entry_refs(ops, lay, s, p, True)))
        conds.append(ops.eq(s.holds[p], ops.add(_entry_refs(ops, lay, s, p, False), pocket_refs)))
    return ops.and_(*conds)


def _entry_is_live(ops: Ops, lay: Layout, s: State, e: EntryAt) -> Term:
    page = s.entry[e.ix]
    live = ops.and_(
        ops.lookup(s.alive, page, False), ops.eq(ops.lookup(s.lc, page, -1), e.lc),
        ops.eq(ops.lookup(s.ordinal, page, -1), e.ordinal),
        ops.or_(ops.lookup(s.committed, page, False),
                ops.eq(ops.lookup(s.owner, page, NONE), e.seq)),
    )
    return ops.and_(ops.implies(ops.ne(page, NONE), live),
                    ops.implies(s.entry_locked[e.ix], ops.ne(page, NONE)))


entries_are_live = ForEachEntry(then=_entry_is_live)

index_matches_locks = ForEachEntry(then=lambda ops, lay, s, e: ops.eq(
    s.index[e.ix], ops.ite(s.entry_locked[e.ix], ops.lookup(s.slot, s.entry[e.ix], NO_SLOT),
                           BAD_PAGE_INDEX)))


def _pocket_positions(lay: Layout) -> list[tuple[int, int, int]]:
    return [(seq, lc, k) for seq in range(lay.seqs) for lc in range(lay.lcs)
            for k in range(lay.pocket_cap)]


def pocket_entries_orphaned(ops: Ops, lay: Layout, s: State) -> Term:
    conds = []
    for seq, lc, k in _pocket_positions(lay):
        page = s.pocket[lay.pocket_ix(ops, seq, lc, k)]
        referenced = ops.or_(*(ops.eq(x, page) for x in s.entry))
        conds.append(ops.implies(ops.ne(page, NONE), ops.and_(
            ops.lookup(s.alive, page, False), ops.not_(ops.lookup(s.committed, page, True)),
            ops.eq(status(ops, s, page), int(PageStatus.HELD)),
            ops.eq(ops.lookup(s.owner, page, NONE), seq), ops.eq(ops.lookup(s.lc, page, -1), lc),
            ops.not_(referenced),
        )))
    return ops.and_(*conds)


def committed_never_parked(ops: Ops, lay: Layout, s: State) -> Term:
    return ops.all_over(s.pocket, lambda x: ops.implies(
        ops.ne(x, NONE), ops.not_(ops.lookup(s.committed, x, True))))


def _pocket_packed(ops: Ops, lay: Layout, s: State, seq: Term) -> Term:
    conds = []
    for lc in range(lay.lcs):
        for k in range(lay.pocket_cap):
            cur = s.pocket[lay.pocket_ix(ops, seq, lc, k)]
            if not lay.cfg.life_cycles[lc].is_swa or not lay.cfg.pocket.enabled:
                conds.append(ops.eq(cur, NONE))
            if k + 1 < lay.pocket_cap:
                nxt = s.pocket[lay.pocket_ix(ops, seq, lc, k + 1)]
                conds.append(ops.implies(ops.eq(cur, NONE), ops.eq(nxt, NONE)))
            for j in range(k):
                conds.append(ops.implies(
                    ops.ne(cur, NONE), ops.ne(cur, s.pocket[lay.pocket_ix(ops, seq, lc, j)])
                ))
    return ops.and_(*conds)


pocket_packed_and_bounded = ForEachSeq(then=_pocket_packed)


def no_page_in_two_pockets(ops: Ops, lay: Layout, s: State) -> Term:
    pos = list(range(len(s.pocket)))
    return ops.and_(*(
        ops.implies(ops.ne(s.pocket[i], NONE), ops.ne(s.pocket[i], s.pocket[j]))
        for i in pos for j in pos if i < j
    ))


def _pockets_empty_unless_active(ops: Ops, lay: Layout, s: State, seq: Term) -> Term:
    inactive = ops.ne(s.seq_status[seq], int(SeqStatus.ACTIVE))
    return ops.and_(*(ops.implies(inactive, ops.eq(s.pocket[lay.pocket_ix(ops, seq, lc, k)], NONE))
                      for lc in range(lay.lcs) for k in range(lay.pocket_cap)))


inactive_pockets_empty = ForEachSeq(then=_pockets_empty_unless_active)


def pinned_pockets_stay(ops: Ops, lay: Layout, s: State) -> Term:
    if lay.cfg.pocket.policy != PocketPolicy.PIN:
        return ops.const(True)
    return ops.all_over(s.pocket, lambda x: ops.implies(ops.ne(x, NONE), ops.and_(
        ops.eq(ops.lookup(s.level, x, -1), GPU_LEVEL), ops.not_(ops.lookup(s.queued, x, True)),
        ops.ne(ops.lookup(s.slot, x, NO_SLOT), NO_SLOT), ops.not_(moving(ops, s, x)),
    )))


def popped_slots_valid(ops: Ops, lay: Layout, s: State) -> Term:
    return ops.not_(s.bad_pop)


def no_unsynced_reuse(ops: Ops, lay: Layout, s: State) -> Term:
    return ops.not_(s.unsynced_reuse)


lengths_ordered = ForEachSeq(then=lambda ops, lay, s, q: ops.and_(
    ops.le(0, s.committed_tokens[q]), ops.le(s.committed_tokens[q], s.history[q]),
    ops.le(s.history[q], s.capacity[q]), ops.le(s.capacity[q], lay.cfg.max_capacity)))


inactive_sequences_unlocked = ForEachEntry(
    when=lambda ops, lay, s, e: ops.ne(s.seq_status[e.seq], int(SeqStatus.ACTIVE)),
    then=lambda ops, lay, s, e: ops.not_(s.entry_locked[e.ix]))

# Not a step invariant: `create` holds prefix pages before the sequence leaves FREE.
gone_sequences_hold_nothing = ForEachEntry(
    when=lambda ops, lay, s, e: ops.or_(ops.eq(s.seq_status[e.seq], int(SeqStatus.FREE)),
                                        ops.eq(s.seq_status[e.seq], int(SeqStatus.CLOSED))),
    then=lambda ops, lay, s, e: ops.eq(s.entry[e.ix], NONE))


def values_in_range(ops: Ops, lay: Layout, s: State) -> Term:
    cfg = lay.cfg
    levels = cfg.num_levels

    def slot_fits(level: Term, slot: Term) -> Term:
        return ops.or_(*(
            ops.and_(ops.eq(level, lv), ops.le(0, slot), ops.lt(slot, lay.slots_at(lv)))
            for lv in range(levels)
        ))

    def between(x: Term, lo: int, hi: int) -> Term:
        return ops.and_(ops.le(lo, x), ops.lt(x, hi))

    conds = [ops.le(0, s.clock)]
    for p in _pages(lay):
        conds += [
            between(s.lc[p], 0, lay.lcs), between(s.level[p], 0, levels),
            ops.or_(ops.eq(s.slot[p], NO_SLOT), slot_fits(s.level[p], s.slot[p])),
            ops.le(0, s.locks[p]), ops.le(0, s.holds[p]), between(s.owner[p], NONE, lay.seqs),
            between(s.ordinal[p], 0, lay.blocks), ops.le(NONE, s.key[p]),
            ops.le(0, s.stamp[p]), ops.lt(s.stamp[p], ops.add(s.clock, 1)),
            ops.ite(ops.eq(s.dst_level[p], NONE), ops.eq(s.dst_slot[p], NO_SLOT),
                    slot_fits(s.dst_level[p], s.dst_slot[p])),
        ]
    conds += [between(x, NONE, lay.pages) for x in s.slot_owner]
    conds += [between(x, -1, lay.seqs + 1) for x in s.slot_busy]
    conds += [between(x, 0, len(SeqStatus)) for x in s.seq_status]
    conds += [between(x, 0, len(CommitState)) for x in s.commit_state]
    conds += [between(x, NONE, lay.pages) for x in s.entry]
    conds += [between(x, NONE, lay.pages) for x in s.pocket]
    return ops.and_(*conds)


# The one exception: a parked page dropped by the cascade (evict_parked=drop) keeps its
# pocket entry, without a slot, until a pop refuses it or a drain releases it.
live_pages_have_slots = ForEachPage(
    when=lambda ops, lay, s, p: s.alive[p],
    then=lambda ops, lay, s, p: ops.or_(
        ops.ne(s.slot[p], NO_SLOT),
        ops.and_(in_pocket(ops, s, p), ops.eq(s.level[p], GPU_LEVEL))
        if lay.cfg.pocket.drops_parked else ops.const(False)))


def _reserved(ops: Ops, lay: Layout, s: State, p: Term) -> Term:
    lvl, dst = s.level[p], s.dst_level[p]
    dst_ix = lay.slot_ix(ops, dst, pool_group(ops, lay, s.lc[p]), s.dst_slot[p])
    return ops.and_(
        s.alive[p], ops.ne(s.slot[p], NO_SLOT),
        ops.or_(ops.eq(dst, ops.add(lvl, 1)), ops.and_(ops.eq(dst, GPU_LEVEL),
                                                       ops.lt(GPU_LEVEL, lvl))),
        ops.ne(dst_ix, -1), ops.eq(ops.lookup(s.slot_owner, dst_ix, NONE), p),
    )


migrations_reserved = ForEachPage(when=lambda ops, lay, s, p: moving(ops, s, p), then=_reserved)


def dropped_pockets_stay_at_gpu(ops: Ops, lay: Layout, s: State) -> Term:
    if not lay.cfg.pocket.drops_parked:
        return ops.const(True)
    return ops.all_over(s.pocket, lambda x: ops.implies(ops.ne(x, NONE), ops.and_(
        ops.eq(ops.lookup(s.level, x, -1), GPU_LEVEL), ops.not_(moving(ops, s, x)),
    )))


# ---- between API actions only ----------------------------------------------------------------

def _should_queue(ops: Ops, lay: Layout, s: State, p: Term) -> Term:
    # pinned pocket pages excepted (the pocket is read only under the pin policy)
    pinned = in_pocket(ops, s, p) if lay.cfg.pocket.policy == PocketPolicy.PIN else \
        ops.const(False)
    should = ops.and_(evictable(ops, lay.cfg, s, p), ops.ne(s.slot[p], NO_SLOT),
                      ops.not_(pinned))
    return ops.eq(s.queued[p], should)


queue_follows_evictability = ForEachPage(
    when=lambda ops, lay, s, p: s.alive[p], then=_should_queue)

no_migration_in_flight = ForEachPage(then=lambda ops, lay, s, p: ops.not_(moving(ops, s, p)))

no_orphan_pages = ForEachPage(
    when=lambda ops, lay, s, p: ops.and_(
        s.alive[p], ops.eq(status(ops, s, p), int(PageStatus.DROPPABLE))),
    then=lambda ops, lay, s, p: ops.and_(s.committed[p], s.queued[p]))


def window_is_mapped(ops: Ops, lay: Layout, s: State) -> Term:
    """Concrete-history invariant: evaluated with the sequence's own history and capacity."""
    cfg = lay.cfg
    t = cfg.tokens_per_block
    conds = []
    for seq in range(lay.seqs):
        active = ops.eq(s.seq_status[seq], int(SeqStatus.ACTIVE))
        for lc in range(lay.lcs):
            for o in range(lay.blocks):
                e = lay.entry_ix(ops, seq, lc, o)
                in_cap = ops.lt(o * t, s.capacity[seq])
                out = stale(ops, cfg, lc, o, s.history[seq])
                mapped = ops.and_(s.entry_locked[e], ops.ne(s.index[e], BAD_PAGE_INDEX))
                conds.append(ops.implies(
                    ops.and_(active, in_cap, ops.not_(out)), mapped))
                conds.append(ops.implies(out, ops.eq(s.index[e], BAD_PAGE_INDEX)))
                conds.append(ops.implies(ops.not_(in_cap), ops.eq(s.entry[e], NONE)))
                kept = ops.eq(s.commit_state[seq], int(CommitState.ALLOWED))
                page = s.entry[e]
                conds.append(ops.implies(
                    ops.and_(out, ops.ne(page, NONE)),
                    ops.and_(kept, ops.not_(ops.lookup(s.committed, page, True))),
                ))
    return ops.and_(*conds)


INVARIANTS: tuple[Invariant, ...] = (
    Invariant("slot_owned_once", "No slot is owned twice, and every occupied slot belongs to "
              "the live page that sits in it (free + owned = all slots at every level and "
              "pool group).", "step", slot_owned_once),
    Invariant("locked_at_gpu", "A LOCKED page is at GPU with a valid slot, not queued and not "
              "migrating.", "step", locked_at_gpu),
    Invariant("queued_are_evictable", "A queued page is alive, has a slot, is not migrating "
              "and is evictable: (DROPPABLE and committed) or (HELD and above the last level).",
              "step", queued_are_evictable),
    Invariant("pocket_entries_orphaned", "A pocket entry is an uncommitted HELD page owned by "
              "that sequence and life cycle, and no block entry references it.", "step",
              pocket_entries_orphaned),
    Invariant("committed_never_parked", "Committed pages are never parked.", "step",
              committed_never_parked),
    Invariant("pocket_packed_and_bounded", "Pockets hold at most `capacity` distinct pages per "
              "life cycle, in FIFO order, and only for SWA life cycles with the pocket enabled.",
              "step", pocket_packed_and_bounded),
    Invariant("inactive_pockets_empty", "Pockets are empty for sequences that are not ACTIVE "
              "(suspend and close drain them).", "step", inactive_pockets_empty),
    Invariant("popped_slots_valid", "Every popped slot was a GPU slot, and its page was at GPU "
              "with a valid slot and not migrating.", "step", popped_slots_valid),
    Invariant("no_unsynced_reuse", "A slot is reused only after its last use completed, or on "
              "the same stream, or after waiting on its event.", "step", no_unsynced_reuse),
    Invariant("index_matches_locks", "Each page-index entry holds its block's locked page's "
              "slot, and BAD when the block holds no lock.", "step", index_matches_locks),
    Invariant("lengths_ordered", "committed tokens <= history <= capacity <= max capacity.",
              "step", lengths_ordered),
    Invariant("queue_follows_evictability", "Outside API actions a live page is queued exactly "
              "when it is evictable and has a slot (pinned pocket pages excepted).", "api",
              queue_follows_evictability),
    Invariant("window_is_mapped", "An ACTIVE sequence's page-index table maps every in-window "
              "block to its locked page's slot and every stale block to BAD; only blocks kept "
              "for committing stay held after leaving the window.", "api", window_is_mapped),
    Invariant("no_orphan_pages", "A DROPPABLE page exists only if it is committed and queued "
              "(nothing leaks).", "api", no_orphan_pages),
    Invariant("no_migration_in_flight", "No migration is in flight between API actions.", "api",
              no_migration_in_flight),
    # ---- strengthening lemmas used by the induction proofs ----
    Invariant("dead_pages_are_blank", "A dead page record has no slot, no holders or locks, "
              "and is neither queued nor migrating.", "step", dead_pages_are_blank, aux=True),
    Invariant("refcounts_match", "A page's lock count equals the block entries locking it; its "
              "hold count equals the block entries holding it plus pocket entries.", "step",
              refcounts_match, aux=True),
    Invariant("entries_are_live", "A block entry references a live page of that life cycle "
              "and ordinal, committed or owned by the sequence; only non-empty entries lock.",
              "step", entries_are_live, aux=True),
    Invariant("no_page_in_two_pockets", "No page sits in two pocket positions.", "step",
              no_page_in_two_pockets, aux=True),
    Invariant("inactive_sequences_unlocked", "Only ACTIVE sequences lock pages.", "step",
              inactive_sequences_unlocked, aux=True),
    Invariant("gone_sequences_hold_nothing", "FREE and CLOSED sequences hold no blocks.", "api",
              gone_sequences_hold_nothing),
    Invariant("values_in_range", "Every variable is within its type: life cycle, level, slot "
              "and destination slot exist at their level, counts are non-negative, stamps "
              "precede the clock, ids are NONE or a valid page/sequence/stream.", "step",
              values_in_range, aux=True),
    Invariant("live_pages_have_slots", "Every live page occupies a slot at its level (a page "
              "dies when it loses its last slot), except a parked page dropped under "
              "evict_parked=drop: at GPU, slotless, until its pocket entry is popped or "
              "drained.", "step", live_pages_have_slots, aux=True),
    Invariant("migrations_reserved", "A migrating page is alive with a slot, moves one level "
              "down or up to GPU, and owns its reserved destination slot.", "step",
              migrations_reserved, aux=True),
    Invariant("pinned_pockets_stay", "Under the pin policy a parked page stays at GPU with its "
              "slot, unqueued and not migrating.", "step", pinned_pockets_stay, aux=True),
    Invariant("dropped_pockets_stay_at_gpu", "Under evict_parked=drop a parked page stays at "
              "GPU and never migrates (the cascade drops it instead).", "step",
              dropped_pockets_stay_at_gpu, aux=True),
)

INVARIANTS_BY_NAME: dict[str, Invariant] = {i.name: i for i in INVARIANTS}


def in_scope(inv: Invariant, scope: Scope | None) -> bool:
    """Scope `api` includes the `step` invariants (they hold between API actions too)."""
    return scope is None or inv.scope == scope or (scope == "api" and inv.scope == "step")
