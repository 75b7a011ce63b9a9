"""The sequence layer: API and environment actions as programs over page actions.

Each program takes an executor (`model/executor.py`) and concrete arguments.
Loops are bounded by the configuration; branches on state go through
`ex.when`; every pick goes through `ex.choose`. An `ex.fail` (OutOfPages) makes
the whole API action roll back to its pre-state; the caller reports False.
Preconditions on the arguments (`ex.require`) raise a UsageError before any
state changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .choices import BELOW, CLASH, HIT, REUSE
from .config import (
    GPU_LEVEL,
    NONE,
    CommitState,
    PageStatus,
    PocketPolicy,
    SeqStatus,
    num_blocks_for,
    stale_range,
)
from .errors import (
    CapacityError,
    CommitError,
    HistoryDecreaseError,
    SequenceStateError,
    UnknownSequenceError,
)
from .executor import Executor, LookupLabel
from .keyindex import key_table, pages_with_key
from .logic import Term, any_equal, count_equal
from .overrides import any_override, named
from .pages import (
    POCKET_NOT_FULL,
    STILL_VALID,
    drops_parked,
    lru,
    pocket_size,
    pool_group,
    still_valid,
    victim_cond,
)
from .sparse import SparseArray, used_in
from .state import State, dead_page_ids, evolve, page_ids, stale, status

# ---- small derived terms -------------------------------------------------------------------

WINDOW_START = "first token position inside the window"


def _stale(ex: Executor, lc: int, o: int, h: Term) -> Term:
    """Block o of life cycle lc is out of the window at history h (`state.stale`)."""
    return stale(ex.ops, ex.lay.cfg, lc, o, h, start_label=WINDOW_START)


def _in_cap(ex: Executor, o: int, cap: Term) -> Term:
    return ex.ops.lt(o * ex.lay.cfg.tokens_per_block, cap)


def _entry(ex: Executor, seq: int, lc: int, o: int) -> tuple[Term, Term]:
    e = ex.lay.entry_ix(ex.ops, seq, lc, o)
    return ex.s.entry[e], ex.s.entry_locked[e]


def _free_count(ex: Executor, level: int, pg: int) -> Term:
    return count_equal(ex.ops, ex.s.slot_owner, ex.lay.slot_range(level, pg), NONE)


def _slot_is_free(ex: Executor, level: int, pg: Term) -> Callable[[int], Term]:
    def legal(slot: int) -> Term:
        ix = ex.lay.slot_ix(ex.ops, level, pg, slot)
        return ex.ops.eq(ex.ops.lookup(ex.s.slot_owner, ix, 0), NONE)
    return legal


def _slot_twins(ex: Executor, level: int, pg: int) -> Callable[[int], tuple[Term, ...]]:
    """Free slots of one level with the same outstanding work are interchangeable: nothing
    else refers to a free slot. (A blind `unsafe` pop reads a host slot id as a GPU one,
    but that pop already breaks `popped_slots_valid` whatever the ids: up to the first
    violation, renaming the slots of a level is a symmetry of every run.)"""
    def key(slot: int) -> tuple[Term, ...]:
        return (ex.ops.lookup(ex.s.slot_busy, ex.lay.slot_ix(ex.ops, level, pg, slot), 0),)
    return key


def _victims_at(ex: Executor, level: int, pg: int) -> Callable[[int], Term]:
    """Which pages eviction may take at (level, pool group): any queued page there (the
    safety spec), or under the `lru` profile only its queue's head."""
    ops, s, lay = ex.ops, ex.s, ex.lay
    if not ops.symbolic:  # the same predicates, on plain values
        if not lru(lay):  # read per candidate asked about (not every queued page)
            return lambda p: (0 <= p < lay.pages and bool(s.queued[p]) and s.level[p] == level
                              and lay.pool_group_of_lc[s.lc[p]] == pg)
        queued = [p for p in page_ids(ops, lay, s, s.queued) if s.queued[p] and s.level[p] == level
                  and lay.pool_group_of_lc[s.lc[p]] == pg]
        # LRU stamps are unique: one head
        head = min(queued, key=lambda p: (lay.priority_of_lc[s.lc[p]], s.stamp[p]), default=-1)
        return lambda p: p == head

    def legal(p: int) -> Term:
        return ops.and_(victim_cond(ops, lay, s, p)[1], ops.eq(s.level[p], level),
                        ops.eq(pool_group(ops, lay, s.lc[p]), pg))
    return legal


# ---- storage: allocation and the eviction cascade ----------------------------------------


def _where(ex: Executor, p: int) -> object:
    """Where a page sits: (level, pool group, slot), the name both sides share."""
    s = ex.s
    return (s.level[p], pool_group(ex.ops, ex.lay, s.lc[p]), s.slot[p])


def _sits_at(ex: Executor, where: object) -> int | None:
    """The page whose slot is `where` ((level, pool group, slot)), if any: plain values."""
    if not (isinstance(where, tuple) and len(where) == 3
            and all(isinstance(x, int) for x in where)):
        return None
    ix = ex.lay.slot_ix(ex.ops, *where)
    page = ex.s.slot_owner[ix] if ix != -1 else NONE
    return None if page == NONE else int(page)


