"""The page layer: micro actions on pages, slots, queues and pockets.

Each action is an entry in `PAGE_ACTIONS` with explicit parameters for every
choice, an enabling guard (a list of named conditions) and an effect. Both are
written in the `Ops` vocabulary, so the executable model and the Z3 encoder
read the same definitions. Every choice (which free slot, which victim, which
pocket entry) is a parameter; guards say which choices are legal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .config import (
    BAD_PAGE_INDEX,
    GPU_LEVEL,
    NO_SLOT,
    NONE,
    CommitState,
    KVConfig,
    Order,
    PageStatus,
    PocketPolicy,
    SeqStatus,
)
from .logic import Array, Ops, Term, any_equal, replace_equal
from .overrides import any_override, named
from .sparse import used_in
from .state import IDLE, Layout, State, evictable, evolve, page_ids, status

Params = dict[str, Term]

# Labels the API programs decide on too (so an override reaches guard and program alike).
POCKET_NOT_FULL = "pocket is not full"
STILL_VALID = "parked page is still at GPU with a valid slot and not migrating"
PARKED_DROPPED = "a parked victim is dropped, not migrated (evict_parked=drop)"
# The victim condition: safety (any queued page) or the `lru` policy profile (the head).
VICTIM_QUEUED = "page is queued for eviction (safety: any queued page may be the victim)"
VICTIM_HEAD = "page is the head of its level's eviction queue"
# The `lru` profile's key uniqueness (the safety spec lets a block be cached twice: `clash`).
KEY_UNIQUE = "no committed page of that life cycle has the key"
Cond = tuple[str, Term]  # (English description of the condition, its truth value)


@dataclass(frozen=True)
class Param:
    """A parameter and its finite domain for a configuration (read by Z3 and the spec)."""

    name: str
    domain: Callable[[KVConfig], range]
    doc: str


@dataclass(frozen=True)
class PageAction:
    name: str
    conditions: Callable[[Ops, Layout, State, Params], list[Cond]]  # the guard, `g_<name>`
    effect: Callable[[Ops, Layout, State, Params], State]  # `e_<name>`
    params: tuple[Param, ...]
    doc: str

    def guard(self, ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
        """The enabling conditions, each under its label (which a verifier may override)."""
        conds = self.conditions(ops, lay, s, p)
        return [(label, named(ops, label, ok)) for label, ok in conds] if any_override() else conds


# ---- parameter domains ---------------------------------------------------------------------

def _pages(c: KVConfig) -> range:
    return range(c.max_pages)


def _seqs(c: KVConfig) -> range:
    return range(c.num_sequences)


def _lcs(c: KVConfig) -> range:
    return range(c.num_life_cycles)


def _ords(c: KVConfig) -> range:
    return range(c.max_blocks)


def _gpu_slots(c: KVConfig) -> range:
    return range(c.slots_per_level[GPU_LEVEL])


def _any_slots(c: KVConfig) -> range:
    return range(max(c.slots_per_level))


def _pocket_pos(c: KVConfig) -> range:
    return range(c.pocket.capacity)


def _streams(c: KVConfig) -> range:
    return range(c.num_sequences + 1)


def _keys(c: KVConfig) -> range:
    return range(c.max_pages)


P_PAGE = Param("page", _pages, "page record")
P_SEQ = Param("seq", _seqs, "sequence")
P_LC = Param("lc", _lcs, "life cycle")
P_ORD = Param("ordinal", _ords, "block ordinal")
P_GPU_SLOT = Param("slot", _gpu_slots, "free GPU slot chosen by the allocator")
P_DST_SLOT = Param("dst_slot", _any_slots, "free slot chosen at the destination level")
P_POS = Param("k", _pocket_pos, "position in the pocket (the chooser's pick)")
P_STREAM = Param("stream", _streams, "stream whose work completes (num_sequences = copy stream)")
P_KEY = Param("key", _keys, "block key (interned token prefix)")


# ---- derived terms shared by guards, effects and invariants -----------------------------

def pool_group(ops: Ops, lay: Layout, lc: Term) -> Term:
    return ops.lookup(lay.pool_group_of_lc, lc, 0)


def priority(ops: Ops, lay: Layout, lc: Term) -> Term:
    return ops.lookup(lay.priority_of_lc, lc, 0)


def is_swa(ops: Ops, lay: Layout, lc: Term) -> Term:
    return ops.lookup(lay.swa_of_lc, lc, False)


def page_slot_ix(ops: Ops, lay: Layout, s: State, p: Term) -> Term:
    """Flat index of the slot page p occupies at its current level."""
    return lay.slot_ix(
        ops, ops.lookup(s.level, p, 0), pool_group(ops, lay, ops.lookup(s.lc, p, 0)),
        ops.lookup(s.slot, p, NO_SLOT),
    )


def moving(ops: Ops, s: State, p: Term) -> Term:
    return ops.ne(ops.lookup(s.dst_level, p, NONE), NONE)


def has_slot(ops: Ops, s: State, p: Term) -> Term:
    return ops.ne(ops.lookup(s.slot, p, NO_SLOT), NO_SLOT)


def in_pocket(ops: Ops, s: State, p: Term) -> Term:
    return any_equal(ops, s.pocket, p)


def queue_head(ops: Ops, lay: Layout, s: State, p: Term) -> Term:
    """p is queued and no page of its (level, pool group) queue comes before it."""
    lvl = ops.lookup(s.level, p, 0)
    lc = ops.lookup(s.lc, p, 0)
    pg, prio, stamp = pool_group(ops, lay, lc), priority(ops, lay, lc), ops.lookup(s.stamp, p, 0)
    before = []
    for q in page_ids(ops, lay, s, s.queued):
        q_pg, q_prio = pool_group(ops, lay, s.lc[q]), priority(ops, lay, s.lc[q])
        earlier = ops.or_(
            ops.lt(q_prio, prio), ops.and_(ops.eq(q_prio, prio), ops.lt(s.stamp[q], stamp))
        )
        before.append(ops.and_(
            ops.ne(q, p), s.queued[q], ops.eq(s.level[q], lvl), ops.eq(q_pg, pg), earlier,
        ))
    return ops.and_(ops.lookup(s.queued, p, False), ops.not_(ops.or_(*before)))


def lru(lay: Layout) -> bool:
    """The configuration asks for kvpocket's own policy profile (`Order.LRU`)."""
    return lay.cfg.order == Order.LRU


