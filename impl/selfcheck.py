"""Structural invariants of the whole manager, and checks of its speed structures.

`check_invariants` lists violations of the manager's structural invariants (pages,
slots, queues, the radix tree, sequences, reference counts); `check_speed_structures`
recomputes each structure kept for speed only (the lazy eviction heaps, the allocators'
free lists, the radix tree's index, the handles' remembered stale ranges and their
window-change bound) from the primary data it summarises and lists each disagreement,
led by the structure's name. Each check is one named function; `INVARIANT_CHECKS` and
`SPEED_CHECKS` list them (docs/campaigns.md has the table).

Meant to run between API calls (never inside one). An empty list means the state is
consistent. The `unsafe` pocket policy is expected to break some of the invariants
(slot aliasing, a leaked host slot, a GPU page on a slot the GPU allocator considers
free).

Takes a `ManagerView` (`view.py`): `manager.py` imports this module, not the reverse.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvpocket.model.config import (
    BAD_PAGE_INDEX,
    GPU_LEVEL,
    CommitState,
    LifeCycle,
    PageStatus,
    SeqStatus,
)

from . import window
from .radix import ROOT

if TYPE_CHECKING:
    from .view import ManagerView

Check = Callable[["ManagerView"], list[str]]


# ---- structural invariants -------------------------------------------------------------
def page_records(mgr: ManagerView) -> list[str]:
    """Every registered page is alive, sits in a slot its allocator has occupied (or is a
    dropped parked page), has a status its level allows, and a committed one is linked
    from its radix-tree node."""
    st, cfg = mgr.storage, mgr.cfg
    bad: list[str] = []
    for p in st.pages.values():
        where = f"page {p.pid}"
        if not p.alive:
            bad.append(f"{where}: registered but dead")
        if not p.has_slot:
            # Only a parked page dropped by the cascade (evict_parked=drop) lives slotless,
            # at GPU, unqueued, until its pocket entry is popped (refused) or drained.
            if not (p.pocket_owner is not None and cfg.pocket.drops_parked
                    and p.level == GPU_LEVEL):
                bad.append(f"{where}: live page without a slot")
            continue
        if p.slot not in st.allocs[p.level][p.group].occupied:
            bad.append(f"{where}: slot {p.slot} at level {p.level} is not occupied in its "
                       f"allocator (free or out of range)")
        if p.status is PageStatus.LOCKED and p.level != GPU_LEVEL:
            bad.append(f"{where}: LOCKED but at level {p.level}")
        if p.status is PageStatus.DROPPABLE and not p.committed:
            bad.append(f"{where}: DROPPABLE uncommitted page is alive")
        if p.committed:
            node = st.tree.nodes.get(p.node) if p.node is not None else None
            if node is None or node.pages[p.lc] != p.pid:
                bad.append(f"{where}: committed but not linked from its radix-tree node")
    return bad


def queue_membership(mgr: ManagerView) -> list[str]:
    """A page is queued exactly at its level iff it is evictable; every queued page is
    alive and at the queue's level."""
    st = mgr.storage
    bad: list[str] = []
    for p in st.pages.values():
        where = f"page {p.pid}"
        queued_at = [lv for lv, qs in enumerate(st.queues) if p.pid in qs[p.group]]
        if not p.has_slot:
            if queued_at and p.pocket_owner is not None:
                bad.append(f"{where}: dropped parked page (no slot) is queued")
            continue
        want = st.evictable(p)
        if want and queued_at != [p.level]:
            bad.append(f"{where}: evictable at level {p.level} but queued at {queued_at}")
        if not want and queued_at:
            bad.append(f"{where}: not evictable but queued at {queued_at}")
    for level, queues in enumerate(st.queues):
        for g, q in enumerate(queues):
            for pid in q.entries:
                qp = st.pages.get(pid)
                if qp is None or qp.level != level:
                    bad.append(f"queue L{level} pg {g}: page {pid} is dead or elsewhere")
    return bad


def _slot_owners(mgr: ManagerView) -> dict[tuple[int, int, int], list[int]]:
    owners: dict[tuple[int, int, int], list[int]] = {}
    for p in mgr.storage.pages.values():
        if p.has_slot:
            owners.setdefault((p.level, p.group, p.slot), []).append(p.pid)
    return owners


def slot_ownership(mgr: ManagerView) -> list[str]:
    """No two pages share a slot, and every occupied slot belongs to a page."""
    owners = _slot_owners(mgr)
    bad = [f"slot aliasing: pages {pids} share (level, pool group, slot) {key}"
           for key, pids in owners.items() if len(pids) > 1]
    for level, allocs in enumerate(mgr.storage.allocs):
        for g, a in enumerate(allocs):
            for s in a.occupied:
                if (level, g, s) not in owners:
                    bad.append(f"leaked slot: level {level} pg {g} slot {s} is occupied "
                               f"by no page")
    return bad