def can_make_room(ex: Executor, level: int, pg: int) -> Term:
    """One slot can be freed at (level, pool group): a free slot, or a page eviction may take
    that can leave (dropped at the last level, when DROPPABLE or when a parked page to
    drop, or room below for it). Under the safety spec some victim can leave; a manager
    that picks another one fails the call (rolled back), which is safe."""
    ops, lay = ex.ops, ex.lay
    if level > lay.cfg.last_level:
        return ops.const(False)
    free = ops.lt(0, _free_count(ex, level, pg))
    if free is True:  # plain values: a free slot is room enough, the victims need no look
        return free
    below = can_make_room(ex, level + 1, pg)
    head = _victims_at(ex, level, pg)

    def leaves(p: Term) -> Term:
        return ops.and_(head(p), ops.or_(
            ops.const(level == lay.cfg.last_level),
            ops.eq(status(ops, ex.s, p), int(PageStatus.DROPPABLE)),
            drops_parked(ops, lay, ex.s, p), below))

    if not ops.symbolic:  # plain values: some queued page, in any order, up to the first
        queued = ex.s.queued
        pages = queued.iter_truthy() if isinstance(queued, SparseArray) else \
            page_ids(ops, lay, ex.s, queued)
        return any(leaves(p) for p in pages)
    return ops.or_(free, *(leaves(p) for p in page_ids(ops, lay, ex.s, ex.s.queued)))


def make_room(ex: Executor, level: int, pg: int, need: Term) -> None:
    """Free `need` slots at (level, pool group) by evicting victims, cascading down.

    At the last level a victim is dropped. Above it, a parked victim is dropped when the
    configuration says `evict_parked=drop` (its data is dead: no copy); any other victim
    migrates one level down after room is made there recursively; a DROPPABLE victim for
    which no room can be made (or, under the safety spec, for which the manager declines to
    evict below: `_makes_room_below`) is dropped instead (it only caches committed data); a
    HELD one fails the call.
    """
    ops, lay = ex.ops, ex.lay
    last = lay.cfg.last_level
    for _ in ex.when(ops.lt(lay.slots_at(level), need)):
        ex.fail(f"{need} slots requested at level {level}; capacity is {lay.slots_at(level)}")
    for _ in range(lay.slots_at(level)):
        short = ops.lt(_free_count(ex, level, pg), need)
        if short is False:  # plain values: the rounds left would change nothing
            break
        for _ in ex.when(short):
            victim = ex.choose("victim", range(lay.pages), _victims_at(ex, level, pg),
                               LookupLabel(lambda p: _where(ex, p), lambda w: _sits_at(ex, w)),
                               among=lambda: page_ids(ops, lay, ex.s, ex.s.queued))
            for _ in ex.when(ops.eq(victim, NONE)):
                ex.fail(f"no evictable page at level {level}, pool group {pg}")
            if level == last:
                ex.do("drop", page=victim)
                continue
            parked = drops_parked(ops, lay, ex.s, victim)
            for _ in ex.when(parked):
                ex.do("drop_parked", page=victim)
            for _ in ex.when(ops.not_(parked)):
                room = can_make_room(ex, level + 1, pg)
                if not lru(lay):
                    room = ops.and_(room, _makes_room_below(ex, level + 1, pg, room))
                droppable = ops.eq(status(ops, ex.s, victim), int(PageStatus.DROPPABLE))
                for _ in ex.when(room):
                    make_room(ex, level + 1, pg, 1)
                    migrate(ex, victim, level + 1, pg)
                for _ in ex.when(ops.and_(ops.not_(room), droppable)):
                    ex.do("drop", page=victim)
                for _ in ex.when(ops.and_(ops.not_(room), ops.not_(droppable))):
                    ex.fail(f"no room below level {level} for a HELD page")


def _makes_room_below(ex: Executor, level: int, pg: int, room: Term) -> Term:
    """Under the safety spec, when room below has to be made by evicting there, doing so is
    the manager's call (0: it does; 1: it declines, and a DROPPABLE victim is dropped, a
    HELD one fails the call: both safe). With a free slot below the victim migrates. The
    `lru` engine makes room whenever its queue heads below can leave. Labelled (level,
    pool group) of the level below."""
    ops = ex.ops
    full = ops.eq(_free_count(ex, level, pg), 0)
    pick = ex.choose(BELOW, range(2),
                     lambda j: room if j == 0 else full,
                     lambda j: (level, pg))
    return ops.eq(pick, 0)


def take_slot(ex: Executor, level: int, pg: int) -> Term:
    """One allocator call: a free slot at (level, pool group), or an (injected) failure."""
    for _ in ex.when(ex.s.fault_alloc):
        ex.fail("injected allocation failure", consumed="alloc")
    slot = ex.choose("slot", range(ex.lay.slots_at(level)), _slot_is_free(ex, level, pg),
                     same=_slot_twins(ex, level, pg))
    for _ in ex.when(ex.ops.eq(slot, NONE)):
        ex.fail(f"no free slot at level {level}, pool group {pg}")
    return slot


def migrate(ex: Executor, page: Term, dst_level: int, pg: int) -> None:
    """Move a page to dst_level (one level down, or up to GPU) as begin + complete."""
    for _ in ex.when(ex.s.fault_copy):
        ex.fail("injected copy failure", consumed="copy")
    dst = take_slot(ex, dst_level, pg)
    action = "onboard_begin" if dst_level == GPU_LEVEL else "evict_begin"
    ex.do(action, page=page, dst_slot=dst)
    ex.do("migrate_complete", page=page)


