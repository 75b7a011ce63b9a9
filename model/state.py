"""The model's state: fixed-size arrays, one field per variable, nothing hidden.

Pages are records 0..P-1 (`alive` says which are in use). Multi-dimensional
arrays are flattened; `Layout` turns (level, pool group, slot) or
(sequence, life cycle, ordinal) into a flat index, with ops arithmetic so an
index can be a symbolic term. Only `Layout` knows the flattening.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .config import (
    BAD_PAGE_INDEX,
    NO_SLOT,
    NONE,
    CommitState,
    KVConfig,
    PageStatus,
    SeqStatus,
)
from .logic import Array, Ops, Term
from .overrides import named
from .sparse import SparseArray

COPY_STREAM_OFFSET = 0  # the copy stream's id is num_sequences (compute streams are 0..S-1)
IDLE = -1  # a slot with no outstanding GPU work


@dataclass(frozen=True)
class State:
    # ---- per page (length P) ----
    alive: Array
    lc: Array
    committed: Array
    level: Array
    slot: Array  # NO_SLOT when the page has no slot
    locks: Array  # number of block entries that lock the page (LOCKED iff > 0)
    holds: Array  # number of unlocked holders: block entries and pocket entries
    queued: Array  # scheduled for eviction at its level
    stamp: Array  # when it was last scheduled (LRU order within a priority)
    owner: Array  # owning sequence of an uncommitted page, NONE for committed
    ordinal: Array  # block ordinal
    key: Array  # block key of a committed page (interned token prefix), NONE otherwise
    dst_level: Array  # level a migration in flight goes to, NONE if not moving
    dst_slot: Array  # slot reserved at dst_level for that migration
    # ---- per (level, pool group, slot), flattened ----
    slot_owner: Array  # page id occupying the slot, NONE if free
    slot_busy: Array  # stream with outstanding work on the slot, IDLE if none
    # ---- per sequence ----
    seq_status: Array
    commit_state: Array
    capacity: Array
    history: Array
    committed_tokens: Array
    # ---- per (sequence, life cycle, ordinal) ----
    entry: Array  # page id held or locked by that block, NONE if none
    entry_locked: Array  # the entry is a lock (else a holder)
    index: Array  # the page-index table attention kernels read
    # ---- per (sequence, life cycle, pocket position), FIFO order, packed at the front ----
    pocket: Array
    # ---- scalars ----
    clock: Term  # next LRU stamp
    fault_alloc: Term  # injected: the next slot allocation fails (consumed by the failure)
    fault_copy: Term  # injected: the next migration copy fails (consumed by the failure)
    # ---- history (ghost) variables: they record that something unsafe happened ----
    bad_pop: Term  # a pop took a slot that was not a valid GPU slot of a GPU-resident page
    unsynced_reuse: Term  # a slot was reused before its last use on another stream completed
    # ---- token content (concrete only: read by the API layer, never by page actions) ----
    tokens: tuple[tuple[int, ...], ...] = ()  # committed tokens per sequence
    block_keys: tuple[tuple[int, ...], ...] = ()  # interned token prefixes; a key is an index

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


STATE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(State))


# ---- the schema: every field's index domain and value kind, declared once -----------------
# Domains: "page" (P records), "slot" (level, pool group, slot), "seq" (S sequences),
# "entry" (sequence, life cycle, ordinal), "pocket" (sequence, life cycle, position),
# "scalar", and "concrete" (token content, never symbolic). Kinds: "bool", "int", or the
# id of an element: "page" (NONE or a page), "seq" (a sequence or stream), "slot" (NO_SLOT
# or a slot number). The Z3 engines, the counterexample printer and the incremental
# checker read their field lists from here; `tests/model/test_schema.py` checks it
# against `State` and Init.


@dataclass(frozen=True)
class FieldSpec:
    name: str
    domain: str
    kind: str


SCHEMA: tuple[FieldSpec, ...] = (
    *(FieldSpec(n, "page", k) for n, k in (
        ("alive", "bool"), ("lc", "int"), ("committed", "bool"), ("level", "int"),
        ("slot", "slot"), ("locks", "int"), ("holds", "int"), ("queued", "bool"),
        ("stamp", "int"), ("owner", "seq"), ("ordinal", "int"), ("key", "int"),
        ("dst_level", "int"), ("dst_slot", "slot"))),
    FieldSpec("slot_owner", "slot", "page"), FieldSpec("slot_busy", "slot", "seq"),
    *(FieldSpec(n, "seq", "int") for n in (
        "seq_status", "commit_state", "capacity", "history", "committed_tokens")),
    FieldSpec("entry", "entry", "page"), FieldSpec("entry_locked", "entry", "bool"),
    FieldSpec("index", "entry", "slot"), FieldSpec("pocket", "pocket", "page"),
    *(FieldSpec(n, "scalar", k) for n, k in (
        ("clock", "int"), ("fault_alloc", "bool"), ("fault_copy", "bool"),
        ("bad_pop", "bool"), ("unsynced_reuse", "bool"))),
    FieldSpec("tokens", "concrete", "int"), FieldSpec("block_keys", "concrete", "int"),
)
SCHEMA_BY_NAME: dict[str, FieldSpec] = {f.name: f for f in SCHEMA}


def fields_in(*domains: str) -> tuple[str, ...]:
    """The fields over these index domains, in declaration order."""
    return tuple(f.name for f in SCHEMA if f.domain in domains)


PAGE_FIELDS = fields_in("page")
SEQ_FIELDS = fields_in("seq")
ENTRY_FIELDS = fields_in("entry")
SCALAR_FIELDS = fields_in("scalar")
CONCRETE_FIELDS = fields_in("concrete")
ARRAY_FIELDS = fields_in("page", "slot", "seq", "entry", "pocket")  # what Z3 reads as arrays
_FIELD_SET = frozenset(STATE_FIELDS)


def evolve(s: State, **changes: Any) -> State:
    """`dataclasses.replace` for `State`, without re-running `__init__` field by field: the
    model's hottest call. Unchanged fields are shared, which the incremental invariant
    check relies on (`incremental.py`)."""
    if not _FIELD_SET.issuperset(changes):
        unknown = changes.keys() - _FIELD_SET
        raise TypeError(f"State has no field(s) {', '.join(sorted(unknown))}")
    new = object.__new__(State)
    new.__dict__.update(s.__dict__)
    new.__dict__.update(changes)
    return new


@dataclass(frozen=True)
class Layout:
    """Sizes and flattening for one configuration (computed once: the model's hot path)."""

    cfg: KVConfig
    pages: int = field(init=False)
    seqs: int = field(init=False)
    lcs: int = field(init=False)
    blocks: int = field(init=False)
    pocket_cap: int = field(init=False)
    copy_stream: int = field(init=False)
    total_slots: int = field(init=False)
    pool_group_of_lc: tuple[int, ...] = field(init=False)
    priority_of_lc: tuple[int, ...] = field(init=False)
    swa_of_lc: tuple[bool, ...] = field(init=False)
    _offsets: tuple[int, ...] = field(init=False)
    # speed only: answers the executable model derives from the layout and remembers
    # (`api._resize_blocks`); not part of the layout's value
    memo: dict[str, Any] = field(init=False, default_factory=dict, compare=False, hash=False,
                                 repr=False)

    def __post_init__(self) -> None:
        cfg = self.cfg
        groups = cfg.num_pool_groups
        offsets = [0]
        for n in cfg.slots_per_level:
            offsets.append(offsets[-1] + n * groups)
        for name, value in (
            ("pages", cfg.max_pages), ("seqs", cfg.num_sequences),
            ("lcs", cfg.num_life_cycles), ("blocks", cfg.max_blocks),
            ("pocket_cap", cfg.pocket.capacity),
            ("copy_stream", cfg.num_sequences + COPY_STREAM_OFFSET),
            ("total_slots", offsets[-1]),
            ("pool_group_of_lc", tuple(lc.pool_group for lc in cfg.life_cycles)),
            ("priority_of_lc", tuple(lc.priority for lc in cfg.life_cycles)),
            ("swa_of_lc", tuple(lc.is_swa for lc in cfg.life_cycles)),
            ("_offsets", tuple(offsets)),
        ):
            object.__setattr__(self, name, value)

    def level_offset(self, level: int) -> int:
        return self._offsets[level]

    def slots_at(self, level: int) -> int:
        return self.cfg.slots_per_level[level]

    def slot_ix(self, ops: Ops, level: Term, pg: Term, slot: Term) -> Term:
        """Flat index of (level, pool group, slot); symbolic levels select among offsets."""
        groups = self.cfg.num_pool_groups
        if not ops.symbolic:
            if not (0 <= level < self.cfg.num_levels and 0 <= pg < groups):
                return -1
            n = self.slots_at(level)
            return self.level_offset(level) + pg * n + slot if 0 <= slot < n else -1
        result: Term = ops.const(-1)
        for lv in range(self.cfg.num_levels):
            n = self.slots_at(lv)
            base = self.level_offset(lv)
            flat = _affine(ops, base, [(pg, n), (slot, 1)])
            in_range = ops.and_(ops.le(0, slot), ops.lt(slot, n), ops.le(0, pg), ops.lt(pg, groups))
            result = ops.ite(ops.and_(ops.eq(level, lv), in_range), flat, result)
        return result

    def slot_range(self, level: int, pg: int) -> range:
        """The flat indices of the slots of one (level, pool group), in slot order."""
        base = self.level_offset(level) + pg * self.slots_at(level)
        return range(base, base + self.slots_at(level))

    def entry_range(self, seq: int) -> range:
        """The flat block-entry positions of a sequence (every life cycle and block)."""
        per_seq = self.lcs * self.blocks
        return range(seq * per_seq, (seq + 1) * per_seq)

    def pocket_range(self, seq: int, lc: int | None = None) -> range:
        """The flat pocket positions of a sequence (of one life cycle, or of all)."""
        cap = self.pocket_cap
        if lc is None:
            return range(seq * self.lcs * cap, (seq + 1) * self.lcs * cap)
        base = (seq * self.lcs + lc) * cap
        return range(base, base + cap)

    def slot_coords(self, flat: int) -> tuple[int, int, int]:
        for lv in range(self.cfg.num_levels):
            n = self.slots_at(lv)
            base = self.level_offset(lv)
            if flat < base + n * self.cfg.num_pool_groups:
                rel = flat - base
                return lv, rel // n, rel % n
        raise IndexError(flat)

    def entry_ix(self, ops: Ops, seq: Term, lc: Term, ordinal: Term) -> Term:
        if not ops.symbolic:
            if 0 <= seq < self.seqs and 0 <= lc < self.lcs and 0 <= ordinal < self.blocks:
                return (seq * self.lcs + lc) * self.blocks + ordinal
            return -1
        ok = ops.and_(
            ops.le(0, seq), ops.lt(seq, self.seqs), ops.le(0, lc), ops.lt(lc, self.lcs),
            ops.le(0, ordinal), ops.lt(ordinal, self.blocks),
        )
        flat = _affine(ops, 0, [(seq, self.lcs * self.blocks), (lc, self.blocks), (ordinal, 1)])
        return ops.ite(ok, flat, -1)

    def pocket_ix(self, ops: Ops, seq: Term, lc: Term, k: Term) -> Term:
        cap = self.pocket_cap
        if not ops.symbolic:
            if 0 <= seq < self.seqs and 0 <= lc < self.lcs and 0 <= k < cap:
                return (seq * self.lcs + lc) * cap + k
            return -1
        ok = ops.and_(
            ops.le(0, seq), ops.lt(seq, self.seqs), ops.le(0, lc), ops.lt(lc, self.lcs),
            ops.le(0, k), ops.lt(k, cap),
        )
        return ops.ite(ok, _affine(ops, 0, [(seq, self.lcs * cap), (lc, cap), (k, 1)]), -1)

    def initial_state(self, sparse_above: int | None = None) -> State:
        """Init, as tuples (what Z3 and the bounded searches read), or with every array
        longer than `sparse_above` a `SparseArray`, whose size follows the positions in use
        rather than the declared geometry (the executable model's; equal values either
        way). Small arrays stay tuples: reading a tuple is faster, copying it cheap."""
        p, s = self.pages, self.seqs
        e = s * self.lcs * self.blocks

        def arr(n: int, default: Term, segments: tuple[int, ...] = (0,)) -> Array:
            if sparse_above is not None and n > sparse_above:
                return SparseArray(n, default, segments=segments)
            return (default,) * n

        # the slots of each (level, pool group) are a segment: free slots count in O(1)
        pools = tuple(self.level_offset(lv) + g * self.slots_at(lv)
                      for lv in range(self.cfg.num_levels)
                      for g in range(self.cfg.num_pool_groups))

        return State(
            alive=arr(p, False), lc=arr(p, 0), committed=arr(p, False), level=arr(p, 0),
            slot=arr(p, NO_SLOT), locks=arr(p, 0), holds=arr(p, 0), queued=arr(p, False),
            stamp=arr(p, 0), owner=arr(p, NONE), ordinal=arr(p, 0), key=arr(p, NONE),
            dst_level=arr(p, NONE), dst_slot=arr(p, NO_SLOT),
            slot_owner=arr(self.total_slots, NONE, pools), slot_busy=arr(self.total_slots, IDLE),
            seq_status=arr(s, int(SeqStatus.FREE)), commit_state=arr(s, int(CommitState.ALLOWED)),
            capacity=arr(s, 0), history=arr(s, 0), committed_tokens=arr(s, 0),
            entry=arr(e, NONE), entry_locked=arr(e, False), index=arr(e, BAD_PAGE_INDEX),
            pocket=arr(s * self.lcs * self.pocket_cap, NONE),
            clock=0, fault_alloc=False, fault_copy=False, bad_pop=False, unsynced_reuse=False,
            tokens=((),) * s, block_keys=(),
        )


def _affine(ops: Ops, base: int, terms: list[tuple[Term, int]]) -> Term:
    """base + sum(x * k): a flat index from coordinates."""
    if not ops.symbolic:
        return base + sum(int(x) * k for x, k in terms)
    acc: Term = ops.const(base)
    for x, k in terms:
        acc = ops.add(acc, ops.scale(x, k))
    return acc


# ---- derived predicates, shared by guards, effects and invariants ------------------------


def status(ops: Ops, s: State, p: Term) -> Term:
    """PageStatus of page p as a term."""
    locks = ops.lookup(s.locks, p, 0)
    holds = ops.lookup(s.holds, p, 0)
    return ops.ite(
        ops.lt(0, locks), int(PageStatus.LOCKED),
        ops.ite(ops.lt(0, holds), int(PageStatus.HELD), int(PageStatus.DROPPABLE)),
    )


def evictable(ops: Ops, cfg: KVConfig, s: State, p: Term) -> Term:
    """Upstream `is_evictable`: (DROPPABLE and committed) or (HELD and not at the last level)."""
    st = status(ops, s, p)
    return ops.or_(
        ops.and_(ops.eq(st, int(PageStatus.DROPPABLE)), ops.lookup(s.committed, p, False)),
        ops.and_(ops.eq(st, int(PageStatus.HELD)), ops.lt(ops.lookup(s.level, p, 0), cfg.last_level)),
    )


def stale(ops: Ops, cfg: KVConfig, lc: int, o: int, h: Term,
          start_label: str | None = None) -> Term:
    """The window rule, the model's one statement of it: block o of life cycle lc is out of
    the window at history h. The newest token sits at position h, so the window starts at
    h + 1 - window, and a block is stale once its last token is before that; sink blocks
    and life cycles without a window never are. The API programs pass `start_label`, so a
    verifier can override the start they decide on (a spec mutant); the invariants do not,
    so they still state the rule a mutated program breaks. `config.stale_range` is its
    closed form, which the impl reads (`tests/model/test_window.py` checks they agree)."""
    life = cfg.life_cycles[lc]
    t = cfg.tokens_per_block
    if life.window is None or o < -(-life.sink_tokens // t):
        return ops.const(False)
    start = ops.sub(ops.add(h, 1), life.window)
    if start_label is not None:
        start = named(ops, start_label, start)
    return ops.le((o + 1) * t, start)


def page_ids(ops: Ops, lay: Layout, s: State, flags: Array | None = None) -> Iterable[int]:
    """The page records a predicate that is False unless `flags[p]` (default `s.alive`)
    need look at: every record for terms and tuples, in a sparse state only those whose
    flag is set (ascending), so the cost follows the pages in use."""
    arr = s.alive if flags is None else flags
    if not ops.symbolic and isinstance(arr, SparseArray):
        return sorted(arr.truthy())
    return range(lay.pages)


def dead_page_ids(ops: Ops, lay: Layout, s: State) -> Iterable[int]:
    """The unused page records, ascending (a superset of them for terms): in a sparse state
    found from the lowest one, which the array remembers, so taking a new page record
    costs what changed since the last one, not the pages in use."""
    if not ops.symbolic and isinstance(s.alive, SparseArray) and s.alive.default is False:
        return s.alive.default_positions()
    return range(lay.pages)