def allocator_counts(mgr: ManagerView) -> list[str]:
    """Each allocator's free and occupied slots partition its capacity, and `num_free`
    counts the free ones."""
    bad: list[str] = []
    for level, allocs in enumerate(mgr.storage.allocs):
        for g, a in enumerate(allocs):
            free = set(a.recycled) | set(range(a.next_fresh, a.capacity))
            if free & a.occupied:
                bad.append(f"level {level} pg {g}: slots both free and occupied "
                           f"{sorted(free & a.occupied)}")
            if len(free) + len(a.occupied) != a.capacity or len(free) != a.num_free:
                bad.append(f"level {level} pg {g}: free + occupied != capacity")
    return bad


def radix_counts(mgr: ManagerView) -> list[str]:
    """The radix tree's counters kept incrementally (children, references by live
    sequences) against a recount, no node left that pruning should have removed (a
    leak) or removed too early, and every node's pages its own."""
    st = mgr.storage
    bad: list[str] = []
    children: Counter[int] = Counter(n.parent for n in st.tree.nodes.values())
    refs: Counter[int] = Counter(nid for kv in mgr.seqs.values()
                                 if kv.status is not SeqStatus.CLOSED for nid in kv.tree_nodes)
    for n in st.tree.nodes.values():
        if n.children != children[n.nid] or n.refs != refs[n.nid]:
            bad.append(f"tree node {n.nid}: children/refs {n.children}/{n.refs} but the tree "
                       f"and the live sequences say {children[n.nid]}/{refs[n.nid]}")
        if not (n.children or n.refs or n.has_page()):
            bad.append(f"tree node {n.nid}: no page, child or reference, yet not pruned")
        if n.parent != ROOT and n.parent not in st.tree.nodes:
            bad.append(f"tree node {n.nid}: its parent {n.parent} was pruned")
    for n in st.tree.nodes.values():
        for lc, tpid in enumerate(n.pages):
            if tpid is not None and (tpid not in st.pages or st.pages[tpid].node != n.nid):
                bad.append(f"tree node {n.nid} lc {lc}: page {tpid} is dead or not its own")
    return bad