def allocate_block(ex: Executor, seq: int, lc: int, o: int) -> None:
    """A new locked page for block (seq, lc, o) in a free GPU slot (room already made)."""
    ops, lay = ex.ops, ex.lay
    slot = take_slot(ex, GPU_LEVEL, lay.cfg.pool_group_of(lc))
    page = ex.choose("page", range(lay.pages), lambda p: ops.not_(ex.s.alive[p]),
                     same=lambda p: (), among=lambda: dead_page_ids(ops, lay, ex.s))
    for _ in ex.when(ops.eq(page, NONE)):
        ex.fail("no free page record")
    ex.do("allocate", page=page, seq=seq, lc=lc, ordinal=o, slot=slot)


def release_block(ex: Executor, seq: int, lc: int, o: int) -> None:
    """Drop block (seq, lc, o)'s reference; an uncommitted page dies with it."""
    ops = ex.ops
    page, locked = _entry(ex, seq, lc, o)
    for _ in ex.when(ops.ne(page, NONE)):
        for _ in ex.when(locked):
            ex.do("unlock", page=page, seq=seq, lc=lc, ordinal=o)
        uncommitted = ops.not_(ops.lookup(ex.s.committed, page, True))
        ex.do("release_holder", page=page, seq=seq, lc=lc, ordinal=o)
        for _ in ex.when(uncommitted):
            ex.do("release", page=page)


def drain_pockets(ex: Executor, seq: int) -> None:
    for lc in _pocket_lcs(ex):
        for _ in range(ex.lay.pocket_cap):
            for _ in ex.when(ex.ops.lt(0, pocket_size(ex.ops, ex.lay, ex.s, seq, lc))):
                ex.do("drain", seq=seq, lc=lc, k=0)


def _pocket_lcs(ex: Executor) -> list[int]:
    cfg = ex.lay.cfg
    if not cfg.pocket.enabled:
        return []
    return [i for i, lc in enumerate(cfg.life_cycles) if lc.is_swa]


def _require_seq(ex: Executor, seq: int) -> None:
    if not 0 <= seq < ex.lay.seqs:
        raise UnknownSequenceError(f"sequence {seq} does not exist (0..{ex.lay.seqs - 1})")


def _require_status(ex: Executor, seq: int, allowed: tuple[SeqStatus, ...], op: str) -> None:
    _require_seq(ex, seq)
    st = ex.s.seq_status[seq]
    ex.require(ex.ops.ne(st, int(SeqStatus.FREE)),
               UnknownSequenceError(f"{op}: sequence {seq} was never created"))
    ok = ex.ops.or_(*(ex.ops.eq(st, int(a)) for a in allowed))
    if ok is True:  # plain values, allowed: `require` would do nothing (no message to build)
        return
    names = " or ".join(a.name for a in allowed)
    shown = SeqStatus(st).name if isinstance(st, int) else "its status"
    ex.require(ok, SequenceStateError(f"{op}: sequence {seq} is {shown}, must be {names}"))


# ---- API actions ---------------------------------------------------------------------------


def resize(ex: Executor, seq: int, capacity: int, history: int) -> None:
    """Grow or shrink to `capacity` tokens and advance the window to `history`."""
    ops, lay, cfg = ex.ops, ex.lay, ex.lay.cfg
    _require_status(ex, seq, (SeqStatus.ACTIVE,), "resize")
    old_cap, old_h = ex.s.capacity[seq], ex.s.history[seq]
    ex.require(ops.and_(ops.le(0, capacity), ops.le(0, history)), CapacityError(
        f"resize: capacity {capacity} and history_length {history} must be non-negative"))
    ex.require(ops.le(old_h, history), HistoryDecreaseError(
        f"resize: history_length {history} is below the current {old_h}"))
    ex.require(ops.le(history, capacity), CapacityError(
        f"resize: capacity {capacity} is below history_length {history}"))
    ex.require(ops.le(capacity, cfg.max_capacity), CapacityError(
        f"resize: capacity {capacity} exceeds max_blocks * tokens_per_block = {cfg.max_capacity}"))
    ex.do("set_lengths", seq=seq, capacity=capacity, history=history,
          committed=ex.s.committed_tokens[seq])
    (leaving, shrinking, growing), (left, shrunk, block_major) = _resize_blocks(
        ex, old_cap, capacity, old_h, history)

    # Phase 1: blocks that just left the window are unlocked (their holders stay, like
    # upstream's backup_holders, until the growth below has succeeded).
    for lc, o in left:
        page, locked = _entry(ex, seq, lc, o)
        for _ in ex.when(ops.and_(leaving[lc, o], locked)):
            ex.do("unlock", page=page, seq=seq, lc=lc, ordinal=o)
    # Phase 2: shrink, last block first.
    for lc, o in shrunk:
        for _ in ex.when(shrinking[lc, o]):
            release_block(ex, seq, lc, o)

    # Phase 3: grow. New in-window blocks first take parked slots, then the allocator.
    def needs_page(lc: int, o: int) -> Term:
        page, _ = _entry(ex, seq, lc, o)
        return ops.and_(growing[lc, o], ops.eq(page, NONE))

    pocket_lcs = _pocket_lcs(ex)
    for lc, o in block_major:  # block by block, life cycle within block (as upstream)
        if lc in pocket_lcs:
            for _ in range(lay.pocket_cap):
                nonempty = ops.lt(0, pocket_size(ops, lay, ex.s, seq, lc))
                for _ in ex.when(ops.and_(needs_page(lc, o), nonempty)):
                    pop_or_refuse(ex, seq, lc, o)
    for pg in range(cfg.num_pool_groups):  # one eviction round per pool group
        need = ops.count([needs_page(lc, o) for lc, o in block_major if cfg.pool_group_of(lc) == pg])
        for _ in ex.when(ops.lt(0, need)):
            make_room(ex, GPU_LEVEL, pg, need)
    for lc, o in block_major:
        for _ in ex.when(needs_page(lc, o)):
            allocate_block(ex, seq, lc, o)
    # Phase 4: resolve the blocks that left the window: committed pages stay only in the
    # radix tree; uncommitted ones are kept for committing, parked, or released.
    allowed = ops.eq(ex.s.commit_state[seq], int(CommitState.ALLOWED))
    for lc, o in left:
        page, locked = _entry(ex, seq, lc, o)
        held = ops.and_(leaving[lc, o], ops.ne(page, NONE), ops.not_(locked))
        committed = ops.lookup(ex.s.committed, page, False)
        for _ in ex.when(ops.and_(held, committed)):
            ex.do("release_holder", page=page, seq=seq, lc=lc, ordinal=o)
        for _ in ex.when(ops.and_(held, ops.not_(committed), ops.not_(allowed))):
            park_or_release(ex, seq, lc, o, page)


