"""Fast concrete companions of the costliest invariants.

The invariants in `invariants.py` are written once, in the vocabulary Z3 reads;
evaluated on plain values some are quadratic (every page against every block
entry). The executable model checks them after every lockstep step, so these
companions compute the same truth values in one pass. They are not a second
definition: `tests/model/test_fastcheck.py` checks, on reachable states and on
states with fields perturbed at random, that each agrees exactly with its
definition, so a companion that drifted would fail there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from .config import (
    BAD_PAGE_INDEX,
    GPU_LEVEL,
    NO_SLOT,
    NONE,
    CommitState,
    PageStatus,
    PocketPolicy,
    SeqStatus,
    stale_range,
)
from .logic import CONCRETE, Array
from .sparse import SparseArray, used_in, used_items
from .state import IDLE, Layout, State

Check = Callable[[Layout, State], bool]


def _page_ok(lay: Layout, page: int) -> bool:
    return 0 <= page < lay.pages


def _used(n: int, *arrays: Array) -> Iterable[int]:
    """The positions (of arrays of length n) where any of `arrays` is not at its initial
    value: only those can break a check that holds at Init position by position. Every
    position when one of them is a tuple."""
    sparse = [a for a in arrays if isinstance(a, SparseArray)]
    if len(sparse) < len(arrays):
        return range(n)
    return sparse[0].used() if len(sparse) == 1 else set().union(*(a.used() for a in sparse))


def _entry_coords(lay: Layout, e: int) -> tuple[int, int, int]:
    """(sequence, life cycle, ordinal) of a flat block-entry position."""
    seq_lc, o = divmod(e, lay.blocks)
    seq, lc = divmod(seq_lc, lay.lcs)
    return seq, lc, o


def slot_owned_once(lay: Layout, s: State) -> bool:
    cfg = lay.cfg
    claims: dict[int, set[int]] = {}  # flat slot -> pages sitting in or reserving it
    for p in _used(lay.pages, s.alive):
        if not s.alive[p]:
            continue
        lc = s.lc[p]
        pg = lay.pool_group_of_lc[lc] if 0 <= lc < lay.lcs else 0
        if s.slot[p] != NO_SLOT:
            ix = _flat(lay, s.level[p], pg, s.slot[p])
            if ix == -1 or s.slot_owner[ix] != p:
                return False
        for level, slot in ((s.level[p], s.slot[p]), (s.dst_level[p], s.dst_slot[p])):
            if 0 <= level < cfg.num_levels and 0 <= slot < lay.slots_at(level) and \
                    0 <= pg < cfg.num_pool_groups:
                claims.setdefault(_flat(lay, level, pg, slot), set()).add(p)
    return all(owner == NONE or owner in claims.get(flat, ())
               for flat, owner in used_items(s.slot_owner, NONE))


def _flat(lay: Layout, level: int, pg: int, slot: int) -> int:
    cfg = lay.cfg
    if not (0 <= level < cfg.num_levels and 0 <= pg < cfg.num_pool_groups):
        return -1
    n = lay.slots_at(level)
    return lay.level_offset(level) + pg * n + slot if 0 <= slot < n else -1


def refcounts_match(lay: Layout, s: State) -> bool:
    locks: Counter[int] = Counter()
    holds: Counter[int] = Counter()
    for e in _used(len(s.entry), s.entry, s.entry_locked):
        (locks if s.entry_locked[e] else holds)[s.entry[e]] += 1
    for _, page in used_items(s.pocket, NONE):
        holds[page] += 1
    pages = {p for p in (*locks, *holds) if _page_ok(lay, p)}
    pages.update(_used(lay.pages, s.locks, s.holds))
    return all(s.locks[p] == locks[p] and s.holds[p] == holds[p] for p in pages)


def entries_are_live(lay: Layout, s: State) -> bool:
    for e in _used(len(s.entry), s.entry, s.entry_locked):
        seq, lc, o = _entry_coords(lay, e)
        page = s.entry[e]
        if s.entry_locked[e] and page == NONE:
            return False
        if page == NONE:
            continue
        if not (_page_ok(lay, page) and s.alive[page] and s.lc[page] == lc
                and s.ordinal[page] == o and (s.committed[page] or s.owner[page] == seq)):
            return False
    return True


def pocket_entries_orphaned(lay: Layout, s: State) -> bool:
    referenced = {page for _, page in used_items(s.entry, NONE)}
    cap = lay.pocket_cap
    for k, page in used_items(s.pocket, NONE):
        seq, lc = divmod(k // cap, lay.lcs)
        if not _page_ok(lay, page):
            return False
        status = PageStatus.LOCKED if s.locks[page] > 0 else (
            PageStatus.HELD if s.holds[page] > 0 else PageStatus.DROPPABLE)
        if not (s.alive[page] and not s.committed[page] and status == PageStatus.HELD
                and s.owner[page] == seq and s.lc[page] == lc
                and page not in referenced):
            return False
    return True


def window_is_mapped(lay: Layout, s: State) -> bool:
    """The blocks within each sequence's capacity, and every block entry in use: a block
    past the capacity whose entry, lock and index are at their initial values passes."""
    t = lay.cfg.tokens_per_block
    if not all(isinstance(a, SparseArray) for a in (s.entry, s.entry_locked, s.index)):
        return all(_window_ok(lay, s, e) for e in range(len(s.entry)))
    positions: set[int] = set(_used(len(s.entry), s.entry, s.entry_locked, s.index))
    for seq in _used(lay.seqs, s.capacity):
        within = min(lay.blocks, -(-s.capacity[seq] // t))
        for lc_i in range(lay.lcs):
            base = (seq * lay.lcs + lc_i) * lay.blocks
            positions.update(range(base, base + within))
    # a stale block lies below the history, so within the capacity: covered above
    return all(_window_ok(lay, s, e) for e in positions)


def _window_ok(lay: Layout, s: State, e: int) -> bool:
    cfg = lay.cfg
    t = cfg.tokens_per_block
    seq, lc_i, o = _entry_coords(lay, e)
    lc = cfg.life_cycles[lc_i]
    active = s.seq_status[seq] == SeqStatus.ACTIVE
    kept = s.commit_state[seq] == CommitState.ALLOWED
    start, end = stale_range(lc, s.history[seq], t) if lc.window is not None else (0, 0)
    in_cap = o * t < s.capacity[seq]
    stale = start <= o < end
    if active and in_cap and not stale and not (
            s.entry_locked[e] and s.index[e] != BAD_PAGE_INDEX):
        return False
    if stale and s.index[e] != BAD_PAGE_INDEX:
        return False
    if not in_cap and s.entry[e] != NONE:
        return False
    page = s.entry[e]
    return not (stale and page != NONE and not (
        kept and not (s.committed[page] if _page_ok(lay, page) else True)))


def values_in_range(lay: Layout, s: State) -> bool:
    cfg = lay.cfg
    levels = cfg.num_levels

    def slot_fits(level: int, slot: int) -> bool:
        return 0 <= level < levels and 0 <= slot < lay.slots_at(level)

    if s.clock < 0:
        return False
    pages = _used(lay.pages, s.lc, s.level, s.slot, s.locks, s.holds, s.owner, s.ordinal,
                  s.key, s.stamp, s.dst_level, s.dst_slot)
    if not _pages_in_bounds(lay, s, pages, slot_fits):
        return False
    return (all(NONE <= x < lay.pages for _, x in used_items(s.slot_owner, NONE))
            and all(-1 <= x < lay.seqs + 1 for _, x in used_items(s.slot_busy, IDLE))
            and all(0 <= x < len(SeqStatus)
                    for _, x in used_items(s.seq_status, int(SeqStatus.FREE)))
            and all(0 <= x < len(CommitState)
                    for _, x in used_items(s.commit_state, int(CommitState.ALLOWED)))
            and all(NONE <= x < lay.pages for _, x in used_items(s.entry, NONE))
            and all(NONE <= x < lay.pages for _, x in used_items(s.pocket, NONE)))


def no_page_in_two_pockets(lay: Layout, s: State) -> bool:
    parked = [x for _, x in used_items(s.pocket, NONE)]
    return len(parked) == len(set(parked))


def index_matches_locks(lay: Layout, s: State) -> bool:
    slot, n = s.slot, len(s.slot)
    for e in _used(len(s.entry), s.entry, s.entry_locked, s.index):
        page = s.entry[e]
        locked_slot = slot[page] if 0 <= page < n else NO_SLOT
        if s.index[e] != (locked_slot if s.entry_locked[e] else BAD_PAGE_INDEX):
            return False
    return True


def inactive_sequences_unlocked(lay: Layout, s: State) -> bool:
    per_seq = lay.lcs * lay.blocks
    return all(s.seq_status[e // per_seq] == SeqStatus.ACTIVE
               for e, locked in used_items(s.entry_locked, False) if locked)


def gone_sequences_hold_nothing(lay: Layout, s: State) -> bool:
    gone = (SeqStatus.FREE, SeqStatus.CLOSED)
    per_seq = lay.lcs * lay.blocks
    return all(s.seq_status[e // per_seq] not in gone for e, _ in used_items(s.entry, NONE))


def _evictable(lay: Layout, s: State, p: int) -> bool:
    """`state.evictable` on plain values (LOCKED never; HELD above the last level;
    DROPPABLE when committed)."""
    if s.locks[p] > 0:
        return False
    if s.holds[p] > 0:
        return bool(s.level[p] < lay.cfg.last_level)
    return bool(s.committed[p])


def queue_follows_evictability(lay: Layout, s: State) -> bool:
    """One pass, with the pocket as a set (the definition scans it once per page)."""
    pin = lay.cfg.pocket.policy == PocketPolicy.PIN
    parked = {x for _, x in used_items(s.pocket, NONE)} if pin else set()
    for p in _used(lay.pages, s.alive):
        if not s.alive[p]:
            continue
        should = _evictable(lay, s, p) and s.slot[p] != NO_SLOT and not (pin and p in parked)
        if s.queued[p] != should:
            return False
    return True


# The per-page invariants below are linear already; on plain values a loop with early
# exit is several times faster than building every page's term. A page record at its
# initial values satisfies each, so only the records in use are looked at.
def dead_pages_are_blank(lay: Layout, s: State) -> bool:
    return all(s.alive[p] or (s.slot[p] == NO_SLOT and not s.queued[p] and s.locks[p] == 0
                              and s.holds[p] == 0 and s.dst_level[p] == NONE)
               for p in _used(lay.pages, s.slot, s.queued, s.locks, s.holds, s.dst_level))


def locked_at_gpu(lay: Layout, s: State) -> bool:
    return all(not s.locks[p] > 0 or (
        bool(s.alive[p]) and s.level[p] == GPU_LEVEL and s.slot[p] != NO_SLOT
        and not s.queued[p] and s.dst_level[p] == NONE) for p in _used(lay.pages, s.locks))


def queued_are_evictable(lay: Layout, s: State) -> bool:
    return all(not s.queued[p] or (
        bool(s.alive[p]) and s.slot[p] != NO_SLOT and s.dst_level[p] == NONE
        and _evictable(lay, s, p)) for p in _used(lay.pages, s.queued))


def live_pages_have_slots(lay: Layout, s: State) -> bool:
    dropped = lay.cfg.pocket.drops_parked
    parked = {x for _, x in used_items(s.pocket, NONE)} if dropped else set()
    return all(not s.alive[p] or s.slot[p] != NO_SLOT
               or (dropped and p in parked and s.level[p] == GPU_LEVEL)
               for p in _used(lay.pages, s.alive))


def no_orphan_pages(lay: Layout, s: State) -> bool:
    return all(not (s.alive[p] and s.locks[p] <= 0 and s.holds[p] <= 0)
               or bool(s.committed[p] and s.queued[p]) for p in _used(lay.pages, s.alive))


def no_migration_in_flight(lay: Layout, s: State) -> bool:
    return all(s.dst_level[p] == NONE for p in _used(lay.pages, s.dst_level))


def migrations_reserved(lay: Layout, s: State) -> bool:
    """Only pages in flight are examined (the definition builds a term for every page)."""
    return _migrations_at(lay, s, _used(lay.pages, s.dst_level))


FAST: dict[str, Check] = {
    "queue_follows_evictability": queue_follows_evictability,
    "dead_pages_are_blank": dead_pages_are_blank,
    "locked_at_gpu": locked_at_gpu,
    "queued_are_evictable": queued_are_evictable,
    "live_pages_have_slots": live_pages_have_slots,
    "no_orphan_pages": no_orphan_pages,
    "migrations_reserved": migrations_reserved,
    "no_migration_in_flight": no_migration_in_flight,
    "index_matches_locks": index_matches_locks,
    "inactive_sequences_unlocked": inactive_sequences_unlocked,
    "gone_sequences_hold_nothing": gone_sequences_hold_nothing,
    "slot_owned_once": slot_owned_once,
    "refcounts_match": refcounts_match,
    "entries_are_live": entries_are_live,
    "pocket_entries_orphaned": pocket_entries_orphaned,
    "window_is_mapped": window_is_mapped,
    "values_in_range": values_in_range,
    "no_page_in_two_pockets": no_page_in_two_pockets,
}


# ---- checks of what changed ----------------------------------------------------------------
# The incremental checker (`incremental.py`) re-checks an invariant that held in the last
# state it checked. On sparse states it knows which positions of each array may have
# changed since then (`Delta`), and the checks below look at those positions and what
# depends on them only. Each returns None when it cannot tell (positions unknown, or a
# global input changed in a way it does not follow): the full check then runs.
# `tests/model/test_incremental.py` checks that runs with them agree with the full check.

PAGE_FIELDS = ("alive", "lc", "committed", "level", "slot", "locks", "holds", "queued",
               "stamp", "owner", "ordinal", "key", "dst_level", "dst_slot")
ENTRY_FIELDS = ("entry", "entry_locked", "index")
SEQ_FIELDS = ("seq_status", "commit_state", "capacity", "history", "committed_tokens")


class EntryRefs:
    """Which block entries reference each page, for one `entry` array (`array`): kept by
    the incremental checker from state to state and brought up to date from the positions
    that changed, so a check asking which entries reference a changed page costs what
    changed, not the entries in use (three local checks ask after most events)."""

    def __init__(self) -> None:
        self.array: Array | None = None
        self.by_page: dict[int, set[int]] = {}

    def follow(self, entry: Array, changed: set[int] | None) -> None:
        """Bring the map to `entry`; `changed`: the positions where it may differ from the
        array the map is for (None: unknown, rebuilt)."""
        if entry is self.array:
            return
        old, by_page = self.array, self.by_page
        if old is None or changed is None:
            by_page.clear()
            for e, page in used_items(entry, NONE):
                by_page.setdefault(page, set()).add(e)
        else:
            for e in changed:
                was, now = old[e], entry[e]
                if was != now:
                    if was != NONE:
                        refs = by_page[was]
                        refs.discard(e)
                        if not refs:
                            del by_page[was]
                    if now != NONE:
                        by_page.setdefault(now, set()).add(e)
        self.array = entry


class Delta:
    """What changed from `old` (a state whose invariants were checked) to `new`."""

    def __init__(self, old: State, new: State, changed: frozenset[str],
                 refs: EntryRefs | None = None) -> None:
        self.old, self.new, self.changed = old, new, changed
        self._at: dict[str, set[int] | None] = {}
        self._refs = refs

    def entries_of(self, pages: set[int]) -> set[int]:
        """The block entries (in use in `new`) that reference one of `pages`."""
        if not pages:
            return set()
        refs = self._refs
        if refs is None:
            return _entries_of_pages(self.new, pages)
        entry = self.new.entry
        if refs.array is not entry:
            known: set[int] | None = None
            if refs.array is self.old.entry:
                known = self._field("entry")
            elif isinstance(entry, SparseArray) and isinstance(refs.array, SparseArray):
                known = entry.changed_since(refs.array)
            refs.follow(entry, known)
        by_page = refs.by_page
        return {e for p in pages for e in by_page.get(p, ())}

    def _field(self, name: str) -> set[int] | None:
        if name not in self.changed:
            return set()
        if name in self._at:
            return self._at[name]
        new, old = getattr(self.new, name), getattr(self.old, name)
        pos: set[int] | None = None
        if isinstance(new, SparseArray) and isinstance(old, SparseArray):
            pos = new.changed_since(old)
        elif isinstance(new, tuple) and isinstance(old, tuple) and len(new) == len(old) \
                and len(new) <= _COMPARED:
            pos = {i for i, (a, b) in enumerate(zip(new, old, strict=True))
                   if a is not b and a != b}
        self._at[name] = pos
        return pos

    def at(self, *names: str) -> set[int] | None:
        """Positions where any of these arrays may differ; None when not known."""
        out: set[int] = set()
        for name in names:
            pos = self._field(name)
            if pos is None:
                return None
            out |= pos
        return out


_COMPARED = 1024  # tuples up to this length are compared position by position
Local = Callable[[Layout, State, Delta], "bool | None"]


def _per_page(check_at: Callable[[Layout, State, Iterable[int]], bool],
              globals_read: tuple[str, ...] = ()) -> Local:
    """A per-page invariant: only the changed pages. One that reads the pocket too (whether
    a page is parked) also looks at the pages that entered or left a changed position."""
    def local(lay: Layout, s: State, d: Delta) -> bool | None:
        pages = d.at(*PAGE_FIELDS)
        if pages is None:
            return None
        if d.changed.intersection(globals_read):
            if set(globals_read) != {"pocket"}:
                return None
            moved = d.at("pocket")
            if moved is None:
                return None
            pages = pages | {st.pocket[k] for k in moved for st in (d.old, s)}
            pages = {p for p in pages if _page_ok(lay, p)}
        return check_at(lay, s, pages)
    return local


def _dead_blank_at(lay: Layout, s: State, pages: Iterable[int]) -> bool:
    return all(s.alive[p] or (s.slot[p] == NO_SLOT and not s.queued[p] and s.locks[p] == 0
                              and s.holds[p] == 0 and s.dst_level[p] == NONE) for p in pages)


def _locked_at_gpu_at(lay: Layout, s: State, pages: Iterable[int]) -> bool:
    return all(not s.locks[p] > 0 or (
        bool(s.alive[p]) and s.level[p] == GPU_LEVEL and s.slot[p] != NO_SLOT
        and not s.queued[p] and s.dst_level[p] == NONE) for p in pages)


def _queued_evictable_at(lay: Layout, s: State, pages: Iterable[int]) -> bool:
    return all(not s.queued[p] or (
        bool(s.alive[p]) and s.slot[p] != NO_SLOT and s.dst_level[p] == NONE
        and _evictable(lay, s, p)) for p in pages)


def _no_orphan_at(lay: Layout, s: State, pages: Iterable[int]) -> bool:
    return all(not (s.alive[p] and s.locks[p] <= 0 and s.holds[p] <= 0)
               or bool(s.committed[p] and s.queued[p]) for p in pages)


def _not_moving_at(lay: Layout, s: State, pages: Iterable[int]) -> bool:
    return all(s.dst_level[p] == NONE for p in pages)


def _live_slots_at(lay: Layout, s: State, pages: Iterable[int]) -> bool:
    dropped = lay.cfg.pocket.drops_parked
    parked = {x for _, x in used_items(s.pocket, NONE)} if dropped else set()
    return all(not s.alive[p] or s.slot[p] != NO_SLOT
               or (dropped and p in parked and s.level[p] == GPU_LEVEL) for p in pages)


def _queue_follows_at(lay: Layout, s: State, pages: Iterable[int]) -> bool:
    pin = lay.cfg.pocket.policy == PocketPolicy.PIN
    parked = {x for _, x in used_items(s.pocket, NONE)} if pin else set()
    for p in pages:
        if not s.alive[p]:
            continue
        should = _evictable(lay, s, p) and s.slot[p] != NO_SLOT and not (pin and p in parked)
        if s.queued[p] != should:
            return False
    return True


def _migrations_local(lay: Layout, s: State, d: Delta) -> bool | None:
    pages, slots = d.at(*PAGE_FIELDS), d.at("slot_owner")
    if pages is None or slots is None:
        return None
    # a page whose reserved slot changed hands owned it before (the invariant held)
    pages |= {d.old.slot_owner[ix] for ix in slots} - {NONE}
    return _migrations_at(lay, s, (p for p in pages if _page_ok(lay, p)))


def _migrations_at(lay: Layout, s: State, pages: Iterable[int]) -> bool:
    for p in pages:
        dst = s.dst_level[p]
        if dst == NONE:
            continue
        lvl = s.level[p]
        if not (s.alive[p] and s.slot[p] != NO_SLOT):
            return False
        if not (dst == lvl + 1 or (dst == GPU_LEVEL and lvl > GPU_LEVEL)):
            return False
        pg = CONCRETE.lookup(lay.pool_group_of_lc, s.lc[p], 0)
        dst_ix = lay.slot_ix(CONCRETE, dst, pg, s.dst_slot[p])
        if dst_ix == -1 or CONCRETE.lookup(s.slot_owner, dst_ix, NONE) != p:
            return False
    return True


def _pg_of(lay: Layout, s: State, p: int) -> int:
    lc = s.lc[p]
    return lay.pool_group_of_lc[lc] if 0 <= lc < lay.lcs else 0


def _claims(lay: Layout, s: State, p: int) -> tuple[int, int]:
    """The flat slots page p sits in and reserves (-1: none)."""
    pg = _pg_of(lay, s, p)
    return _flat(lay, s.level[p], pg, s.slot[p]), _flat(lay, s.dst_level[p], pg, s.dst_slot[p])


def _slot_owned_once_local(lay: Layout, s: State, d: Delta) -> bool | None:
    pages = d.at("alive", "lc", "level", "slot", "dst_level", "dst_slot")
    slots = d.at("slot_owner")
    if pages is None or slots is None:
        return None
    old = d.old
    pages = {p for p in pages if _page_ok(lay, p)}
    for p in pages:  # the slots changed pages sat in or reserved, before and now
        for st in (old, s):
            if st.alive[p]:
                slots.update(ix for ix in _claims(lay, st, p) if ix != -1)
    pages |= {old.slot_owner[ix] for ix in slots if _page_ok(lay, old.slot_owner[ix])}
    for p in pages:
        if s.alive[p] and s.slot[p] != NO_SLOT:
            ix = _flat(lay, s.level[p], _pg_of(lay, s, p), s.slot[p])
            if ix == -1 or s.slot_owner[ix] != p:
                return False
    for ix in slots:
        owner = s.slot_owner[ix]
        if owner == NONE:
            continue
        if not (_page_ok(lay, owner) and s.alive[owner] and ix in _claims(lay, s, owner)):
            return False
    return True


def _entries_of_pages(s: State, pages: set[int]) -> set[int]:
    """The block entries (in use) that reference one of `pages`."""
    if not pages:
        return set()
    return {e for e, page in used_items(s.entry, NONE) if page in pages}


def _entries_live_local(lay: Layout, s: State, d: Delta) -> bool | None:
    entries = d.at("entry", "entry_locked")
    pages = d.at("alive", "lc", "ordinal", "committed", "owner")
    if entries is None or pages is None:
        return None
    entries |= d.entries_of(pages)
    return _entries_live_at(lay, s, entries)


def _entries_live_at(lay: Layout, s: State, entries: Iterable[int]) -> bool:
    for e in entries:
        seq, lc, o = _entry_coords(lay, e)
        page = s.entry[e]
        if s.entry_locked[e] and page == NONE:
            return False
        if page == NONE:
            continue
        if not (_page_ok(lay, page) and s.alive[page] and s.lc[page] == lc
                and s.ordinal[page] == o and (s.committed[page] or s.owner[page] == seq)):
            return False
    return True


def _index_local(lay: Layout, s: State, d: Delta) -> bool | None:
    entries, pages = d.at(*ENTRY_FIELDS), d.at("slot")
    if entries is None or pages is None:
        return None
    entries |= d.entries_of(pages)
    slot, n = s.slot, len(s.slot)
    for e in entries:
        page = s.entry[e]
        locked_slot = slot[page] if 0 <= page < n else NO_SLOT
        if s.index[e] != (locked_slot if s.entry_locked[e] else BAD_PAGE_INDEX):
            return False
    return True


def _window_local(lay: Layout, s: State, d: Delta) -> bool | None:
    entries = d.at(*ENTRY_FIELDS)
    seqs = d.at("seq_status", "commit_state", "capacity", "history")
    pages = d.at("committed")
    if entries is None or seqs is None or pages is None:
        return None
    entries |= d.entries_of(pages)
    if seqs:
        if not all(0 <= seq < lay.seqs for seq in seqs):
            return None
        per_seq = lay.lcs * lay.blocks
        whole: set[int] = set()
        for seq in seqs:
            moved = _window_moved(lay, d.old, s, seq)
            if moved is None:
                whole.add(seq)
            else:
                entries |= moved
        for seq in whole:  # every block of a sequence whose status changed
            if not _window_seq_ok(lay, s, seq):
                return False
        entries = {e for e in entries if e // per_seq not in whole}
    return all(_window_ok(lay, s, e) for e in entries)


def _window_moved(lay: Layout, old: State, new: State, seq: int) -> set[int] | None:
    """When only the lengths of `seq` changed (its status and commit state did not): the
    entry positions whose block changed sides of the capacity or of the stale range, the
    only blocks `_window_ok` judges by other rules now (speed: a resize per decoded token
    moves a block or two, not the whole sequence). None when more changed."""
    if old.seq_status[seq] != new.seq_status[seq] \
            or old.commit_state[seq] != new.commit_state[seq]:
        return None
    t, blocks = lay.cfg.tokens_per_block, lay.blocks

    def clipped(lo: int, hi: int) -> set[int]:
        return set(range(max(0, lo), min(blocks, hi)))

    w_old, w_new = -(-old.capacity[seq] // t), -(-new.capacity[seq] // t)
    cap_moved = clipped(min(w_old, w_new), max(w_old, w_new))
    out: set[int] = set()
    for lc_i, lc in enumerate(lay.cfg.life_cycles):
        moved = cap_moved
        if lc.window is not None:
            moved = moved | (clipped(*stale_range(lc, old.history[seq], t))
                             ^ clipped(*stale_range(lc, new.history[seq], t)))
        base = (seq * lay.lcs + lc_i) * blocks
        out.update(base + o for o in moved)
    return out


def _window_seq_ok(lay: Layout, s: State, seq: int) -> bool:
    """`_window_ok` for every block of `seq` within its capacity (the stale range and the
    sequence's fields read once per life cycle)."""
    cfg, t = lay.cfg, lay.cfg.tokens_per_block
    active = s.seq_status[seq] == SeqStatus.ACTIVE
    kept = s.commit_state[seq] == CommitState.ALLOWED
    cap, hist = s.capacity[seq], s.history[seq]
    within = min(lay.blocks, -(-cap // t))
    entry, locked, index, committed = s.entry, s.entry_locked, s.index, s.committed
    for lc_i, lc in enumerate(cfg.life_cycles):
        start, end = stale_range(lc, hist, t) if lc.window is not None else (0, 0)
        base = (seq * lay.lcs + lc_i) * lay.blocks
        for o in range(within):
            e = base + o
            if start <= o < end:  # stale
                if index[e] != BAD_PAGE_INDEX:
                    return False
                page = entry[e]
                if page != NONE and not (
                        kept and not (committed[page] if _page_ok(lay, page) else True)):
                    return False
            elif active and not (locked[e] and index[e] != BAD_PAGE_INDEX):
                return False
    # past the capacity only the entries in use can break it
    return all(_window_ok(lay, s, e) for e in _used_entries_of(lay, s, seq)
               if e % lay.blocks >= within)


def _used_entries_of(lay: Layout, s: State, seq: int) -> set[int]:
    """The entry positions of `seq` that are not at their initial values."""
    positions = lay.entry_range(seq)  # a few positions: read them, not every stored one
    out: set[int] = set()
    for arr, default in ((s.entry, NONE), (s.entry_locked, False), (s.index, BAD_PAGE_INDEX)):
        out.update(used_in(arr, default, positions))
    return out


def _refcounts_local(lay: Layout, s: State, d: Delta) -> bool | None:
    entries, pocket = d.at("entry", "entry_locked"), d.at("pocket")
    pages = d.at("locks", "holds")
    if entries is None or pocket is None or pages is None:
        return None
    old = d.old
    pages |= {st.entry[e] for e in entries for st in (old, s)}
    pages |= {st.pocket[k] for k in pocket for st in (old, s)}
    pages = {p for p in pages if _page_ok(lay, p)}
    if not pages:
        return True
    locks: Counter[int] = Counter()
    holds: Counter[int] = Counter()
    for e in d.entries_of(pages):
        (locks if s.entry_locked[e] else holds)[s.entry[e]] += 1
    for _, page in used_items(s.pocket, NONE):
        if page in pages:
            holds[page] += 1
    return all(s.locks[p] == locks[p] and s.holds[p] == holds[p] for p in pages)


def _values_local(lay: Layout, s: State, d: Delta) -> bool | None:
    if s.clock < 0:
        return False
    if "clock" in d.changed and s.clock < d.old.clock:
        return None  # a stamp that preceded the old clock may not precede this one
    pages = d.at(*PAGE_FIELDS)
    if pages is None:
        return None
    levels = lay.cfg.num_levels

    def slot_fits(level: int, slot: int) -> bool:
        return 0 <= level < levels and 0 <= slot < lay.slots_at(level)

    if not _pages_in_bounds(lay, s, pages, slot_fits):
        return False
    bounds = (("slot_owner", NONE, lay.pages), ("slot_busy", -1, lay.seqs + 1),
              ("seq_status", 0, len(SeqStatus)), ("commit_state", 0, len(CommitState)),
              ("entry", NONE, lay.pages), ("pocket", NONE, lay.pages))
    for name, lo, hi in bounds:
        positions = d.at(name)
        if positions is None:
            return None
        arr = getattr(s, name)
        if not all(lo <= arr[i] < hi for i in positions):
            return False
    return True


def _inactive_unlocked_local(lay: Layout, s: State, d: Delta) -> bool | None:
    entries, seqs = d.at("entry_locked"), d.at("seq_status")
    if entries is None or seqs is None or not all(0 <= q < lay.seqs for q in seqs):
        return None
    for seq in seqs:  # a sequence that changed status: its locks
        entries.update(used_in(s.entry_locked, False, lay.entry_range(seq)))
    per_seq = lay.lcs * lay.blocks
    return all(s.seq_status[e // per_seq] == SeqStatus.ACTIVE
               for e in entries if s.entry_locked[e])


def _gone_hold_nothing_local(lay: Layout, s: State, d: Delta) -> bool | None:
    entries, seqs = d.at("entry"), d.at("seq_status")
    if entries is None or seqs is None or not all(0 <= q < lay.seqs for q in seqs):
        return None
    for seq in seqs:  # a sequence that changed status: its blocks
        entries.update(used_in(s.entry, NONE, lay.entry_range(seq)))
    gone = (SeqStatus.FREE, SeqStatus.CLOSED)
    per_seq = lay.lcs * lay.blocks
    return all(s.seq_status[e // per_seq] not in gone for e in entries if s.entry[e] != NONE)


def _pocket_orphaned_local(lay: Layout, s: State, d: Delta) -> bool | None:
    positions = d.at("pocket")
    pages = d.at("alive", "committed", "locks", "holds", "owner", "lc")
    entries = d.at("entry")
    if positions is None or pages is None or entries is None:
        return None
    pages = pages | {s.entry[e] for e in entries}  # pages an entry references now
    if pages:  # the pocket positions holding a changed page
        positions.update(k for k, page in used_items(s.pocket, NONE) if page in pages)
    cap = lay.pocket_cap
    for k in positions:
        page = s.pocket[k]
        if page == NONE:
            continue
        seq, lc = divmod(k // cap, lay.lcs)
        if not _page_ok(lay, page):
            return False
        held = s.locks[page] <= 0 and s.holds[page] > 0
        if not (s.alive[page] and not s.committed[page] and held and s.owner[page] == seq
                and s.lc[page] == lc and not d.entries_of({page})):
            return False
    return True


LOCAL: dict[str, Local] = {
    "inactive_sequences_unlocked": _inactive_unlocked_local,
    "gone_sequences_hold_nothing": _gone_hold_nothing_local,
    "pocket_entries_orphaned": _pocket_orphaned_local,
    "dead_pages_are_blank": _per_page(_dead_blank_at),
    "locked_at_gpu": _per_page(_locked_at_gpu_at),
    "queued_are_evictable": _per_page(_queued_evictable_at),
    "no_orphan_pages": _per_page(_no_orphan_at),
    "no_migration_in_flight": _per_page(_not_moving_at),
    "live_pages_have_slots": _per_page(_live_slots_at, ("pocket",)),
    "queue_follows_evictability": _per_page(_queue_follows_at, ("pocket",)),
    "migrations_reserved": _migrations_local,
    "slot_owned_once": _slot_owned_once_local,
    "entries_are_live": _entries_live_local,
    "index_matches_locks": _index_local,
    "window_is_mapped": _window_local,
    "refcounts_match": _refcounts_local,
    "values_in_range": _values_local,
}


def _pages_in_bounds(lay: Layout, s: State, pages: Iterable[int],
                     slot_fits: Callable[[int, int], bool]) -> bool:
    """Every field of these pages within its domain (shared by the full and local checks)."""
    levels = lay.cfg.num_levels
    for p in pages:
        if not (0 <= s.lc[p] < lay.lcs and 0 <= s.level[p] < levels
                and (s.slot[p] == NO_SLOT or slot_fits(s.level[p], s.slot[p]))
                and s.locks[p] >= 0 and s.holds[p] >= 0 and NONE <= s.owner[p] < lay.seqs
                and 0 <= s.ordinal[p] < lay.blocks and s.key[p] >= NONE
                and 0 <= s.stamp[p] < s.clock + 1):
            return False
        if s.dst_level[p] == NONE:
            if s.dst_slot[p] != NO_SLOT:
                return False
        elif not slot_fits(s.dst_level[p], s.dst_slot[p]):
            return False
    return True