def sequence_entries(mgr: ManagerView) -> list[str]:
    """Every sequence's lengths, radix-tree nodes, pocket and block entries (locked in the
    window, held out of it, index rows matching the locked pages' GPU slots)."""
    st, cfg = mgr.storage, mgr.cfg
    bad: list[str] = []
    t = cfg.tokens_per_block
    for sid, kv in mgr.seqs.items():
        w = f"seq {sid}"
        if kv.status is SeqStatus.CLOSED:
            # A closed sequence keeps nothing: one pass over its rows, not a block loop
            # (the lockstep opens a new sequence per create, so closed ones pile up).
            if (kv.tree_nodes or any(kv.pocket)
                    or any(p is not None for row in kv.pages for p in row)
                    or bool((kv.index != BAD_PAGE_INDEX).any())):
                bad.append(f"{w}: CLOSED but still holds entries, index rows, tree nodes "
                           "or parked pages")
            continue
        if not len(kv.committed) <= kv.history <= kv.capacity:
            bad.append(f"{w}: committed {len(kv.committed)} <= history {kv.history} <= "
                       f"capacity {kv.capacity} violated")
        if kv.num_blocks != -(-kv.capacity // t):
            bad.append(f"{w}: {kv.num_blocks} blocks for capacity {kv.capacity}")
        for nid in kv.tree_nodes:  # a live sequence's committed blocks outlive their pages
            if nid not in st.tree.nodes:
                bad.append(f"{w}: radix-tree node {nid} of a committed block was pruned")
        for lc, pocket in enumerate(kv.pocket):
            for p in pocket:
                if p.pocket_owner != sid or p.committed or not p.alive:
                    bad.append(f"{w}: pocket lc {lc} page {p.pid} is not a live parked page")
            if pocket and kv.status is not SeqStatus.ACTIVE:
                bad.append(f"{w}: {kv.status.name} with a non-empty pocket")
        for lc, lcfg in enumerate(cfg.life_cycles):
            s, e = window.out_of_window(lcfg, kv.history, t)
            index = kv.index[lc].tolist()  # one conversion, not one NumPy scalar per block
            pages, locked_row = kv.pages[lc], kv.locked[lc]
            for b in range(cfg.max_blocks):
                page = pages[b] if b < len(pages) else None
                locked = b < len(locked_row) and locked_row[b]
                idx = index[b]
                if page is None:
                    if idx != BAD_PAGE_INDEX:
                        bad.append(f"{w} lc {lc} block {b}: index {idx} without a page")
                    if (kv.status is SeqStatus.ACTIVE and b < kv.num_blocks
                            and not s <= b < e):
                        bad.append(f"{w} lc {lc} block {b}: in-window block has no page")
                    continue
                if not page.alive:
                    bad.append(f"{w} lc {lc} block {b}: entry on dead page {page.pid}")
                if locked:
                    if idx != page.slot or page.level != GPU_LEVEL:
                        bad.append(f"{w} lc {lc} block {b}: index {idx} != GPU slot of page "
                                   f"{page.pid} (L{page.level}:{page.slot})")
                    if kv.status is not SeqStatus.ACTIVE or s <= b < e:
                        bad.append(f"{w} lc {lc} block {b}: locked while "
                                   f"{kv.status.name} / stale")
                else:
                    if idx != BAD_PAGE_INDEX:
                        bad.append(f"{w} lc {lc} block {b}: held entry has index {idx}")
                    if kv.status is SeqStatus.ACTIVE and not s <= b < e:
                        bad.append(f"{w} lc {lc} block {b}: in-window block only held")
                    if s <= b < e and (page.committed
                                       or kv.commit_state is not CommitState.ALLOWED):
                        bad.append(f"{w} lc {lc} block {b}: stale entry kept although "
                                   f"committed or committing stopped")
    return bad


def page_refcounts(mgr: ManagerView) -> list[str]:
    """Each page's lock and hold counts (kept incrementally) against a recount of the
    block entries and pocket positions that lock or hold it."""
    locks: Counter[int] = Counter()
    holds: Counter[int] = Counter()
    for kv in mgr.seqs.values():
        if kv.status is SeqStatus.CLOSED:
            continue
        for pocket in kv.pocket:
            for p in pocket:
                holds[p.pid] += 1
        for pages, locked_row in zip(kv.pages, kv.locked, strict=True):
            for b, page in enumerate(pages):
                if page is not None:
                    (locks if b < len(locked_row) and locked_row[b] else holds)[page.pid] += 1
    return [f"page {p.pid}: locks/holds {p.locks}/{p.holds} but entries say "
            f"{locks[p.pid]}/{holds[p.pid]}"
            for p in mgr.storage.pages.values()
            if p.locks != locks[p.pid] or p.holds != holds[p.pid]]


INVARIANT_CHECKS: tuple[Check, ...] = (
    page_records, queue_membership, slot_ownership, allocator_counts, radix_counts,
    sequence_entries, page_refcounts)


def check_invariants(mgr: ManagerView) -> list[str]:
    """Every structural invariant's violations, check by check (`INVARIANT_CHECKS`)."""
    return [line for check in INVARIANT_CHECKS for line in check(mgr)]


# ---- structures kept for speed, against their plain meaning ----------------------------
def eviction_heap(mgr: ManagerView) -> list[str]:
    """Each eviction queue's lazy-deletion heap: a heap, holding every live entry with its
    (priority, ticket), its garbage within the compaction bound, and its head (after the
    garbage) the queue's first page in order."""
    bad: list[str] = []
    for level, queues in enumerate(mgr.storage.queues):
        for g, q in enumerate(queues):
            where = f"queue L{level} pg {g}"
            heap = list(q.heap_items())
            if any(heap[(i - 1) // 2] > heap[i] for i in range(1, len(heap))):
                bad.append(f"{where}: the heap order is broken")
            stored = {(pid, (p, t)) for p, t, pid in heap}
            missing = sorted(pid for pid, key in q.entries.items() if (pid, key) not in stored)
            if missing:
                bad.append(f"{where}: live entries {missing} are not in the heap")
            bound = q.COMPACT_FACTOR * len(q.entries) + q.COMPACT_SLACK
            if len(heap) > bound:
                bad.append(f"{where}: {len(heap)} heap items, more than the bound {bound} "
                           f"for {len(q.entries)} live entries")
            heapq.heapify(heap)
            head = next((pid for p, t, pid in _popped(heap) if q.entries.get(pid) == (p, t)),
                        None)
            order = q.ordered()
            if head != (order[0] if order else None):
                bad.append(f"{where}: the heap's head is page {head}, the queue's first "
                           f"{order[0] if order else None}")
    return bad


def _popped(heap: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    return [heapq.heappop(heap) for _ in range(len(heap))]


def allocator_free_list(mgr: ManagerView) -> list[str]:
    """Each allocator's free list (recycled slots, FIFO, each with the events of its last
    use) and its fresh-slot counter: the recycled slots are distinct issued slots, each
    with its events, and they and the occupied ones are exactly the slots issued so far."""
    bad: list[str] = []
    for level, allocs in enumerate(mgr.storage.allocs):
        for g, a in enumerate(allocs):
            where = f"allocator L{level} pg {g}"
            recycled = list(a.recycled)
            if len(set(recycled)) != len(recycled):
                bad.append(f"{where}: a slot is listed free twice {recycled}")
            if set(a.events) != set(recycled):
                bad.append(f"{where}: events kept for slots {sorted(a.events)}, recycled "
                           f"{sorted(recycled)}")
            issued = set(range(min(a.next_fresh, a.capacity)))
            if not 0 <= a.next_fresh <= a.capacity or set(recycled) | a.occupied != issued:
                bad.append(f"{where}: recycled {sorted(recycled)} and occupied "
                           f"{sorted(a.occupied)} are not the {a.next_fresh} slots issued")
    return bad


def radix_index(mgr: ManagerView) -> list[str]:
    """The radix tree's (parent, tokens) -> node index against its nodes, and the next
    node id above every node's."""
    tree = mgr.storage.tree
    want = {(n.parent, n.tokens): nid for nid, n in tree.nodes.items()}
    bad: list[str] = []
    if tree.index != want:
        wrong = sorted(set(tree.index.items()) ^ set(want.items()))
        bad.append(f"prefix-tree index differs from its nodes: {wrong[:4]}")
    if any(nid != n.nid or nid >= tree.next_id for nid, n in tree.nodes.items()):
        bad.append(f"prefix-tree node ids not below the next id {tree.next_id}")
    return bad


def _blocks(r: tuple[int, int]) -> range:
    """The blocks of a stale range (every empty range is the same set)."""
    return range(*r) if r[0] < r[1] else range(0)


def _stale_sets(lcs: tuple[LifeCycle, ...], h: int, t: int) -> list[range]:
    return [_blocks(window.out_of_window(lc, h, t)) for lc in lcs]


def stale_range_memo(mgr: ManagerView) -> list[str]:
    """Each open handle's remembered stale ranges equal the window rule at its history
    (as sets of blocks)."""
    lcs, t = mgr.cfg.life_cycles, mgr.cfg.tokens_per_block
    bad: list[str] = []
    for sid, kv in mgr.seqs.items():
        if kv.status is SeqStatus.CLOSED:
            continue
        want = tuple(window.out_of_window(lc, kv.history, t) for lc in lcs)
        if [_blocks(r) for r in kv.remembered_stale_ranges] != _stale_sets(lcs, kv.history, t):
            bad.append(f"seq {sid}: remembers stale ranges {kv.remembered_stale_ranges} at "
                       f"history {kv.history}, the window rule says {want}")
    return bad


def next_change_bound(mgr: ManagerView) -> list[str]:
    """Each open handle's `next_window_change` is above its history, and no stale range
    moves between the history and it (the resize fast path's promise)."""
    cfg = mgr.cfg
    lcs, t = cfg.life_cycles, cfg.tokens_per_block
    bad: list[str] = []
    for sid, kv in mgr.seqs.items():
        if kv.status is SeqStatus.CLOSED:
            continue
        h, bound = kv.history, kv.next_window_change
        if bound <= h:
            bad.append(f"seq {sid}: next window change {bound} is not above history {h}")
            continue
        now = _stale_sets(lcs, h, t)
        moved = next((x for x in range(h + 1, min(bound, cfg.max_capacity + 1))
                      if _stale_sets(lcs, x, t) != now), None)
        if moved is not None:
            bad.append(f"seq {sid}: a stale range moves at history {moved}, below the next "
                       f"window change {bound} (history {h})")
    return bad


SPEED_CHECKS: dict[str, Check] = {
    "eviction heap": eviction_heap,
    "slot free list": allocator_free_list,
    "prefix-tree index": radix_index,
    "remembered stale ranges": stale_range_memo,
    "window-change bound": next_change_bound,
}
# Counters kept incrementally that `check_invariants` already recounts after every step:
# page lock/hold counts (`page_refcounts`), tree child/reference counts (`radix_counts`),
# allocator free counts (`allocator_counts`).


def check_speed_structures(mgr: ManagerView) -> list[str]:
    """Every speed structure's disagreements with its plain meaning, each line led by the
    structure's name (`SPEED_CHECKS`)."""
    return [f"{name}: {line}" for name, check in SPEED_CHECKS.items() for line in check(mgr)]