Blocks = dict[tuple[int, int], Term]  # a condition per (life cycle, ordinal)
Visits = list[tuple[int, int]]  # (life cycle, ordinal) in the order a phase visits them


def _resize_blocks(ex: Executor, old_cap: Term, capacity: Term, old_h: Term, history: Term,
                   remember: bool = True
                   ) -> tuple[tuple[Blocks, Blocks, Blocks], tuple[Visits, Visits, Visits]]:
    """Which blocks of a resize leave the window, shrink away or grow (`resize`'s phases),
    and the blocks each phase visits, in its order: those leaving; those shrinking, last
    block first per life cycle; those growing, block by block, life cycle within block.

    It depends on the lengths only, not on the state the phases change: decided once per
    block. On plain values a block whose condition is False is skipped (its `ex.when`
    would not run); on Z3 terms nothing is skipped, so both readers take the same program.
    On plain values without overrides the answer is remembered per layout and lengths
    (a resize per decoded token would otherwise re-derive it for every block);
    `remember=False` derives it by the rule alone, over every block (what the speed check
    `speedcheck.resize_memo` compares the remembered answers with)."""
    ops, lay = ex.ops, ex.lay
    memo: dict[tuple[Term, ...], tuple[tuple[Blocks, Blocks, Blocks],
                                       tuple[Visits, Visits, Visits]]] | None = None
    if remember and not ops.symbolic and not any_override():
        memo = lay.memo.setdefault("resize_blocks", {})
        found = memo.get((old_cap, capacity, old_h, history))
        if found is not None:
            return found
    swa = [i for i, lc in enumerate(lay.cfg.life_cycles) if lc.is_swa]
    lcs, blocks = range(lay.lcs), range(lay.blocks)
    leave_at = dict.fromkeys(swa, blocks)
    shrink_at, grow_at = blocks, blocks
    if memo is not None and old_h <= history:
        # Plain values: only the blocks between the old and the new lengths can change
        # sides, read off the window rule's closed form (`config.stale_range`, tested to
        # agree with it); each is still decided by the rule below. A decode step of a long
        # sequence then costs the blocks it moves, not the declared `max_blocks`.
        t = lay.cfg.tokens_per_block
        had, has = (min(lay.blocks, num_blocks_for(c, t)) for c in (old_cap, capacity))
        shrink_at, grow_at = range(has, had), range(had, has)
        for lc in swa:
            life = lay.cfg.life_cycles[lc]
            start, end = stale_range(life, history, t)
            leave_at[lc] = range(max(start, stale_range(life, old_h, t)[1]), min(end, had))

    def was_in(o: int) -> Term:
        return _in_cap(ex, o, old_cap)

    leaving = {(lc, o): ops.and_(was_in(o), ops.not_(_stale(ex, lc, o, old_h)),
                                 _stale(ex, lc, o, history))
               for lc in swa for o in leave_at[lc]}
    shrinking = {(lc, o): ops.and_(was_in(o), ops.not_(_in_cap(ex, o, capacity)))
                 for lc in lcs for o in shrink_at}
    growing = {(lc, o): ops.and_(ops.not_(was_in(o)), _in_cap(ex, o, capacity),
                                 ops.not_(_stale(ex, lc, o, history)))
               for lc in lcs for o in grow_at}

    def maybe(cond: Blocks, keys: Iterable[tuple[int, int]]) -> Visits:
        return [k for k in keys if cond[k] is not False]

    answer = ((leaving, shrinking, growing), (
        maybe(leaving, leaving),
        maybe(shrinking, [(lc, o) for lc in lcs for o in reversed(shrink_at)]),
        maybe(growing, [(lc, o) for o in grow_at for lc in lcs])))
    if memo is not None:
        if len(memo) >= _RESIZE_MEMO_SIZE:
            memo.clear()
        memo[old_cap, capacity, old_h, history] = answer
    return answer