def victim_cond(ops: Ops, lay: Layout, s: State, p: Term) -> Cond:
    """Which pages eviction may take: any queued page (safety), or under the `lru` profile
    only the head of its queue. The level and pool group are the caller's."""
    if lru(lay):
        return VICTIM_HEAD, queue_head(ops, lay, s, p)
    return VICTIM_QUEUED, ops.lookup(s.queued, p, False)


def pocket_size(ops: Ops, lay: Layout, s: State, seq: Term, lc: Term) -> Term:
    return ops.count([
        ops.ne(ops.lookup(s.pocket, lay.pocket_ix(ops, seq, lc, k), NONE), NONE)
        for k in range(lay.pocket_cap)
    ])


def pocket_remove(ops: Ops, lay: Layout, pocket: Array, seq: Term, lc: Term,
                  k: Term) -> Array:
    """Remove position k of pocket (seq, lc), shifting later entries forward (FIFO order)."""
    cap = lay.pocket_cap
    out = pocket
    for j in range(cap):
        nxt = ops.lookup(pocket, lay.pocket_ix(ops, seq, lc, j + 1), NONE) if j + 1 < cap else NONE
        cur = ops.lookup(pocket, lay.pocket_ix(ops, seq, lc, j), NONE)
        out = ops.store(out, lay.pocket_ix(ops, seq, lc, j), ops.ite(ops.le(k, j), nxt, cur))
    return out


def _set(ops: Ops, arr: Array, idx: Term, value: Term) -> Array:
    return ops.store(arr, idx, value)


def _schedule_if(ops: Ops, lay: Layout, s: State, p: Term, cond: Term) -> State:
    """Push p at the tail of its queue when cond holds and it is not queued yet. Only the
    `lru` profile reads the order, so only it stamps (under the safety spec stamps and
    the clock stay 0, and states that differ only in queue order are one state)."""
    go = ops.and_(cond, ops.not_(ops.lookup(s.queued, p, False)))
    queued = _set(ops, s.queued, p, ops.or_(go, ops.lookup(s.queued, p, False)))
    if not lru(lay):
        return evolve(s, queued=queued)
    return evolve(
        s, queued=queued,
        stamp=_set(ops, s.stamp, p, ops.ite(go, s.clock, ops.lookup(s.stamp, p, 0))),
        clock=ops.ite(go, ops.add(s.clock, 1), s.clock),
    )


def _unqueue_if(ops: Ops, s: State, p: Term, cond: Term) -> State:
    return evolve(
        s, queued=_set(ops, s.queued, p, ops.and_(ops.lookup(s.queued, p, False), ops.not_(cond)))
    )


def _die(ops: Ops, lay: Layout, s: State, p: Term) -> State:
    """Page p dies: its slot returns to the allocator of its level (keeping its busy event)."""
    ix = page_slot_ix(ops, lay, s, p)
    return evolve(
        s,
        slot_owner=_set(ops, s.slot_owner, ix, NONE),
        alive=_set(ops, s.alive, p, False), slot=_set(ops, s.slot, p, NO_SLOT),
        committed=_set(ops, s.committed, p, False), key=_set(ops, s.key, p, NONE),
        owner=_set(ops, s.owner, p, NONE), queued=_set(ops, s.queued, p, False),
        locks=_set(ops, s.locks, p, 0), holds=_set(ops, s.holds, p, 0),
    )


def _entry(ops: Ops, lay: Layout, p: Params) -> Term:
    return lay.entry_ix(ops, p["seq"], p["lc"], p["ordinal"])


def _active(ops: Ops, s: State, seq: Term) -> Term:
    return ops.eq(ops.lookup(s.seq_status, seq, 0), int(SeqStatus.ACTIVE))


