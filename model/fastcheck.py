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
from collections.abc import Callable

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
from .logic import CONCRETE
from .state import Layout, State

Check = Callable[[Layout, State], bool]


def _page_ok(lay: Layout, page: int) -> bool:
    return 0 <= page < lay.pages


def slot_owned_once(lay: Layout, s: State) -> bool:
    cfg = lay.cfg
    claims: dict[int, set[int]] = {}  # flat slot -> pages sitting in or reserving it
    for p in range(lay.pages):
        lc = s.lc[p]
        pg = lay.pool_group_of_lc[lc] if 0 <= lc < lay.lcs else 0
        if s.alive[p] and s.slot[p] != NO_SLOT:
            ix = _flat(lay, s.level[p], pg, s.slot[p])
            if ix == -1 or s.slot_owner[ix] != p:
                return False
        if s.alive[p]:
            for level, slot in ((s.level[p], s.slot[p]), (s.dst_level[p], s.dst_slot[p])):
                if 0 <= level < cfg.num_levels and 0 <= slot < lay.slots_at(level) and \
                        0 <= pg < cfg.num_pool_groups:
                    claims.setdefault(_flat(lay, level, pg, slot), set()).add(p)
    return all(owner == NONE or owner in claims.get(flat, ())
               for flat, owner in enumerate(s.slot_owner))


def _flat(lay: Layout, level: int, pg: int, slot: int) -> int:
    cfg = lay.cfg
    if not (0 <= level < cfg.num_levels and 0 <= pg < cfg.num_pool_groups):
        return -1
    n = lay.slots_at(level)
    return lay.level_offset(level) + pg * n + slot if 0 <= slot < n else -1


def refcounts_match(lay: Layout, s: State) -> bool:
    locks: Counter[int] = Counter()
    holds: Counter[int] = Counter()
    for page, locked in zip(s.entry, s.entry_locked, strict=True):
        (locks if locked else holds)[page] += 1
    for page in s.pocket:
        holds[page] += 1
    return all(s.locks[p] == locks[p] and s.holds[p] == holds[p] for p in range(lay.pages))


def entries_are_live(lay: Layout, s: State) -> bool:
    for seq in range(lay.seqs):
        for lc in range(lay.lcs):
            for o in range(lay.blocks):
                e = (seq * lay.lcs + lc) * lay.blocks + o
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
    referenced = set(s.entry)
    for seq in range(lay.seqs):
        for lc in range(lay.lcs):
            for k in lay.pocket_range(seq, lc):
                page = s.pocket[k]
                if page == NONE:
                    continue
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
    cfg = lay.cfg
    t = cfg.tokens_per_block
    for seq in range(lay.seqs):
        active = s.seq_status[seq] == SeqStatus.ACTIVE
        kept = s.commit_state[seq] == CommitState.ALLOWED
        for lc_i, lc in enumerate(cfg.life_cycles):
            start, end = stale_range(lc, s.history[seq], t) if lc.window is not None else (0, 0)
            for o in range(lay.blocks):
                e = (seq * lay.lcs + lc_i) * lay.blocks + o
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
                if stale and page != NONE and not (
                        kept and not (s.committed[page] if _page_ok(lay, page) else True)):
                    return False
    return True


def values_in_range(lay: Layout, s: State) -> bool:
    cfg = lay.cfg
    levels = cfg.num_levels

    def slot_fits(level: int, slot: int) -> bool:
        return 0 <= level < levels and 0 <= slot < lay.slots_at(level)

    if s.clock < 0:
        return False
    for p in range(lay.pages):
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
    return (all(NONE <= x < lay.pages for x in s.slot_owner)
            and all(-1 <= x < lay.seqs + 1 for x in s.slot_busy)
            and all(0 <= x < len(SeqStatus) for x in s.seq_status)
            and all(0 <= x < len(CommitState) for x in s.commit_state)
            and all(NONE <= x < lay.pages for x in s.entry)
            and all(NONE <= x < lay.pages for x in s.pocket))


def no_page_in_two_pockets(lay: Layout, s: State) -> bool:
    parked = [x for x in s.pocket if x != NONE]
    return len(parked) == len(set(parked))


def index_matches_locks(lay: Layout, s: State) -> bool:
    slot, n = s.slot, len(s.slot)
    for e, page in enumerate(s.entry):
        locked_slot = slot[page] if 0 <= page < n else NO_SLOT
        if s.index[e] != (locked_slot if s.entry_locked[e] else BAD_PAGE_INDEX):
            return False
    return True


def inactive_sequences_unlocked(lay: Layout, s: State) -> bool:
    return all(s.seq_status[q] == SeqStatus.ACTIVE
               or not any(s.entry_locked[e] for e in lay.entry_range(q))
               for q in range(lay.seqs))


def gone_sequences_hold_nothing(lay: Layout, s: State) -> bool:
    gone = (SeqStatus.FREE, SeqStatus.CLOSED)
    return all(s.seq_status[q] not in gone or all(s.entry[e] == NONE for e in lay.entry_range(q))
               for q in range(lay.seqs))


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
    parked = set(s.pocket) if pin else set()
    for p in range(lay.pages):
        if not s.alive[p]:
            continue
        should = _evictable(lay, s, p) and s.slot[p] != NO_SLOT and not (pin and p in parked)
        if s.queued[p] != should:
            return False
    return True


# The per-page invariants below are linear already; on plain values a loop with early
# exit is several times faster than building every page's term.
def dead_pages_are_blank(lay: Layout, s: State) -> bool:
    return all(s.alive[p] or (s.slot[p] == NO_SLOT and not s.queued[p] and s.locks[p] == 0
                              and s.holds[p] == 0 and s.dst_level[p] == NONE)
               for p in range(lay.pages))


def locked_at_gpu(lay: Layout, s: State) -> bool:
    return all(not s.locks[p] > 0 or (
        bool(s.alive[p]) and s.level[p] == GPU_LEVEL and s.slot[p] != NO_SLOT
        and not s.queued[p] and s.dst_level[p] == NONE) for p in range(lay.pages))


def queued_are_evictable(lay: Layout, s: State) -> bool:
    return all(not s.queued[p] or (
        bool(s.alive[p]) and s.slot[p] != NO_SLOT and s.dst_level[p] == NONE
        and _evictable(lay, s, p)) for p in range(lay.pages))


def live_pages_have_slots(lay: Layout, s: State) -> bool:
    dropped = lay.cfg.pocket.drops_parked
    parked = set(s.pocket) if dropped else set()
    return all(not s.alive[p] or s.slot[p] != NO_SLOT
               or (dropped and p in parked and s.level[p] == GPU_LEVEL)
               for p in range(lay.pages))


def no_orphan_pages(lay: Layout, s: State) -> bool:
    return all(not (s.alive[p] and s.locks[p] <= 0 and s.holds[p] <= 0)
               or bool(s.committed[p] and s.queued[p]) for p in range(lay.pages))


def migrations_reserved(lay: Layout, s: State) -> bool:
    """Only pages in flight are examined (the definition builds a term for every page)."""
    for p in range(lay.pages):
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


FAST: dict[str, Check] = {
    "queue_follows_evictability": queue_follows_evictability,
    "dead_pages_are_blank": dead_pages_are_blank,
    "locked_at_gpu": locked_at_gpu,
    "queued_are_evictable": queued_are_evictable,
    "live_pages_have_slots": live_pages_have_slots,
    "no_orphan_pages": no_orphan_pages,
    "migrations_reserved": migrations_reserved,
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