_RESIZE_MEMO_SIZE = 4096  # remembered lengths per layout (the answers are read, never changed)


def pop_or_refuse(ex: Executor, seq: int, lc: int, o: int) -> None:
    """Serve block o from the pocket; under `revalidate` a moved page is refused (drained)."""
    ops, lay = ex.ops, ex.lay
    positions = [lay.pocket_ix(ops, seq, lc, j) for j in range(lay.pocket_cap)]
    oldest_only = lru(lay)  # the `lru` profile pops the oldest entry; safety: any entry
    k = ex.choose("pocket", range(lay.pocket_cap),
                  lambda j: ops.and_(ops.ne(ex.s.pocket[positions[j]], NONE),
                                     ops.const(j == 0 or not oldest_only)),
                  lambda j: _where(ex, ex.s.pocket[positions[j]]))
    page = ops.lookup(ex.s.pocket, lay.pocket_ix(ops, seq, lc, k), NONE)
    if lay.cfg.pocket.policy != PocketPolicy.REVALIDATE:
        ex.do("pop", seq=seq, lc=lc, k=k, ordinal=o)
        return
    valid = named(ops, STILL_VALID, still_valid(ops, ex.s, page))
    for _ in ex.when(valid):
        ex.do("pop", seq=seq, lc=lc, k=k, ordinal=o)
    for _ in ex.when(ops.not_(valid)):
        ex.do("drain", seq=seq, lc=lc, k=k)


def park_or_release(ex: Executor, seq: int, lc: int, o: int, page: Term) -> None:
    ops, lay = ex.ops, ex.lay
    eligible = ops.const(False)
    if lc in _pocket_lcs(ex):
        eligible = ops.and_(
            ops.eq(ops.lookup(ex.s.level, page, -1), GPU_LEVEL),
            ops.ne(ops.lookup(ex.s.slot, page, -1), -1),
            named(ops, POCKET_NOT_FULL, ops.lt(pocket_size(ops, lay, ex.s, seq, lc), lay.pocket_cap)),
        )
    for _ in ex.when(eligible):
        ex.do("park", page=page, seq=seq, lc=lc, ordinal=o)
    for _ in ex.when(ops.not_(eligible)):
        ex.do("release_holder", page=page, seq=seq, lc=lc, ordinal=o)
        ex.do("release", page=page)


CLASH_LABELS = ("stop", "cache")  # stop committing / cache the block again


def _caches_again(ex: Executor) -> bool:
    """A newly full block's key is already committed (its content was computed twice).
    Stopping committing (TensorRT-LLM; kvpocket's own `lru` profile, where it is the only
    option) and caching the block a second time under the same key (vLLM, which never
    deduplicates so that block tables stay append-only) are both safe: under the safety
    spec it is the manager's choice, labelled "stop" or "cache"."""
    if lru(ex.lay):
        return False
    return bool(ex.choose(CLASH, range(2), lambda j: True, CLASH_LABELS.__getitem__) == 1)