def _within_capacity(ops: Ops, lay: Layout, s: State, seq: Term, ordinal: Term) -> Term:
    return ops.lt(ordinal * lay.cfg.tokens_per_block, ops.lookup(s.capacity, seq, 0))


# ---- the actions ---------------------------------------------------------------------------

def g_allocate(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    pg = pool_group(ops, lay, p["lc"])
    ix = lay.slot_ix(ops, GPU_LEVEL, pg, p["slot"])
    e = _entry(ops, lay, p)
    return [
        ("page record is unused", ops.not_(ops.lookup(s.alive, p["page"], True))),
        ("sequence is ACTIVE", _active(ops, s, p["seq"])),
        ("block is within capacity", _within_capacity(ops, lay, s, p["seq"], p["ordinal"])),
        ("block has no page", ops.and_(ops.ne(e, -1), ops.eq(ops.lookup(s.entry, e, 0), NONE))),
        ("slot is free at GPU", ops.and_(ops.ne(ix, -1), ops.eq(ops.lookup(s.slot_owner, ix, 0), NONE))),
    ]


def e_allocate(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    page, seq = p["page"], p["seq"]
    ix = lay.slot_ix(ops, GPU_LEVEL, pool_group(ops, lay, p["lc"]), p["slot"])
    e = _entry(ops, lay, p)
    return evolve(
        s,
        alive=_set(ops, s.alive, page, True), lc=_set(ops, s.lc, page, p["lc"]),
        committed=_set(ops, s.committed, page, False), level=_set(ops, s.level, page, GPU_LEVEL),
        slot=_set(ops, s.slot, page, p["slot"]), locks=_set(ops, s.locks, page, 1),
        holds=_set(ops, s.holds, page, 0), queued=_set(ops, s.queued, page, False),
        owner=_set(ops, s.owner, page, seq), ordinal=_set(ops, s.ordinal, page, p["ordinal"]),
        key=_set(ops, s.key, page, NONE), dst_level=_set(ops, s.dst_level, page, NONE),
        dst_slot=_set(ops, s.dst_slot, page, NO_SLOT),
        slot_owner=_set(ops, s.slot_owner, ix, page),
        # The new owner's stream waits on the slot's last-use event, then owns it.
        slot_busy=_set(ops, s.slot_busy, ix, seq),
        entry=_set(ops, s.entry, e, page), entry_locked=_set(ops, s.entry_locked, e, True),
        index=_set(ops, s.index, e, p["slot"]),
    )


def g_release(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    page = p["page"]
    return [
        ("page is alive", ops.lookup(s.alive, page, False)),
        ("page is DROPPABLE", ops.eq(status(ops, s, page), int(PageStatus.DROPPABLE))),
        ("page is not queued", ops.not_(ops.lookup(s.queued, page, True))),
        ("page is not migrating", ops.not_(moving(ops, s, page))),
        ("page is uncommitted", ops.not_(ops.lookup(s.committed, page, True))),
    ]


def e_release(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    return _die(ops, lay, s, p["page"])


def g_lock(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    page, e = p["page"], _entry(ops, lay, p)
    return [
        ("sequence is ACTIVE", _active(ops, s, p["seq"])),
        ("block holds the page", ops.and_(ops.ne(e, -1), ops.eq(ops.lookup(s.entry, e, NONE), page))),
        ("block entry is a holder, not a lock", ops.not_(ops.lookup(s.entry_locked, e, True))),
        ("page is at GPU", ops.eq(ops.lookup(s.level, page, -1), GPU_LEVEL)),
        ("page has a slot", has_slot(ops, s, page)),
        ("page is not migrating", ops.not_(moving(ops, s, page))),
    ]


def e_lock(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    page, e = p["page"], _entry(ops, lay, p)
    return evolve(
        s,
        locks=_set(ops, s.locks, page, ops.add(ops.lookup(s.locks, page, 0), 1)),
        holds=_set(ops, s.holds, page, ops.sub(ops.lookup(s.holds, page, 0), 1)),
        queued=_set(ops, s.queued, page, False),
        entry_locked=_set(ops, s.entry_locked, e, True),
        index=_set(ops, s.index, e, ops.lookup(s.slot, page, NO_SLOT)),
    )


def g_unlock(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    e = _entry(ops, lay, p)
    return [
        ("block holds the page", ops.and_(ops.ne(e, -1), ops.eq(ops.lookup(s.entry, e, NONE), p["page"]))),
        ("block entry is a lock", ops.lookup(s.entry_locked, e, False)),
    ]


def e_unlock(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    page, e = p["page"], _entry(ops, lay, p)
    ix = page_slot_ix(ops, lay, s, page)
    s = evolve(
        s,
        locks=_set(ops, s.locks, page, ops.sub(ops.lookup(s.locks, page, 0), 1)),
        holds=_set(ops, s.holds, page, ops.add(ops.lookup(s.holds, page, 0), 1)),
        entry_locked=_set(ops, s.entry_locked, e, False),
        index=_set(ops, s.index, e, BAD_PAGE_INDEX),
        # The unlock records the owner's finish event on the page's slot.
        slot_busy=_set(ops, s.slot_busy, ix, p["seq"]),
    )
    return _schedule_if(ops, lay, s, page, evictable(ops, lay.cfg, s, page))


def g_hold(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    page, e = p["page"], _entry(ops, lay, p)
    return [
        ("page is alive", ops.lookup(s.alive, page, False)),
        ("page is committed", ops.lookup(s.committed, page, False)),
        ("page is of that life cycle and block ordinal", ops.and_(
            ops.eq(ops.lookup(s.lc, page, -1), p["lc"]),
            ops.eq(ops.lookup(s.ordinal, page, -1), p["ordinal"]))),
        ("page is not migrating", ops.not_(moving(ops, s, page))),
        ("block has no page", ops.and_(ops.ne(e, -1), ops.eq(ops.lookup(s.entry, e, 0), NONE))),
    ]


def e_hold(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    page, e = p["page"], _entry(ops, lay, p)
    s = evolve(
        s,
        holds=_set(ops, s.holds, page, ops.add(ops.lookup(s.holds, page, 0), 1)),
        entry=_set(ops, s.entry, e, page), entry_locked=_set(ops, s.entry_locked, e, False),
    )
    return _unqueue_if(ops, s, page, ops.not_(evictable(ops, lay.cfg, s, page)))


def g_release_holder(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    e = _entry(ops, lay, p)
    return [
        ("block holds the page", ops.and_(ops.ne(e, -1), ops.eq(ops.lookup(s.entry, e, NONE), p["page"]))),
        ("block entry is a holder, not a lock", ops.not_(ops.lookup(s.entry_locked, e, True))),
    ]


def e_release_holder(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    page, e = p["page"], _entry(ops, lay, p)
    s = evolve(
        s,
        holds=_set(ops, s.holds, page, ops.sub(ops.lookup(s.holds, page, 0), 1)),
        entry=_set(ops, s.entry, e, NONE),
    )
    droppable = ops.eq(status(ops, s, page), int(PageStatus.DROPPABLE))
    committed = ops.lookup(s.committed, page, False)
    # A DROPPABLE committed page lives on in the queue (the radix tree keeps it);
    # a DROPPABLE uncommitted page is never evictable and must die next.
    s = _schedule_if(ops, lay, s, page, ops.and_(droppable, committed, ops.not_(moving(ops, s, page))))
    return _unqueue_if(ops, s, page, ops.and_(droppable, ops.not_(committed)))


def g_schedule(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    page = p["page"]
    pinned = ops.and_(ops.const(lay.cfg.pocket.policy == PocketPolicy.PIN), in_pocket(ops, s, page))
    return [
        ("page is alive", ops.lookup(s.alive, page, False)),
        ("page is not queued", ops.not_(ops.lookup(s.queued, page, True))),
        ("page is not migrating", ops.not_(moving(ops, s, page))),
        ("page has a slot", has_slot(ops, s, page)),
        ("page is evictable", evictable(ops, lay.cfg, s, page)),
        ("page is not pinned in a pocket", ops.not_(pinned)),
    ]


def e_schedule(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    return _schedule_if(ops, lay, s, p["page"], True)


def g_exclude(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    return [("page is queued", ops.lookup(s.queued, p["page"], False))]


def e_exclude(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    return _unqueue_if(ops, s, p["page"], True)


def _dst_ix(ops: Ops, lay: Layout, s: State, page: Term, dst_level: Term, dst_slot: Term) -> Term:
    return lay.slot_ix(ops, dst_level, pool_group(ops, lay, ops.lookup(s.lc, page, 0)), dst_slot)


def drops_parked(ops: Ops, lay: Layout, s: State, page: Term) -> Term:
    """The eviction cascade drops this victim instead of migrating it: it is parked and the
    configuration says `evict_parked=drop`."""
    drop = named(ops, PARKED_DROPPED, ops.const(lay.cfg.pocket.drops_parked))
    return ops.and_(drop, in_pocket(ops, s, page))


def g_evict_begin(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    page = p["page"]
    lvl = ops.lookup(s.level, page, 0)
    ix = _dst_ix(ops, lay, s, page, ops.add(lvl, 1), p["dst_slot"])
    return [
        victim_cond(ops, lay, s, page),
        ("page is above the last level", ops.lt(lvl, lay.cfg.last_level)),
        ("destination slot is free one level down",
         ops.and_(ops.ne(ix, -1), ops.eq(ops.lookup(s.slot_owner, ix, 0), NONE))),
        ("page is not a parked page to drop", ops.not_(drops_parked(ops, lay, s, page))),
    ]


def _begin_copy(ops: Ops, lay: Layout, s: State, page: Term, dst_level: Term, dst_slot: Term
                ) -> State:
    src_ix = page_slot_ix(ops, lay, s, page)
    dst_ix = _dst_ix(ops, lay, s, page, dst_level, dst_slot)
    copy = lay.copy_stream
    # The copy stream waits on both slots' events, then reads src and writes dst.
    busy = _set(ops, _set(ops, s.slot_busy, src_ix, copy), dst_ix, copy)
    return evolve(
        s,
        queued=_set(ops, s.queued, page, False),
        dst_level=_set(ops, s.dst_level, page, dst_level),
        dst_slot=_set(ops, s.dst_slot, page, dst_slot),
        slot_owner=_set(ops, s.slot_owner, dst_ix, page), slot_busy=busy,
    )


def e_evict_begin(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    page = p["page"]
    return _begin_copy(ops, lay, s, page, ops.add(ops.lookup(s.level, page, 0), 1), p["dst_slot"])


def g_onboard_begin(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    page = p["page"]
    ix = _dst_ix(ops, lay, s, page, GPU_LEVEL, p["dst_slot"])
    return [
        ("page is alive", ops.lookup(s.alive, page, False)),
        ("page is HELD", ops.eq(status(ops, s, page), int(PageStatus.HELD))),
        ("page is below GPU", ops.lt(GPU_LEVEL, ops.lookup(s.level, page, 0))),
        ("page is not queued (pinned for onboarding)", ops.not_(ops.lookup(s.queued, page, True))),
        ("page is not migrating", ops.not_(moving(ops, s, page))),
        ("page is not in a pocket", ops.not_(in_pocket(ops, s, page))),
        ("GPU slot is free", ops.and_(ops.ne(ix, -1), ops.eq(ops.lookup(s.slot_owner, ix, 0), NONE))),
    ]


def e_onboard_begin(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    return _begin_copy(ops, lay, s, p["page"], GPU_LEVEL, p["dst_slot"])


def g_migrate_complete(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    return [("page is migrating", moving(ops, s, p["page"]))]


def e_migrate_complete(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    page = p["page"]
    src_ix = page_slot_ix(ops, lay, s, page)
    went_down = ops.lt(ops.lookup(s.level, page, 0), ops.lookup(s.dst_level, page, 0))
    s = evolve(
        s,
        slot_owner=_set(ops, s.slot_owner, src_ix, NONE),  # released with the copy's event
        level=_set(ops, s.level, page, ops.lookup(s.dst_level, page, 0)),
        slot=_set(ops, s.slot, page, ops.lookup(s.dst_slot, page, NO_SLOT)),
        dst_level=_set(ops, s.dst_level, page, NONE),
        dst_slot=_set(ops, s.dst_slot, page, NO_SLOT),
    )
    pinned = ops.and_(ops.const(lay.cfg.pocket.policy == PocketPolicy.PIN), in_pocket(ops, s, page))
    return _schedule_if(
        ops, lay, s, page, ops.and_(went_down, evictable(ops, lay.cfg, s, page), ops.not_(pinned))
    )


def e_copy_fail(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    page = p["page"]
    dst_ix = _dst_ix(ops, lay, s, page, ops.lookup(s.dst_level, page, 0),
                     ops.lookup(s.dst_slot, page, NO_SLOT))
    went_down = ops.lt(ops.lookup(s.level, page, 0), ops.lookup(s.dst_level, page, 0))
    s = evolve(
        s,
        slot_owner=_set(ops, s.slot_owner, dst_ix, NONE),
        dst_level=_set(ops, s.dst_level, page, NONE),
        dst_slot=_set(ops, s.dst_slot, page, NO_SLOT),
    )
    return _schedule_if(ops, lay, s, page, ops.and_(went_down, evictable(ops, lay.cfg, s, page)))


def g_drop(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    page = p["page"]
    return [
        victim_cond(ops, lay, s, page),
        ("page is DROPPABLE", ops.eq(status(ops, s, page), int(PageStatus.DROPPABLE))),
        ("page is committed", ops.lookup(s.committed, page, False)),
    ]


def e_drop(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    return _die(ops, lay, s, p["page"])


def g_drop_parked(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    page = p["page"]
    return [
        victim_cond(ops, lay, s, page),
        ("page is parked in a pocket", in_pocket(ops, s, page)),
        (PARKED_DROPPED, ops.const(lay.cfg.pocket.drops_parked)),
    ]


def e_drop_parked(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    """The victim's slot returns to its allocator (keeping its busy event: whoever takes
    the slot next waits on it); nothing is copied. The page stays HELD by its pocket entry,
    slotless, until a pop refuses it or a drain releases it; a pop that does not re-check
    (`unsafe`) takes a slot that is no longer there."""
    page = p["page"]
    ix = page_slot_ix(ops, lay, s, page)
    return evolve(
        s,
        slot_owner=_set(ops, s.slot_owner, ix, NONE),
        slot=_set(ops, s.slot, page, NO_SLOT), queued=_set(ops, s.queued, page, False),
    )


def g_park(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    page, seq, e = p["page"], p["seq"], _entry(ops, lay, p)
    return [
        ("the pocket is enabled", ops.const(lay.cfg.pocket.enabled)),
        ("life cycle is SWA", is_swa(ops, lay, p["lc"])),
        ("sequence is ACTIVE", _active(ops, s, seq)),
        ("committing is disallowed for the sequence",
         ops.ne(ops.lookup(s.commit_state, seq, 0), int(CommitState.ALLOWED))),
        ("block holds the page", ops.and_(ops.ne(e, -1), ops.eq(ops.lookup(s.entry, e, NONE), page))),
        ("block entry is a holder, not a lock", ops.not_(ops.lookup(s.entry_locked, e, True))),
        ("page is uncommitted", ops.not_(ops.lookup(s.committed, page, True))),
        ("page is at GPU", ops.eq(ops.lookup(s.level, page, -1), GPU_LEVEL)),
        ("page has a slot", has_slot(ops, s, page)),
        ("page is not migrating", ops.not_(moving(ops, s, page))),
        (POCKET_NOT_FULL, ops.lt(pocket_size(ops, lay, s, seq, p["lc"]), lay.pocket_cap)),
    ]


def e_park(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    page, seq, lc, e = p["page"], p["seq"], p["lc"], _entry(ops, lay, p)
    size = pocket_size(ops, lay, s, seq, lc)
    pocket = s.pocket
    for k in range(lay.pocket_cap):
        ix = lay.pocket_ix(ops, seq, lc, k)
        pocket = ops.store(pocket, ix, ops.ite(ops.eq(size, k), page, ops.lookup(s.pocket, ix, NONE)))
    # The block's holder moves into the pocket: the page stays HELD.
    s = evolve(s, entry=_set(ops, s.entry, e, NONE), pocket=pocket)
    return _unqueue_if(ops, s, page, ops.const(lay.cfg.pocket.policy == PocketPolicy.PIN))


def _pocket_page(ops: Ops, lay: Layout, s: State, p: Params) -> Term:
    return ops.lookup(s.pocket, lay.pocket_ix(ops, p["seq"], p["lc"], p["k"]), NONE)


def still_valid(ops: Ops, s: State, page: Term) -> Term:
    """A parked page can still serve a pop: alive, at GPU, with a slot, not migrating."""
    return ops.and_(
        ops.lookup(s.alive, page, False), ops.eq(ops.lookup(s.level, page, -1), GPU_LEVEL),
        has_slot(ops, s, page), ops.not_(moving(ops, s, page)),
    )


def g_pop(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    page, e = _pocket_page(ops, lay, s, p), _entry(ops, lay, p)
    conds = [
        ("the pocket is enabled", ops.const(lay.cfg.pocket.enabled)),
        ("sequence is ACTIVE", _active(ops, s, p["seq"])),
        ("pocket position holds a page", ops.ne(page, NONE)),
        ("block is within capacity", _within_capacity(ops, lay, s, p["seq"], p["ordinal"])),
        ("block has no page", ops.and_(ops.ne(e, -1), ops.eq(ops.lookup(s.entry, e, 0), NONE))),
    ]
    if lay.cfg.pocket.policy != PocketPolicy.UNSAFE:
        conds.append((STILL_VALID, still_valid(ops, s, page)))
    return conds


def e_pop(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    seq, e = p["seq"], _entry(ops, lay, p)
    page = _pocket_page(ops, lay, s, p)
    policy = lay.cfg.pocket.policy
    slot = ops.lookup(s.slot, page, NO_SLOT)
    # The new block takes the page's slot id as a GPU slot: only safe if it still is one.
    gpu_ix = lay.slot_ix(ops, GPU_LEVEL, pool_group(ops, lay, p["lc"]), slot)
    busy = ops.lookup(s.slot_busy, gpu_ix, IDLE)
    waits = policy != PocketPolicy.UNSAFE  # safe policies wait on the page's event
    hazard = ops.and_(ops.const(not waits), ops.ne(busy, IDLE), ops.ne(busy, seq))
    s = evolve(
        s,
        bad_pop=ops.or_(s.bad_pop, ops.not_(still_valid(ops, s, page))),
        unsynced_reuse=ops.or_(s.unsynced_reuse, hazard),
        pocket=pocket_remove(ops, lay, s.pocket, seq, p["lc"], p["k"]),
        level=_set(ops, s.level, page, GPU_LEVEL),
        ordinal=_set(ops, s.ordinal, page, p["ordinal"]),
        locks=_set(ops, s.locks, page, 1),
        holds=_set(ops, s.holds, page, ops.sub(ops.lookup(s.holds, page, 0), 1)),
        # Dropping the pocket's holder takes the page out of its queue (upstream
        # `_PageHolder.__del__`), whatever the policy; only revalidation checks where it is.
        queued=_set(ops, s.queued, page, False),
        entry=_set(ops, s.entry, e, page), entry_locked=_set(ops, s.entry_locked, e, True),
        index=_set(ops, s.index, e, slot),
        slot_busy=_set(ops, s.slot_busy, gpu_ix, seq),
    )
    return s


def g_drain(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    page = _pocket_page(ops, lay, s, p)
    return [
        ("pocket position holds a page", ops.ne(page, NONE)),
        ("page is not migrating", ops.not_(moving(ops, s, page))),
    ]


def e_drain(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    page = _pocket_page(ops, lay, s, p)
    s = evolve(
        s,
        pocket=pocket_remove(ops, lay, s.pocket, p["seq"], p["lc"], p["k"]),
        holds=_set(ops, s.holds, page, ops.sub(ops.lookup(s.holds, page, 0), 1)),
    )
    # The pocket held the only reference: the uncommitted page dies wherever it is now.
    return _die(ops, lay, s, page)


def g_commit_page(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    page, key = p["page"], p["key"]
    owner = ops.lookup(s.owner, page, NONE)
    e = lay.entry_ix(ops, owner, ops.lookup(s.lc, page, 0), ops.lookup(s.ordinal, page, 0))
    conds = [
        ("page is alive", ops.lookup(s.alive, page, False)),
        ("page is uncommitted", ops.not_(ops.lookup(s.committed, page, True))),
        ("page is not migrating", ops.not_(moving(ops, s, page))),
        ("owner may commit", ops.eq(ops.lookup(s.commit_state, owner, -1), int(CommitState.ALLOWED))),
        ("owner's block holds the page", ops.and_(ops.ne(e, -1), ops.eq(ops.lookup(s.entry, e, NONE), page))),
        ("key is a block key", ops.le(0, key)),
    ]
    if lru(lay):  # policy: kvpocket commits a key once; the safety spec allows a second copy
        lc = ops.lookup(s.lc, page, 0)
        clash = ops.or_(*(
            ops.and_(s.alive[q], s.committed[q], ops.eq(s.key[q], key), ops.eq(s.lc[q], lc))
            for q in page_ids(ops, lay, s)
        ))
        conds.append((KEY_UNIQUE, ops.not_(clash)))
    return conds


def e_commit_page(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    page = p["page"]
    return evolve(
        s,
        committed=_set(ops, s.committed, page, True), key=_set(ops, s.key, page, p["key"]),
        owner=_set(ops, s.owner, page, NONE),
    )


def g_complete(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    return [("stream has outstanding work", any_equal(ops, s.slot_busy, p["stream"]))]


def e_complete(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    return evolve(s, slot_busy=replace_equal(ops, s.slot_busy, p["stream"], IDLE))


def g_copy_fail(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    return [("page is migrating", moving(ops, s, p["page"]))]


def _lengths(c: KVConfig) -> range:
    return range(c.max_capacity + 1)


def _statuses(c: KVConfig) -> range:
    return range(len(SeqStatus))


def _commit_states(c: KVConfig) -> range:
    return range(len(CommitState))


P_CAP = Param("capacity", _lengths, "capacity in tokens")
P_HIST = Param("history", _lengths, "history length in tokens")
P_COMMITTED = Param("committed", _lengths, "committed tokens")
P_STATUS = Param("status", _statuses, "sequence status")
P_CSTATE = Param("commit_state", _commit_states, "commit state")


def _seq_entries(ops: Ops, lay: Layout, s: State, seq: Term) -> list[tuple[Term, Term]]:
    """(entry page, entry is a lock) for every block of a sequence that may hold a page: on
    plain values only the entries holding one (an entry without a page satisfies both
    conditions read from these, so leaving it out changes no answer)."""
    if not ops.symbolic and 0 <= seq < lay.seqs:
        return [(s.entry[e], s.entry_locked[e])
                for e in used_in(s.entry, NONE, lay.entry_range(seq))]
    out = []
    for lc in range(lay.lcs):
        for o in range(lay.blocks):
            e = lay.entry_ix(ops, seq, lc, o)
            out.append((ops.lookup(s.entry, e, NONE), ops.lookup(s.entry_locked, e, False)))
    return out


def g_set_status(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    seq, st = p["seq"], p["status"]
    entries = _seq_entries(ops, lay, s, seq)
    pocket_empty = ops.eq(pocket_size_all(ops, lay, s, seq), 0)
    no_locks = ops.not_(ops.or_(*(ops.and_(ops.ne(pg, NONE), lk) for pg, lk in entries)))
    no_entries = ops.not_(ops.or_(*(ops.ne(pg, NONE) for pg, _ in entries)))
    gone = ops.or_(ops.eq(st, int(SeqStatus.FREE)), ops.eq(st, int(SeqStatus.CLOSED)))
    return [
        ("sequence exists", ops.and_(ops.le(0, seq), ops.lt(seq, lay.seqs))),
        ("an inactive sequence has an empty pocket and no locks",
         ops.implies(ops.ne(st, int(SeqStatus.ACTIVE)), ops.and_(pocket_empty, no_locks))),
        ("a free or closed sequence has no blocks", ops.implies(gone, no_entries)),
    ]


def e_set_status(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    return evolve(s, seq_status=_set(ops, s.seq_status, p["seq"], p["status"]))


def g_set_lengths(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    return [
        ("committed <= history <= capacity <= max capacity", ops.and_(
            ops.le(0, p["committed"]), ops.le(p["committed"], p["history"]),
            ops.le(p["history"], p["capacity"]), ops.le(p["capacity"], lay.cfg.max_capacity),
        )),
    ]


def e_set_lengths(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    seq = p["seq"]
    return evolve(
        s,
        capacity=_set(ops, s.capacity, seq, p["capacity"]),
        history=_set(ops, s.history, seq, p["history"]),
        committed_tokens=_set(ops, s.committed_tokens, seq, p["committed"]),
    )


def g_set_commit_state(ops: Ops, lay: Layout, s: State, p: Params) -> list[Cond]:
    return [("sequence exists", ops.and_(ops.le(0, p["seq"]), ops.lt(p["seq"], lay.seqs)))]


def e_set_commit_state(ops: Ops, lay: Layout, s: State, p: Params) -> State:
    return evolve(s, commit_state=_set(ops, s.commit_state, p["seq"], p["commit_state"]))


def pocket_size_all(ops: Ops, lay: Layout, s: State, seq: Term) -> Term:
    return ops.count([
        ops.ne(ops.lookup(s.pocket, lay.pocket_ix(ops, seq, lc, k), NONE), NONE)
        for lc in range(lay.lcs) for k in range(lay.pocket_cap)
    ])


PAGE_ACTIONS: dict[str, PageAction] = {a.name: a for a in (
    PageAction("allocate", g_allocate, e_allocate, (P_PAGE, P_SEQ, P_LC, P_ORD, P_GPU_SLOT),
       "A free GPU slot becomes a new uncommitted page, locked by its block."),
    PageAction("release", g_release, e_release, (P_PAGE,),
       "A DROPPABLE uncommitted page dies; its slot returns to its level's allocator."),
    PageAction("lock", g_lock, e_lock, (P_PAGE, P_SEQ, P_LC, P_ORD),
       "A block's holder becomes a lock: the page must be at GPU; it leaves the queue."),
    PageAction("unlock", g_unlock, e_unlock, (P_PAGE, P_SEQ, P_LC, P_ORD),
       "A block's lock becomes a holder; the index entry turns BAD; scheduled if evictable."),
    PageAction("hold", g_hold, e_hold, (P_PAGE, P_SEQ, P_LC, P_ORD),
       "A block holds a committed page (prefix reuse); unqueued if no longer evictable."),
    PageAction("release_holder", g_release_holder, e_release_holder, (P_PAGE, P_SEQ, P_LC, P_ORD),
       "A block drops its holder; a DROPPABLE committed page stays queued for reuse."),
    PageAction("schedule", g_schedule, e_schedule, (P_PAGE,),
       "An evictable page is pushed at the tail of its queue."),
    PageAction("exclude", g_exclude, e_exclude, (P_PAGE,),
       "A queued page is taken out of its queue (pinned)."),
    PageAction("evict_begin", g_evict_begin, e_evict_begin, (P_PAGE, P_DST_SLOT),
       "The queue head starts migrating one level down: destination slot reserved, copy in flight."),
    PageAction("onboard_begin", g_onboard_begin, e_onboard_begin, (P_PAGE, P_DST_SLOT),
       "A pinned HELD page starts migrating up to GPU (resume)."),
    PageAction("migrate_complete", g_migrate_complete, e_migrate_complete, (P_PAGE,),
       "A migration completes: the source slot is released with the copy's event."),
    PageAction("copy_fail", g_copy_fail, e_copy_fail, (P_PAGE,),
       "A migration's copy fails: the destination slot is released, the page stays."),
    PageAction("drop", g_drop, e_drop, (P_PAGE,), "The queue head, DROPPABLE and committed, is dropped."),
    PageAction("drop_parked", g_drop_parked, e_drop_parked, (P_PAGE,),
       "The queue head, parked, is dropped (evict_parked=drop): its slot is released without "
       "a copy; its pocket entry stays, slotless, until popped (refused) or drained."),
    PageAction("park", g_park, e_park, (P_PAGE, P_SEQ, P_LC, P_ORD),
       "A freshly stale, orphaned page moves from its block into the sequence's pocket."),
    PageAction("pop", g_pop, e_pop, (P_SEQ, P_LC, P_POS, P_ORD),
       "A parked page's slot serves a new block (the policy decides what is re-checked)."),
    PageAction("drain", g_drain, e_drain, (P_SEQ, P_LC, P_POS), "A pocket entry is released; the page dies."),
    PageAction("commit_page", g_commit_page, e_commit_page, (P_PAGE, P_KEY),
       "An uncommitted page becomes committed under a block key."),
    PageAction("complete", g_complete, e_complete, (P_STREAM,), "A stream's outstanding GPU work completes."),
    PageAction("set_status", g_set_status, e_set_status, (P_SEQ, P_STATUS),
       "Sequence bookkeeping: its status changes."),
    PageAction("set_lengths", g_set_lengths, e_set_lengths, (P_SEQ, P_CAP, P_HIST, P_COMMITTED),
       "Sequence bookkeeping: capacity, history and committed token count change."),
    PageAction("set_commit_state", g_set_commit_state, e_set_commit_state, (P_SEQ, P_CSTATE),
       "Sequence bookkeeping: committing stops or restarts."),
)}
