"""Fast concrete checks of the invariants: derived from the one-page or one-entry form, or
by hand.

The invariants in `invariants.py` are written once, in the vocabulary Z3 reads;
evaluated on plain values some are quadratic (every page against every block
entry). The executable model checks them after every lockstep step, so these
checks compute the same truth values looking only at the records in use. Those
of the invariants written for one page record (`invariants.ForEachPage`) or one
block entry (`invariants.ForEachEntry`) are derived from that statement (the end
of this file); the others are companions
written by hand, each for the reason in `HAND_WRITTEN`. They are not a second
definition: `tests/model/test_fastcheck.py` checks, on reachable states and on
states with fields perturbed at random, that each agrees exactly with its
definition, so a companion that drifted would fail there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from .config import (
    BAD_PAGE_INDEX,
    NO_SLOT,
    NONE,
    CommitState,
    KVConfig,
    PageStatus,
    SeqStatus,
    stale_range,
)
from .invariants import (
    INVARIANTS,
    EntryAt,
    ForEachEntry,
    ForEachPage,
    ForEachSeq,
    Invariant,
    Scope,
    in_scope,
)
from .logic import CONCRETE, Array, Ops
from .sparse import PositionsByValue, SparseArray, used_in, used_items
from .state import ENTRY_FIELDS, IDLE, PAGE_FIELDS, SEQ_FIELDS, Layout, State

Check = Callable[[Layout, State], bool]
_S = TypeVar("_S")


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


FAST: dict[str, Check] = {
    "slot_owned_once": slot_owned_once,
    "refcounts_match": refcounts_match,
    "pocket_entries_orphaned": pocket_entries_orphaned,
    "window_is_mapped": window_is_mapped,
    "values_in_range": values_in_range,
    "no_page_in_two_pockets": no_page_in_two_pockets,
}


# Why each companion above is written by hand rather than derived from its definition
# (`derived_full` and `derived_entry_full` cover the one-page and one-entry forms only).
# Each is checked against its definition by `tests/model/test_fastcheck.py` (and its local
# check by `test_incremental.py`).
HAND_WRITTEN: dict[str, str] = {
    "slot_owned_once": "every slot against every page record (quadratic as defined): one "
                       "pass collects the slots each page sits in or reserves",
    "refcounts_match": "every page against every block entry and pocket position (quadratic "
                       "as defined): one pass counts the references",
    "pocket_entries_orphaned": "every pocket position against every block entry (quadratic "
                               "as defined): one pass with the referenced pages as a set",
    "no_page_in_two_pockets": "every pair of pocket positions (quadratic as defined): one "
                              "pass with a set",
    "window_is_mapped": "a statement per block entry that a sequence alone can break (an "
                        "ACTIVE one's blocks within its capacity must be mapped): derived "
                        "from the one-entry form it would visit every entry; by hand it "
                        "visits the blocks within each capacity, and the local check the "
                        "blocks that changed sides of a window",
    "values_in_range": "every array of every domain within its type: only the records and "
                       "positions in use are looked at",
}

# ---- checks of what changed ----------------------------------------------------------------
# The incremental checker (`incremental.py`) re-checks an invariant that held in the last
# state it checked. On sparse states it knows which positions of each array may have
# changed since then (`Delta`), and the checks below look at those positions and what
# depends on them only. Each returns None when it cannot tell (positions unknown, or a
# global input changed in a way it does not follow): the full check then runs.
# `tests/model/test_incremental.py` checks that runs with them agree with the full check.


class EntryRefs(PositionsByValue):
    """Which block entries reference each page (`by_page`), for one `entry` array: kept by
    the incremental checker from state to state and brought up to date from the positions
    that changed, so a check asking which entries reference a changed page costs what
    changed, not the entries in use (three local checks ask after most events)."""

    def __init__(self) -> None:
        super().__init__(NONE)

    @property
    def by_page(self) -> dict[int, set[int]]:
        return self.positions


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
        changed, known = self.changed, self._at
        for name in names:
            if name not in changed:  # the common case first, without a call
                continue
            pos = known[name] if name in known else self._field(name)
            if pos is None:
                return None
            out |= pos
        return out


_COMPARED = 1024  # tuples up to this length are compared position by position
Local = Callable[[Layout, State, Delta], "bool | None"]


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

    def clipped(lo: int, hi: int) -> range:
        return range(max(0, lo), min(blocks, hi))

    w_old, w_new = -(-old.capacity[seq] // t), -(-new.capacity[seq] // t)
    cap_moved = clipped(min(w_old, w_new), max(w_old, w_new))
    out: set[int] = set()
    for lc_i, lc in enumerate(lay.cfg.life_cycles):
        moved = [cap_moved]
        if lc.window is not None:  # the blocks in one stale range and not the other
            moved += _ranges_xor(clipped(*stale_range(lc, old.history[seq], t)),
                                 clipped(*stale_range(lc, new.history[seq], t)))
        base = (seq * lay.lcs + lc_i) * blocks
        for r in moved:
            out.update(range(base + r.start, base + r.stop))
    return out


def _ranges_xor(a: range, b: range) -> list[range]:
    """The positions in exactly one of two step-1 ranges, as ranges (what changed between
    two stale ranges costs the blocks that moved, not the blocks in them)."""
    if not a:
        return [b]
    if not b:
        return [a]
    lo, hi = max(a.start, b.start), min(a.stop, b.stop)
    if lo >= hi:  # disjoint
        return [a, b]
    return [range(min(a.start, b.start), lo), range(hi, max(a.stop, b.stop))]


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
    "pocket_entries_orphaned": _pocket_orphaned_local,
    "slot_owned_once": _slot_owned_once_local,
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


# ---- checks derived from the one-page form -------------------------------------------------
# An invariant written "for every page p: when(p) implies then(p)" (`invariants.ForEachPage`)
# gets its fast full check and its local check from that one statement, evaluated on plain
# values one record at a time (`when` first: the conclusion only where it applies). Which
# records can break it is read off the statement once per configuration, by evaluating it
# on a record of Init and noting the fields it reads:
# * `when` false at Init: only a record where a field `when` reads is in use;
# * else (no `when`, or true at Init): a record where a field the statement reads is in
#   use (a record at Init values satisfies it: Init does);
# * every record, when the fields that decide it are not all per-page fields.
# The local check looks at the records whose fields it reads changed (and, when the pocket
# changed, the pages that entered or left it), and defers to the full check when another
# field of another domain it reads changed.


class ReadRecorder:
    """Stands in for a `State` and notes which fields are read."""

    def __init__(self, s: State) -> None:
        self._s = s
        self.read: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        self.read.add(name)
        return getattr(self._s, name)


@dataclass(frozen=True)
class _PageScope:
    where: tuple[str, ...] | None  # the fields whose records in use can break it; None: all
    page_reads: tuple[str, ...]  # the per-page fields it reads
    other_reads: frozenset[str]  # the fields of other domains it reads


_SCOPES: dict[tuple[KVConfig, str], _PageScope] = {}


def _page_scope(lay: Layout, name: str, form: ForEachPage) -> _PageScope:
    known = _SCOPES.get((lay.cfg, name))
    if known is not None:
        return known
    init = lay.initial_state(sparse_above=0)  # one record read: any geometry is cheap
    guard, body = ReadRecorder(init), ReadRecorder(init)
    guard_at_init = True if form.when is None or lay.pages == 0 else bool(
        form.when(CONCRETE, lay, guard, 0))  # type: ignore[arg-type]
    if lay.pages:
        form.at(CONCRETE, lay, body, 0)  # type: ignore[arg-type]
    page = set(PAGE_FIELDS)
    deciding = body.read if guard_at_init else guard.read
    scope = _PageScope(
        where=tuple(sorted(deciding)) if deciding <= page else None,
        page_reads=tuple(sorted(body.read & page)),
        other_reads=frozenset(body.read - page))
    _SCOPES[(lay.cfg, name)] = scope
    return scope


def _holds_at(form: ForEachPage, lay: Layout, s: State, pages: Iterable[int]) -> bool:
    when, then = form.when, form.then
    if when is None:
        return all(then(CONCRETE, lay, s, p) for p in pages)
    return all(not when(CONCRETE, lay, s, p) or then(CONCRETE, lay, s, p) for p in pages)


def _per_layout(compute: Callable[[Layout], _S]) -> Callable[[Layout], _S]:
    """`compute`, remembering the last layout asked about (a check runs thousands of times
    on one layout; hashing its configuration each time would cost more than the check)."""
    last: list[tuple[Layout, _S]] = []

    def cached(lay: Layout) -> _S:
        if last and last[0][0] is lay:
            return last[0][1]
        got = compute(lay)
        last[:] = [(lay, got)]
        return got
    return cached


def _scope_of(name: str, form: ForEachPage) -> Callable[[Layout], _PageScope]:
    """`_page_scope` for one invariant, per layout."""
    return _per_layout(lambda lay: _page_scope(lay, name, form))


def derived_full(name: str, form: ForEachPage) -> Check:
    """The full check of a one-page invariant: its statement on the records that can break it."""
    scope_of = _scope_of(name, form)

    def check(lay: Layout, s: State) -> bool:
        where = scope_of(lay).where
        pages = range(lay.pages) if where is None else \
            _used(lay.pages, *(getattr(s, f) for f in where))
        return _holds_at(form, lay, s, pages)
    return check


def derived_local(name: str, form: ForEachPage) -> Local:
    """The local check of a one-page invariant: its statement on the records that changed."""
    scope_of = _scope_of(name, form)

    def local(lay: Layout, s: State, d: Delta) -> bool | None:
        scope = scope_of(lay)
        pages = d.at(*scope.page_reads)
        if pages is None:
            return None
        other = d.changed & scope.other_reads
        if other:
            # The pocket is the one field of another domain followed here: a statement reads
            # it for whether a page is parked, so the pages that entered or left a changed
            # position are the ones it can change. Any other: the full check.
            moved = d.at("pocket") if other == {"pocket"} else None
            if moved is None:
                return None
            pages = {p for p in pages | {st.pocket[k] for k in moved for st in (d.old, s)}
                     if _page_ok(lay, p)}
        return _holds_at(form, lay, s, pages)
    return local



# ---- checks derived from the one-entry form ------------------------------------------------
# An invariant written "for every block entry e: when(e) implies then(e)"
# (`invariants.ForEachEntry`) reads the fields of its entry, of its sequence, and of the
# page its entry references. Which entries can break it is read off the statement as for
# pages, on the entry of Init:
# * `then` true at Init and reading no sequence field: only an entry where an entry field
#   it reads is in use (an entry at Init values references no page, so its page lookups
#   read the defaults whatever the pages hold);
# * else `when` false at Init and reading no sequence field: likewise for its fields;
# * else every entry.
# The local check looks at the entries whose fields it reads changed, those of sequences
# whose fields it reads changed (the ones in use as above), and those that reference a page
# whose fields it reads changed (`Delta.entries_of`); another domain: the full check.


@dataclass(frozen=True)
class _EntryScope:
    where: tuple[tuple[str, Any], ...] | None  # (entry field, Init value) deciding; None: all
    entry_reads: tuple[str, ...]
    seq_reads: tuple[str, ...]
    page_reads: tuple[str, ...]
    other_reads: frozenset[str]


_ENTRY_SCOPES: dict[tuple[KVConfig, str], _EntryScope] = {}


def _entry_scope(lay: Layout, name: str, form: ForEachEntry) -> _EntryScope:
    known = _ENTRY_SCOPES.get((lay.cfg, name))
    if known is not None:
        return known
    init = lay.initial_state(sparse_above=0)
    first = EntryAt(0, 0, 0, 0)
    body, then, guard = ReadRecorder(init), ReadRecorder(init), ReadRecorder(init)
    entry, page = set(ENTRY_FIELDS), set(PAGE_FIELDS)
    deciding: set[str] | None = None
    if len(init.entry):
        form.at(CONCRETE, lay, body, first)  # type: ignore[arg-type]
        if bool(form.then(CONCRETE, lay, then, first)):  # type: ignore[arg-type]
            deciding = then.read
        elif form.when is not None and not form.when(CONCRETE, lay, guard, first):  # type: ignore[arg-type]
            deciding = guard.read
    where = None
    if deciding is not None and deciding & entry and deciding <= entry | page:
        where = tuple((f, getattr(init, f)[0]) for f in sorted(deciding & entry))
    scope = _EntryScope(
        where=where,
        entry_reads=tuple(sorted(body.read & entry)),
        seq_reads=tuple(sorted(body.read & set(SEQ_FIELDS))),
        page_reads=tuple(sorted(body.read & page)),
        other_reads=frozenset(body.read - entry - page - set(SEQ_FIELDS)))
    _ENTRY_SCOPES[(lay.cfg, name)] = scope
    return scope


def _entry_scope_of(name: str, form: ForEachEntry) -> Callable[[Layout], _EntryScope]:
    """`_entry_scope` for one invariant, per layout."""
    return _per_layout(lambda lay: _entry_scope(lay, name, form))


def _entries_hold(form: ForEachEntry, lay: Layout, s: State, entries: Iterable[int]) -> bool:
    when, then = form.when, form.then
    per_seq, blocks = lay.lcs * lay.blocks, lay.blocks
    for e in entries:
        seq, rest = divmod(e, per_seq)
        lc, o = divmod(rest, blocks)
        at = EntryAt(seq, lc, o, e)
        if (when is None or when(CONCRETE, lay, s, at)) and not then(CONCRETE, lay, s, at):
            return False
    return True


def derived_entry_full(name: str, form: ForEachEntry) -> Check:
    """The full check of a one-entry invariant: its statement on the entries that can break it."""
    scope_of = _entry_scope_of(name, form)

    def check(lay: Layout, s: State) -> bool:
        where = scope_of(lay).where
        entries = range(len(s.entry)) if where is None else \
            _used(len(s.entry), *(getattr(s, f) for f, _ in where))
        return _entries_hold(form, lay, s, entries)
    return check


def derived_entry_local(name: str, form: ForEachEntry) -> Local:
    """The local check of a one-entry invariant: its statement on the entries that changed,
    those of the sequences that changed and those referencing the pages that changed."""
    scope_of = _entry_scope_of(name, form)

    def local(lay: Layout, s: State, d: Delta) -> bool | None:
        scope = scope_of(lay)
        entries, seqs = d.at(*scope.entry_reads), d.at(*scope.seq_reads)
        pages = d.at(*scope.page_reads)
        if entries is None or seqs is None or pages is None or d.changed & scope.other_reads:
            return None
        if seqs:
            if not all(0 <= q < lay.seqs for q in seqs):
                return None
            where = scope.where
            for seq in seqs:
                positions = lay.entry_range(seq)
                if where is None:
                    entries.update(positions)
                else:
                    for f, default in where:
                        entries.update(used_in(getattr(s, f), default, positions))
        if pages:
            entries |= d.entries_of(pages)
        return _entries_hold(form, lay, s, entries)
    return local


# ---- checks derived from the one-sequence form ---------------------------------------------
# An invariant written "for every sequence q: then(q)" (`invariants.ForEachSeq`) reads the
# fields of its sequence, its pocket positions and the fields of the pages they name. A
# sequence whose fields it reads and whose pocket are at their Init values satisfies it (as
# Init does: its pocket names no page, so its page lookups read the defaults), so the full
# check looks at the sequences in use only. The local check looks at the sequences whose
# fields it reads or whose pocket positions changed, and those whose pocket names a page
# whose fields it reads changed; another domain: the full check.


@dataclass(frozen=True)
class _SeqScope:
    seq_reads: tuple[str, ...]
    pocket: bool  # it reads the sequence's pocket positions
    page_reads: tuple[str, ...]
    other_reads: frozenset[str]


_SEQ_SCOPES: dict[tuple[KVConfig, str], _SeqScope] = {}


def _seq_scope(lay: Layout, name: str, form: ForEachSeq) -> _SeqScope:
    known = _SEQ_SCOPES.get((lay.cfg, name))
    if known is not None:
        return known
    body = ReadRecorder(lay.initial_state(sparse_above=0))
    if lay.seqs:
        form.at(CONCRETE, lay, body, 0)  # type: ignore[arg-type]
    seq, page = set(SEQ_FIELDS), set(PAGE_FIELDS)
    scope = _SeqScope(seq_reads=tuple(sorted(body.read & seq)), pocket="pocket" in body.read,
                      page_reads=tuple(sorted(body.read & page)),
                      other_reads=frozenset(body.read - seq - page - {"pocket"}))
    _SEQ_SCOPES[(lay.cfg, name)] = scope
    return scope


def _seq_scope_of(name: str, form: ForEachSeq) -> Callable[[Layout], _SeqScope]:
    """`_seq_scope` for one invariant, per layout."""
    return _per_layout(lambda lay: _seq_scope(lay, name, form))


def _pocket_seq(lay: Layout, k: int) -> int:
    """The sequence of a flat pocket position."""
    return k // (lay.lcs * lay.pocket_cap)


def _seqs_hold(form: ForEachSeq, lay: Layout, s: State, seqs: Iterable[int]) -> bool:
    then = form.then
    return all(then(CONCRETE, lay, s, q) for q in seqs)


def derived_seq_full(name: str, form: ForEachSeq) -> Check:
    """The full check of a one-sequence invariant: its statement on the sequences in use."""
    scope_of = _seq_scope_of(name, form)

    def check(lay: Layout, s: State) -> bool:
        scope = scope_of(lay)
        seqs = set(_used(lay.seqs, *(getattr(s, f) for f in scope.seq_reads)))
        if scope.pocket:
            seqs.update(_pocket_seq(lay, k) for k, _ in used_items(s.pocket, NONE))
        return _seqs_hold(form, lay, s, sorted(q for q in seqs if 0 <= q < lay.seqs))
    return check


def derived_seq_local(name: str, form: ForEachSeq) -> Local:
    """The local check of a one-sequence invariant: its statement on the sequences that
    changed, those whose pocket changed and those whose pocket names a page that changed."""
    scope_of = _seq_scope_of(name, form)

    def local(lay: Layout, s: State, d: Delta) -> bool | None:
        scope = scope_of(lay)
        seqs, pages = d.at(*scope.seq_reads), d.at(*scope.page_reads)
        moved = d.at("pocket") if scope.pocket else set()
        if seqs is None or pages is None or moved is None or d.changed & scope.other_reads:
            return None
        seqs = set(seqs)
        seqs.update(_pocket_seq(lay, k) for k in moved)
        if pages and scope.pocket:
            seqs.update(_pocket_seq(lay, k) for k, p in used_items(s.pocket, NONE) if p in pages)
        return _seqs_hold(form, lay, s, sorted(q for q in seqs if 0 <= q < lay.seqs))
    return local


for _inv in INVARIANTS:
    if _inv.per_seq is not None:
        FAST[_inv.name] = derived_seq_full(_inv.name, _inv.per_seq)
        LOCAL[_inv.name] = derived_seq_local(_inv.name, _inv.per_seq)
    elif _inv.per_page is not None:
        FAST[_inv.name] = derived_full(_inv.name, _inv.per_page)
        LOCAL[_inv.name] = derived_local(_inv.name, _inv.per_page)
    elif _inv.per_entry is not None:
        FAST[_inv.name] = derived_entry_full(_inv.name, _inv.per_entry)
        LOCAL[_inv.name] = derived_entry_local(_inv.name, _inv.per_entry)


def violated(ops: Ops, lay: Layout, s: State, scope: Scope | None = None,
             only: tuple[Invariant, ...] = INVARIANTS) -> list[Invariant]:
    """Invariants (of a scope, or all; among `only`) that do not hold in concrete state s.

    On concrete values the quadratic ones use their one-pass companions here (tested to
    agree exactly with the definitions in `invariants.py`): the full check the incremental
    checker is tested against.
    """
    def holds(inv: Invariant) -> bool:
        fast = FAST.get(inv.name) if not ops.symbolic else None
        return bool(fast(lay, s)) if fast is not None else bool(inv.predicate(ops, lay, s))

    return [inv for inv in only if in_scope(inv, scope) and not holds(inv)]
