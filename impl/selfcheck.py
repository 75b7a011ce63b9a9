"""Structural invariants of the whole manager; `check_invariants` lists violations.

Meant to run between API calls (never inside one). An empty list means the
state is consistent. The `unsafe` pocket policy is expected to break some of
these (slot aliasing, a leaked host slot, a GPU page on a slot the GPU
allocator considers free).

Takes a `ManagerView` (`view.py`): `manager.py` imports this module, not the reverse.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from kvpocket.model.config import (
    BAD_PAGE_INDEX,
    GPU_LEVEL,
    CommitState,
    PageStatus,
    SeqStatus,
    stale_range,
)

from .radix import ROOT

if TYPE_CHECKING:
    from .view import ManagerView


def check_invariants(mgr: ManagerView) -> list[str]:
    st = mgr.storage
    cfg = mgr.cfg
    bad: list[str] = []
    owners: dict[tuple[int, int, int], list[int]] = {}
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
            elif any(p.pid in qs[p.group] for qs in st.queues):
                bad.append(f"{where}: dropped parked page (no slot) is queued")
            continue
        owners.setdefault((p.level, p.group, p.slot), []).append(p.pid)
        a = st.allocs[p.level][p.group]
        if p.slot not in a.occupied:
            bad.append(f"{where}: slot {p.slot} at level {p.level} is not occupied in its "
                       f"allocator (free or out of range)")
        if p.status is PageStatus.LOCKED and p.level != GPU_LEVEL:
            bad.append(f"{where}: LOCKED but at level {p.level}")
        if p.status is PageStatus.DROPPABLE and not p.committed:
            bad.append(f"{where}: DROPPABLE uncommitted page is alive")
        queued_at = [lv for lv, qs in enumerate(st.queues) if p.pid in qs[p.group]]
        want = st.evictable(p)
        if want and queued_at != [p.level]:
            bad.append(f"{where}: evictable at level {p.level} but queued at {queued_at}")
        if not want and queued_at:
            bad.append(f"{where}: not evictable but queued at {queued_at}")
        if p.committed:
            node = st.tree.nodes.get(p.node) if p.node is not None else None
            if node is None or node.pages[p.lc] != p.pid:
                bad.append(f"{where}: committed but not linked from its radix-tree node")
    for key, pids in owners.items():
        if len(pids) > 1:
            bad.append(f"slot aliasing: pages {pids} share (level, pool group, slot) {key}")
    for level, allocs in enumerate(st.allocs):
        for g, a in enumerate(allocs):
            free = set(a.recycled) | set(range(a.next_fresh, a.capacity))
            if free & a.occupied:
                bad.append(f"level {level} pg {g}: slots both free and occupied "
                           f"{sorted(free & a.occupied)}")
            if len(free) + len(a.occupied) != a.capacity or len(free) != a.num_free:
                bad.append(f"level {level} pg {g}: free + occupied != capacity")
            for s in a.occupied:
                if (level, g, s) not in owners:
                    bad.append(f"leaked slot: level {level} pg {g} slot {s} is occupied "
                               f"by no page")
            for pid in st.queues[level][g].entries:
                qp = st.pages.get(pid)
                if qp is None or qp.level != level:
                    bad.append(f"queue L{level} pg {g}: page {pid} is dead or elsewhere")
    # The radix tree's bookkeeping: child counts, references by live sequences, and no
    # node left that pruning should have removed (a leak) or removed too early.
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
    locks: Counter[int] = Counter()
    holds: Counter[int] = Counter()
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
                holds[p.pid] += 1
                if p.pocket_owner != sid or p.committed or not p.alive:
                    bad.append(f"{w}: pocket lc {lc} page {p.pid} is not a live parked page")
            if pocket and kv.status is not SeqStatus.ACTIVE:
                bad.append(f"{w}: {kv.status.name} with a non-empty pocket")
        for lc, lcfg in enumerate(cfg.life_cycles):
            s, e = stale_range(lcfg, kv.history, t)
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
                    locks[page.pid] += 1
                    if idx != page.slot or page.level != GPU_LEVEL:
                        bad.append(f"{w} lc {lc} block {b}: index {idx} != GPU slot of page "
                                   f"{page.pid} (L{page.level}:{page.slot})")
                    if kv.status is not SeqStatus.ACTIVE or s <= b < e:
                        bad.append(f"{w} lc {lc} block {b}: locked while "
                                   f"{kv.status.name} / stale")
                else:
                    holds[page.pid] += 1
                    if idx != BAD_PAGE_INDEX:
                        bad.append(f"{w} lc {lc} block {b}: held entry has index {idx}")
                    if kv.status is SeqStatus.ACTIVE and not s <= b < e:
                        bad.append(f"{w} lc {lc} block {b}: in-window block only held")
                    if s <= b < e and (page.committed
                                       or kv.commit_state is not CommitState.ALLOWED):
                        bad.append(f"{w} lc {lc} block {b}: stale entry kept although "
                                   f"committed or committing stopped")
    for p in st.pages.values():
        if p.locks != locks[p.pid] or p.holds != holds[p.pid]:
            bad.append(f"page {p.pid}: locks/holds {p.locks}/{p.holds} but entries say "
                       f"{locks[p.pid]}/{holds[p.pid]}")
    return bad