def commit(ex: Executor, seq: int, tokens: tuple[int, ...]) -> None:
    """Commit tokens; every newly full block's pages become committed under its prefix key.

    Concrete-only (block keys intern token content). If a committed block with the same
    key exists, committing stops (USER_STOP) instead of rebasing onto it, or (safety
    spec, the manager's `clash` choice) the block is cached a second time.
    """
    ops, lay, cfg = ex.ops, ex.lay, ex.lay.cfg
    t = cfg.tokens_per_block
    _require_status(ex, seq, (SeqStatus.ACTIVE,), "commit")
    ex.require(ops.eq(ex.s.commit_state[seq], int(CommitState.ALLOWED)),
               CommitError(f"commit: sequence {seq} has stopped committing"))
    old_c = int(ex.s.committed_tokens[seq])
    new_c = old_c + len(tokens)
    ex.require(new_c <= int(ex.s.capacity[seq]), CapacityError(
        f"commit: {new_c} committed tokens would exceed capacity {ex.s.capacity[seq]}"))
    all_tokens = ex.s.tokens[seq] + tuple(tokens)
    keys = key_table(lay, ex.s.block_keys)  # interned prefixes, looked up by hashing
    stopped = False
    committed_blocks: list[int] = []
    for o in range(old_c // t, new_c // t):
        key = keys.intern(all_tokens[: (o + 1) * t])
        clash = any(ex.s.alive[q] and ex.s.committed[q] for q in pages_with_key(lay, ex.s, key))
        if clash and not _caches_again(ex):
            stopped = True
            break
        for lc in range(lay.lcs):
            page, _ = _entry(ex, seq, lc, o)
            if page != NONE and not ex.s.committed[page]:
                ex.do("commit_page", page=page, key=key)
        committed_blocks.append(o)
    ex.s = _with_tokens(ex, seq, all_tokens, keys.keys(lay))
    if new_c > int(ex.s.history[seq]):  # history follows the committed tokens
        resize(ex, seq, int(ex.s.capacity[seq]), new_c)
    ex.do("set_lengths", seq=seq, capacity=ex.s.capacity[seq], history=ex.s.history[seq],
          committed=new_c)
    for o in committed_blocks:  # a block committed while already stale stays only in the tree
        for lc in range(lay.lcs):
            page, locked = _entry(ex, seq, lc, o)
            if page != NONE and not locked and _stale(ex, lc, o, ex.s.history[seq]):
                ex.do("release_holder", page=page, seq=seq, lc=lc, ordinal=o)
    if stopped:
        stop_committing(ex, seq)


def _with_tokens(ex: Executor, seq: int, tokens: tuple[int, ...],
                 keys: tuple[tuple[int, ...], ...]) -> State:
    per_seq = list(ex.s.tokens)
    per_seq[seq] = tokens
    return evolve(ex.s, tokens=tuple(per_seq), block_keys=keys)


def stop_committing(ex: Executor, seq: int) -> None:
    """Stop committing; blocks kept only for committing are released."""
    ops = ex.ops
    _require_status(ex, seq, (SeqStatus.ACTIVE, SeqStatus.SUSPENDED), "stop_committing")
    ex.do("set_commit_state", seq=seq, commit_state=int(CommitState.USER_STOP))
    for lc, o in _blocks_of(ex, seq):
        page, locked = _entry(ex, seq, lc, o)
        kept = ops.and_(
            _stale(ex, lc, o, ex.s.history[seq]), ops.ne(page, NONE), ops.not_(locked),
            ops.not_(ops.lookup(ex.s.committed, page, True)),
        )
        for _ in ex.when(kept):
            ex.do("release_holder", page=page, seq=seq, lc=lc, ordinal=o)
            ex.do("release", page=page)


def suspend(ex: Executor, seq: int) -> None:
    """Drain the pocket; every lock becomes a holder (evictable); SUSPENDED."""
    _require_status(ex, seq, (SeqStatus.ACTIVE,), "suspend")
    drain_pockets(ex, seq)
    for lc, o in _blocks_of(ex, seq):
        page, locked = _entry(ex, seq, lc, o)
        for _ in ex.when(locked):
            ex.do("unlock", page=page, seq=seq, lc=lc, ordinal=o)
    ex.do("set_status", seq=seq, status=int(SeqStatus.SUSPENDED))


def _blocks_of(ex: Executor, seq: int, order: Callable[[tuple[int, int]], tuple[int, int]]
               | None = None) -> list[tuple[int, int]]:
    """The blocks (life cycle, ordinal) of `seq` a pass over them visits, life cycle by life
    cycle (or sorted by `order`): every block on terms; on plain values only those whose
    entry holds a page or a lock now. A pass whose every `ex.when` needs the entry's page
    or lock, and that gives no entry a page, skips nothing else by visiting only these (as
    `_resize_blocks` skips the blocks whose condition is False), and costs the blocks the
    sequence holds rather than the declared `max_blocks`."""
    lay = ex.lay
    if ex.ops.symbolic:
        blocks = [(lc, o) for lc in range(lay.lcs) for o in range(lay.blocks)]
    else:
        positions = lay.entry_range(seq)
        used = set(used_in(ex.s.entry, NONE, positions))
        used.update(used_in(ex.s.entry_locked, False, positions))
        blocks = [divmod(e - positions.start, lay.blocks) for e in sorted(used)]
    return blocks if order is None else sorted(blocks, key=order)


def resume(ex: Executor, seq: int) -> None:
    """Bring every in-window page back to GPU and lock it; all or nothing."""
    ops, lay = ex.ops, ex.lay
    _require_status(ex, seq, (SeqStatus.SUSPENDED,), "resume")
    h = ex.s.history[seq]
    targets = _blocks_of(ex, seq)
    in_window = {(lc, o): ops.not_(_stale(ex, lc, o, h)) for lc, o in targets}

    def target(lc: int, o: int) -> tuple[Term, Term]:
        page, _ = _entry(ex, seq, lc, o)
        return page, ops.and_(ops.ne(page, NONE), in_window[lc, o])

    for lc, o in targets:  # pin first: making room never evicts our pages
        page, is_target = target(lc, o)
        for _ in ex.when(ops.and_(is_target, ops.lookup(ex.s.queued, page, False))):
            ex.do("exclude", page=page)
    def below(lc: int, o: int) -> Term:
        page, is_target = target(lc, o)
        return ops.and_(is_target, ops.lt(GPU_LEVEL, ops.lookup(ex.s.level, page, 0)))

    for pg in range(lay.cfg.num_pool_groups):  # one eviction round per pool group
        need = ops.count([below(lc, o) for lc, o in targets
                          if lay.cfg.pool_group_of(lc) == pg])
        for _ in ex.when(ops.lt(0, need)):
            make_room(ex, GPU_LEVEL, pg, need)
    for lc, o in targets:
        page, _ = target(lc, o)
        for _ in ex.when(below(lc, o)):
            migrate(ex, page, GPU_LEVEL, lay.cfg.pool_group_of(lc))
    ex.do("set_status", seq=seq, status=int(SeqStatus.ACTIVE))
    for lc, o in targets:
        page, is_target = target(lc, o)
        for _ in ex.when(is_target):
            ex.do("lock", page=page, seq=seq, lc=lc, ordinal=o)


def close(ex: Executor, seq: int) -> None:
    """Drain the pocket and release every block, last to first; CLOSED. Idempotent."""
    _require_seq(ex, seq)
    ops = ex.ops
    live = ops.or_(ops.eq(ex.s.seq_status[seq], int(SeqStatus.ACTIVE)),
                   ops.eq(ex.s.seq_status[seq], int(SeqStatus.SUSPENDED)))
    ex.require(ops.ne(ex.s.seq_status[seq], int(SeqStatus.FREE)),
               UnknownSequenceError(f"close: sequence {seq} was never created"))
    for _ in ex.when(live):
        ex.do("set_commit_state", seq=seq, commit_state=int(CommitState.USER_STOP))
        drain_pockets(ex, seq)
        for lc, o in _blocks_of(ex, seq, order=lambda b: (-b[1], b[0])):  # last block first
            release_block(ex, seq, lc, o)
        ex.do("set_status", seq=seq, status=int(SeqStatus.CLOSED))


def _copies_of(ex: Executor, key: int) -> list[list[int]]:
    """Per life cycle, the committed pages of one block key, ascending (more than one only
    when a manager cached a block again on a `clash`); none for NONE (never interned)."""
    s = ex.s
    out: list[list[int]] = [[] for _ in range(ex.lay.lcs)]
    if key != NONE:
        for q in pages_with_key(ex.lay, s, key):
            if s.alive[q] and s.committed[q]:
                out[int(s.lc[q])].append(q)
    return out


def _any_copy(ex: Executor) -> bool:
    """Some live page is committed (under any key)."""
    s = ex.s
    return any(s.alive[q] for q in page_ids(ex.ops, ex.lay, s, s.committed))


def _reused_copy(ex: Executor, copies: list[int]) -> int:
    """The copy a prefix match reuses: any is safe, so with more than one it is the
    manager's `hit` choice, labelled by where the copy sits."""
    if len(copies) == 1:
        return copies[0]
    return int(ex.choose(HIT, range(ex.lay.pages), copies.__contains__,
                         lambda p: _where(ex, p), among=lambda: copies))


def _reused_blocks(ex: Executor, found: list[list[list[int]]], full: int) -> int:
    """How many whole blocks of the prompt `create` reuses, under the safety spec: any k
    such that every block a life cycle still reads at history k·t has a committed copy
    (a sliding window does not read the blocks before it, which may be gone). The
    manager's `reuse` choice, labelled by the tokens reused; the first option is the
    longest prefix whose every block is cached (`full`, the `lru` profile's rule), and
    with no other option there is no choice."""
    t, lcs = ex.lay.cfg.tokens_per_block, range(ex.lay.lcs)
    # a life cycle without a window reads every block: no k past its first missing one
    most = min([len(found), *(next((o for o in range(len(found)) if not found[o][lc]),
                                   len(found))
                              for lc in lcs if ex.lay.cfg.life_cycles[lc].window is None)])

    def reads_cached(k: int) -> bool:
        return all(found[o][lc] or _stale(ex, lc, o, k * t) for o in range(k) for lc in lcs)

    options = [full, *(k for k in range(most + 1) if k != full and reads_cached(k))]
    if len(options) == 1:
        return full
    return options[int(ex.choose(REUSE, range(len(options)), lambda j: True,
                                 lambda j: options[j] * t))]


def create(ex: Executor, seq: int, prompt: tuple[int, ...]) -> None:
    """Create a SUSPENDED sequence, reusing a cached prefix of `prompt`: the longest whose
    every block is committed, or (safety spec, the manager's `reuse` choice) any prefix
    whose blocks in every window are.

    Concrete-only in its prefix match (it reads token content).
    """
    ops, lay, cfg = ex.ops, ex.lay, ex.lay.cfg
    t = cfg.tokens_per_block
    _require_seq(ex, seq)
    free = ops.or_(ops.eq(ex.s.seq_status[seq], int(SeqStatus.FREE)),
                   ops.eq(ex.s.seq_status[seq], int(SeqStatus.CLOSED)))
    ex.require(free, SequenceStateError(f"create: sequence {seq} is in use"))
    keys = key_table(lay, ex.s.block_keys)
    most = min(len(prompt) // t, lay.blocks)
    prompt_keys = [keys.find(tuple(prompt[: (o + 1) * t])) for o in range(most)]
    # per block and life cycle, the committed copies of the prompt's block (no key was
    # ever committed: no page is read, as in the symbolic engines, which have no content)
    interned = any(k != NONE for k in prompt_keys)
    found = [_copies_of(ex, key) for key in prompt_keys]
    full = next((o for o in range(most) if not all(found[o])), most)
    # the manager's choice only when some page is committed at all and a prompt key interned
    copies = interned and (any(pages for row in found for pages in row) or _any_copy(ex))
    k = full if lru(lay) or not copies else _reused_blocks(ex, found, full)
    m = k * t
    ex.do("set_commit_state", seq=seq, commit_state=int(CommitState.ALLOWED))
    ex.do("set_lengths", seq=seq, capacity=m, history=m, committed=m)
    ex.s = _with_tokens(ex, seq, tuple(prompt[:m]), ex.s.block_keys)
    for o in range(k):
        for lc, pages in enumerate(found[o]):
            for _ in ex.when(ops.not_(_stale(ex, lc, o, m))):
                ex.do("hold", page=_reused_copy(ex, pages), seq=seq, lc=lc, ordinal=o)
    ex.do("set_status", seq=seq, status=int(SeqStatus.SUSPENDED))


# ---- environment actions -------------------------------------------------------------------


def pressure(ex: Executor, level: int, pool_group: int, slots: int) -> None:
    """Another tenant needs `slots` free slots at `level`: the cascade makes room."""
    cfg = ex.lay.cfg
    if not 0 <= level < cfg.num_levels or not 0 <= pool_group < cfg.num_pool_groups:
        raise CapacityError(f"pressure: no level {level} / pool group {pool_group}")
    ex.require(0 <= slots <= ex.lay.slots_at(level), CapacityError(
        f"pressure: slots must be in [0, {ex.lay.slots_at(level)}], got {slots}"))
    make_room(ex, level, pool_group, slots)


def advance(ex: Executor, stream: int) -> None:
    """A stream's outstanding GPU work completes (stream num_sequences is the copy stream)."""
    ex.require(0 <= stream <= ex.lay.seqs, UnknownSequenceError(
        f"advance: stream must be in [0, {ex.lay.seqs}], got {stream}"))
    busy = any_equal(ex.ops, ex.s.slot_busy, stream)
    for _ in ex.when(busy):
        ex.do("complete", stream=stream)


def fail_allocation(ex: Executor) -> None:
    """The next slot allocation fails (OutOfPages); the enclosing action rolls back."""
    ex.s = evolve(ex.s, fault_alloc=True)


def fail_copy(ex: Executor) -> None:
    """The next migration copy fails; the enclosing action rolls back."""
    ex.s = evolve(ex.s, fault_copy=True)


# ---- the API table ----------------------------------------------------------------------
#
# One record per API or environment action. Every engine derives its alphabet from it:
# the executable model (`Model.run`), the lockstep and its Hypothesis rules, BMC's
# instances, trace and event-log parsing, the trace checker and the spec's tables.

PARAM_KINDS: dict[str, str] = {
    "seq": "a sequence slot, 0 <= seq < num_sequences",
    "tokens": "a list of token ids (ints)",
    "length": "a token count, 0 <= n <= max_blocks * tokens_per_block",
    "level": "a cache level, 0 (GPU) <= level < num_levels",
    "pool_group": "a pool group, 0 <= pool_group < num_pool_groups",
    "slots": "a slot count, 0 <= slots <= the slots of the level",
    "stream": "a stream: a sequence slot, or num_sequences for the copy stream",
    "count": "a number of tokens: the sequence's next n (the lockstep's form of commit)",
}


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # a PARAM_KINDS key: what values it takes, for parsers and generators


@dataclass(frozen=True)
class ApiAction:
    name: str
    layer: str  # "api" (an integrator's call) or "env" (background work and faults)
    params: tuple[Param, ...]  # in the program's argument order
    program: Callable[..., None]  # program(ex, *args) over page actions
    returns_bool: bool  # True, or False when OutOfPages rolled it back; else None
    errors: tuple[str, ...]  # usage-error categories it may raise (state unchanged)
    precondition: str
    concrete_only: bool = False  # reads token content: not part of the symbolic alphabet

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def doc(self) -> str:
        return " ".join((self.program.__doc__ or "").split())

    @property
    def returns(self) -> str:
        return "bool (False: OutOfPages, nothing changed)" if self.returns_bool else "None"


_SEQ = Param("seq", "seq")
_SEQ_ERRORS = ("unknown_sequence", "sequence_state")

API: dict[str, ApiAction] = {a.name: a for a in (
    ApiAction("create", "api", (_SEQ, Param("prompt", "tokens")), create, False,
              _SEQ_ERRORS, "sequence is FREE or CLOSED"),
    ApiAction("resume", "api", (_SEQ,), resume, True, _SEQ_ERRORS, "sequence is SUSPENDED"),
    ApiAction("resize", "api", (_SEQ, Param("capacity", "length"), Param("history", "length")),
              resize, True, (*_SEQ_ERRORS, "history_decrease", "capacity"),
              "sequence is ACTIVE; history >= current history; history <= capacity <= max"),
    ApiAction("commit", "api", (_SEQ, Param("tokens", "tokens")), commit, False,
              (*_SEQ_ERRORS, "commit", "capacity"),
              "sequence is ACTIVE and ALLOWED; committed + len(tokens) <= capacity",
              concrete_only=True),
    ApiAction("stop_committing", "api", (_SEQ,), stop_committing, False, _SEQ_ERRORS,
              "sequence is ACTIVE or SUSPENDED"),
    ApiAction("suspend", "api", (_SEQ,), suspend, False, _SEQ_ERRORS, "sequence is ACTIVE"),
    ApiAction("close", "api", (_SEQ,), close, False, ("unknown_sequence",),
              "sequence was created"),
    ApiAction("pressure", "env", (Param("level", "level"), Param("pool_group", "pool_group"),
                                  Param("slots", "slots")), pressure, True, ("capacity",),
              "0 <= slots <= slots at level"),
    ApiAction("advance", "env", (Param("stream", "stream"),), advance, False,
              ("unknown_sequence",), "0 <= stream <= num_sequences"),
    ApiAction("fail_allocation", "env", (), fail_allocation, False, (), "always"),
    ApiAction("fail_copy", "env", (), fail_copy, False, (), "always"),
)}
