"""The SGLang target's checks, run after every op (docs/targets/sglang.md).

- The data oracle, model-free: a stamp per slot of each pool (full attention, sliding
  window), written through SGLang's own index tables (`req_to_token` for the full slot
  of a position, `full_to_swa_index_mapping` for its SWA slot) when a position is
  computed; every position attention reads (all of them for full attention, the window
  for SWA) must read back its own stamp, and so must every prefix hit.
- Conservation, as SGLang's scheduler states it (`SchedulerInvariantChecker`): per pool,
  available + evictable + protected + held by requests = size.
- Ownership, the kit's rules: a slot is referenced once (by the tree or by one request's
  own part of its row), a referenced slot is never free, every allocated slot is
  referenced (per page), every allocated SWA slot is the peer of an allocated full slot,
  and a tree node's SWA value is its full value's peer (tombstoned leaves are counted).

An all-SWA model (`PureSWARadixCache`, one pool): one stamp array, attention reads the
window only, a hit's every slot must hold its stamp (no tombstones); conservation of the
one pool; ownership without the peer rules, plus no slot free twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from kvpocket.verify.targets.base import CheckFailure, StepStats
from kvpocket.verify.targets.data_oracle import NEVER_WRITTEN
from kvpocket.verify.targets.sglang_compat import Compat
from kvpocket.verify.targets.workload import Request


class SglangInstance(Protocol):
    """What the checks read of the target's instance (`sglang.SglangInstance`), named here
    so that the checks do not import the driver that imports them."""

    api: Any
    compat: Compat
    alloc: Any
    tree: Any
    r2t: Any
    stats: StepStats
    page: int
    full_size: int
    swa_size: int
    pure: bool  # an all-SWA model: one pool, PureSWARadixCache
    sreqs: dict[str, Any]
    prefix_ids: dict[str, list[int]]

    def running(self) -> list[tuple[Request, Any]]: ...

    def _quiet(self) -> AbstractContextManager[Any]: ...

RARE_SWA_ONLY = "SWA-only eviction (tombstones made)"
RARE_BOTH = "eviction of full and SWA"
RARE_PURE = "eviction from the all-SWA tree"


def _ceil(n: int, page: int) -> int:
    return (n + page - 1) // page * page


class PoolState:
    """The stamps of both pools, and what the last allocation evicted. All-SWA (`pure`):
    one pool, whose slots a request's row holds directly (SGLang's full-to-SWA mapping is
    the identity there), so the full and the SWA stamps are one array."""

    def __init__(self, full_size: int, swa_size: int, page: int, window: int,
                 pure: bool = False) -> None:
        self.page, self.window, self.pure = page, window, pure
        # SGLang's slot 0 (and page 0) is padding; paged pools index up to size + page.
        self.swa: npt.NDArray[np.int64] = np.zeros(swa_size + 2 * page + 1, dtype=np.int64)
        self.full: npt.NDArray[np.int64] = self.swa if pure else \
            np.zeros(full_size + 2 * page + 1, dtype=np.int64)
        # the tenant (cache salt) of each full slot's writer: a salt does not change the
        # KV, so a hit across salts reads the right stamp and only this tells it apart
        self.tenant: npt.NDArray[np.int64] = np.zeros_like(self.full)
        self.tenants: dict[str | None, int] = {None: 0}
        self.evicted_now = False

    def reset(self) -> None:
        self.full[:] = NEVER_WRITTEN
        self.swa[:] = NEVER_WRITTEN
        self.tenant[:] = 0

    def _tenant(self, req: Request) -> int:
        return self.tenants.setdefault(req.identity.salt, len(self.tenants))

    # -- the data oracle ------------------------------------------------------------

    @staticmethod
    def _row(inst: SglangInstance, req: Request, lo: int, hi: int) -> npt.NDArray[np.int64]:
        idx = inst.compat.kv(inst.sreqs[req.rid]).req_pool_idx
        row: npt.NDArray[np.int64] = inst.r2t.req_to_token[idx, lo:hi].numpy().astype(np.int64)
        return row

    @staticmethod
    def _peers(inst: SglangInstance, full: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        mapping = inst.alloc.full_to_swa_index_mapping
        peers: npt.NDArray[np.int64] = mapping[full].numpy().astype(np.int64)
        return peers

    def write(self, inst: SglangInstance, req: Request, start: int, end: int) -> None:
        ids = np.asarray(inst.prefix_ids[req.rid][start:end], dtype=np.int64)
        full = self._row(inst, req, start, end)
        if (full == 0).any():
            pos = start + int(np.nonzero(full == 0)[0][0])
            raise CheckFailure("data", f"{req.rid} computes position {pos} but its "
                               "req_to_token row holds no slot there (padding slot 0)")
        peers = self._peers(inst, full)
        if (peers == 0).any():
            pos = start + int(np.nonzero(peers == 0)[0][0])
            raise CheckFailure("data", f"{req.rid} computes position {pos} (full slot "
                               f"{int(full[pos - start])}) but it has no SWA slot mapped")
        self.full[full] = ids
        self.swa[peers] = ids
        self.tenant[full] = self._tenant(req)

    def check_reads(self, inst: SglangInstance, req: Request, first_query: int, end: int,
                    what: str) -> None:
        """Full attention reads [0, end); the sliding window of the queries from
        `first_query` reads [first_query - window, end) (a query at q attends to
        q - window ... q, as SGLang's window_left). An all-SWA model reads the window
        only."""
        ids = np.asarray(inst.prefix_ids[req.rid][:end], dtype=np.int64)
        full = self._row(inst, req, 0, end)
        bad = np.nonzero(self.full[full] != ids)[0] if not self.pure else \
            np.zeros(0, dtype=np.int64)
        if len(bad):
            pos = int(bad[0])
            raise CheckFailure("data", f"{req.rid}: {what} reads position {pos} from full "
                               f"slot {int(full[pos])}, which holds "
                               f"{_describe(int(self.full[full[pos]]))}, not its own KV "
                               f"(stamp {int(ids[pos])})")
        lo = max(0, first_query - self.window)
        peers = self._peers(inst, full[lo:end])
        for k, slot in enumerate(peers.tolist()):
            pos = lo + k
            if slot == 0:
                raise CheckFailure("data", f"{req.rid}: {what} reads position {pos} through "
                                   f"the sliding window (window {self.window}) but its "
                                   f"full slot {int(full[pos])} has no SWA slot mapped: "
                                   "freed while in the window")
            if self.swa[slot] != ids[pos]:
                raise CheckFailure("data", f"{req.rid}: {what} reads position {pos} from SWA "
                                   f"slot {slot}, which holds "
                                   f"{_describe(int(self.swa[slot]))}, not its own KV "
                                   f"(stamp {int(ids[pos])})")

    def check_hit(self, inst: SglangInstance, req: Request, slots: list[int], hit: int) -> None:
        """A prefix hit of `hit` tokens: every full slot holds the request's own tokens,
        and the window the next query reads is live in the SWA pool. All-SWA: every slot
        of the hit is the tree's and holds its own position's KV (there are no
        tombstones: a node's whole value is live)."""
        ids = inst.prefix_ids[req.rid]
        if len(slots) != hit:
            raise CheckFailure("data", f"{req.rid}: a prefix hit of {hit} tokens comes with "
                               f"{len(slots)} slots")
        for pos, slot in enumerate(slots):
            if self.full[slot] != ids[pos]:
                raise CheckFailure("data", f"{req.rid}: prefix hit of {hit} tokens maps "
                                   f"position {pos} to full slot {slot}, which holds "
                                   f"{_describe(int(self.full[slot]))}, not the "
                                   f"request's (stamp {ids[pos]})")
        full = np.asarray(slots, dtype=np.int64)
        foreign = np.nonzero(self.tenant[full] != self._tenant(req))[0]
        if len(foreign):
            pos = int(foreign[0])
            names = {v: k for k, v in self.tenants.items()}
            raise CheckFailure("isolation failure", f"{req.rid} (cache salt "
                               f"{req.identity.salt!r}) hits position {pos} in full slot "
                               f"{slots[pos]}, written by a request of cache salt "
                               f"{names[int(self.tenant[full[pos]])]!r}: one tenant's "
                               "cached prompt served to another")
        lo = max(0, hit - self.window)
        for k, peer in enumerate(self._peers(inst, full[lo:hit]).tolist()):
            pos = lo + k
            if peer == 0 or self.swa[peer] != ids[pos]:
                found = "no SWA slot" if peer == 0 else \
                    f"SWA slot {peer} holding {_describe(int(self.swa[peer]))}"
                raise CheckFailure("data", f"{req.rid}: prefix hit of {hit} tokens, but "
                                   f"position {pos}, in the window the next query reads, "
                                   f"has {found} (want stamp {ids[pos]}): a window-gated "
                                   "hit past evicted SWA")

    # -- evictions ------------------------------------------------------------------

    @staticmethod
    def tree_sizes(inst: SglangInstance) -> tuple[int, int]:
        t = inst.tree
        return (int(t.full_evictable_size()) + int(t.full_protected_size()),
                int(t.swa_evictable_size()) + int(t.swa_protected_size()))

    def note_evictions(self, inst: SglangInstance, before: tuple[int, int]) -> None:
        full, swa = self.tree_sizes(inst)
        self.evicted_now = full < before[0] or swa < before[1]
        if self.pure:
            if self.evicted_now:
                inst.stats.hit(RARE_PURE)
        elif full < before[0]:
            inst.stats.hit(RARE_BOTH)
        elif swa < before[1]:
            inst.stats.hit(RARE_SWA_ONLY)


def _describe(stamp: int) -> str:
    return "nothing ever written" if stamp == NEVER_WRITTEN else f"stamp {stamp}"


def _nodes(inst: SglangInstance) -> Iterator[tuple[str, Any, Any, bool]]:
    """Every tree node but the root: its name, its full value (None: evicted from the
    device) and SWA value (None: tombstoned), and whether it is a leaf. SWARadixCache
    keeps one value and a tombstone flag (its SWA value is the full value's SWA peers);
    the unified tree keeps a value per component."""
    tree = inst.tree
    unified = hasattr(tree, "tree_core")
    stack = [tree.tree_core.root_node if unified else tree.root_node]
    mapping = inst.alloc.full_to_swa_index_mapping
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node.parent is None:
            continue
        if unified:
            ct = inst.api.components.ComponentType
            full, swa = node.component(ct.FULL).value, node.component(ct.SWA).value
        else:
            full = node.value
            swa = None if node.swa_tombstone or full is None else mapping[full]
        yield f"tree node {node.id}", full, swa, not node.children


def _free_pages(allocator: Any) -> list[int]:
    """The allocator's free pages (slots at page size 1), as many times as it holds each."""
    if hasattr(allocator, "get_all_free_pages"):
        return [int(p) for p in allocator.get_all_free_pages().tolist()]
    # releases before it: the free list and the pages freed since its last sort
    pages = [int(p) for p in allocator.free_pages.tolist()]
    if allocator.release_pages is not None:
        pages += [int(p) for p in allocator.release_pages.tolist()]
    return pages


def _free_slots(allocator: Any, page: int) -> set[int]:
    pages = _free_pages(allocator)
    if page == 1:
        return set(pages)
    return {p * page + k for p in pages for k in range(page)}


def check_state(inst: SglangInstance) -> None:
    _check_conservation(inst)
    if inst.pure:
        _check_ownership_pure(inst)
    else:
        _check_ownership(inst)
    if not any(True for _ in inst.running()):
        with inst._quiet():
            inst.tree.sanity_check()
        inst.stats.hit("sanity_check")


def _check_conservation(inst: SglangInstance) -> None:
    """SGLang's leak check (`_check_pool_invariant`), per pool."""
    t, a, page = inst.tree, inst.alloc, inst.page
    per_req = [inst.compat.held_tokens(s, page) for _, s in inst.running()]
    full_held = sum(f for f, _ in per_req)
    swa_held = sum(s for _, s in per_req)
    if hasattr(t, "swa_transient_size"):
        swa_held += int(t.swa_transient_size())
    pools = [("SWA", a.swa_available_size(), t.swa_evictable_size(), t.swa_protected_size(),
              swa_held, inst.swa_size)]
    if not inst.pure:  # SGLang skips the full pool where it has no capacity (all-SWA)
        pools.insert(0, ("full", a.full_available_size(), t.full_evictable_size(),
                         t.full_protected_size(), full_held, inst.full_size))
    for pool, avail, evictable, protected, held, size in pools:
        total = int(avail) + int(evictable) + int(protected) + held
        if total != size:
            raise CheckFailure("pool", f"{pool} pool: available {int(avail)} + evictable "
                               f"{int(evictable)} + protected {int(protected)} + held by "
                               f"requests {held} = {total}, not its size {size}")


def _own(table: dict[int, str], slot: int, who: str, pool: str = "") -> None:
    """Records `who` as the one referent of `slot` (of `pool`, where the model has two)."""
    name = f"{pool} slot" if pool else "slot"
    if slot == 0:
        raise CheckFailure("ownership", f"{who} references {pool + ' ' if pool else ''}"
                           "padding slot 0")
    if slot in table:
        raise CheckFailure("ownership", f"{name} {slot} is referenced by {who} and by "
                           f"{table[slot]}: a slot mapped twice")
    table[slot] = who


def _check_ownership(inst: SglangInstance) -> None:
    a, page = inst.alloc, inst.page
    mapping = a.full_to_swa_index_mapping
    full_owner: dict[int, str] = {}
    swa_owner: dict[int, str] = {}

    for who, fv, sv, leaf in _nodes(inst):
        if fv is None:
            continue  # evicted from the device
        full = [int(x) for x in fv.tolist()]
        for slot in full:
            _own(full_owner, slot, who, "full")
        if sv is not None:
            swa = [int(x) for x in sv.tolist()]
            peers = [int(mapping[s]) for s in full]
            if swa != peers:
                raise CheckFailure("ownership", f"{who}: its SWA value {swa} is not the "
                                   f"SWA peers of its full value {full} ({peers})")
            for slot in swa:
                _own(swa_owner, slot, who, "SWA")
        elif leaf:
            # The unified tree keeps leaves whose SWA part was evicted (its SWA-only
            # eviction tombstones leaves); counted, not failed (docs/targets/sglang.md).
            inst.stats.hit("tombstone leaf seen")
    for req, sreq in inst.running():
        kv = inst.compat.kv(sreq)
        row = [int(x) for x in inst.r2t.req_to_token[kv.req_pool_idx,
                                                        :kv.kv_allocated_len].tolist()]
        protected = kv.cache_protected_len
        for pos in range(protected):  # the tree's part of its row: the tree's slots
            if row[pos] not in full_owner:
                raise CheckFailure("ownership", f"{req.rid}'s row maps position {pos} to "
                                   f"full slot {row[pos]} in its protected prefix "
                                   f"({protected} tokens), which no tree node holds")
        swa_from = max(protected, inst.compat.swa_evicted(sreq))
        for pos in range(protected, len(row)):
            _own(full_owner, row[pos], f"{req.rid} (position {pos})", "full")
            peer = int(mapping[row[pos]])
            if pos >= swa_from:
                if peer == 0:
                    raise CheckFailure("ownership", f"{req.rid} position {pos} (full slot "
                                       f"{row[pos]}) is past its SWA eviction point "
                                       f"{swa_from} but has no SWA slot mapped")
                _own(swa_owner, peer, f"{req.rid} (position {pos})", "SWA")
            elif peer != 0 and not (inst.compat.swa_dead_lo(sreq, page) > pos):
                raise CheckFailure("ownership", f"{req.rid} position {pos} was freed out of "
                                   f"the window but its full slot {row[pos]} still maps "
                                   f"SWA slot {peer}")
    full_free = _free_slots(a.full_attn_allocator, page)
    swa_free = _free_slots(a.swa_attn_allocator, page)
    for table, free, pool in ((full_owner, full_free, "full"), (swa_owner, swa_free, "SWA")):
        both = sorted(set(table) & free)
        if both:
            raise CheckFailure("ownership", f"{pool} slot {both[0]} is free but still "
                               f"referenced by {table[both[0]]}: a free released a slot "
                               "its caller did not own")
    # Every allocated page is referenced, and every allocated SWA slot is a peer.
    size_full, size_swa = inst.full_size, inst.swa_size
    full_alloc = set(range(page, size_full + page)) - full_free
    referenced_pages = {s // page for s in full_owner}
    leaked = sorted(p for p in {s // page for s in full_alloc} if p not in referenced_pages)
    if leaked:
        raise CheckFailure("ownership", f"full page {leaked[0]} is allocated but no request "
                           "or tree node references it: a leak")
    # Per page: a paged allocation maps only the positions it covers, and takes the
    # whole SWA page.
    swa_alloc = {s // page for s in set(range(page, size_swa + page)) - swa_free}
    peer_pages = {int(mapping[s]) // page for s in full_alloc if int(mapping[s])}
    orphan = sorted(swa_alloc - peer_pages)
    if orphan:
        raise CheckFailure("ownership", f"SWA page {orphan[0]} is allocated but no allocated "
                           "full slot maps to it: a leak")
    stray = sorted(peer_pages - swa_alloc)
    if stray:
        raise CheckFailure("ownership", f"SWA page {stray[0]} is free but an allocated full "
                           "slot still maps to it")


def _check_ownership_pure(inst: SglangInstance) -> None:
    """The all-SWA model's one pool: a slot is referenced once (by one tree node or by
    one request's own part of its row, less what it freed out of the window), a request's
    protected prefix is the tree's, no referenced slot is free, no slot is free twice,
    every allocated slot is referenced."""
    page = inst.page
    owner: dict[int, str] = {}

    stack = list(inst.tree.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        for slot in node.value.tolist():
            _own(owner, int(slot), f"tree node {node.id}")
    for req, sreq in inst.running():
        kv = inst.compat.kv(sreq)
        row = [int(x) for x in inst.r2t.req_to_token[kv.req_pool_idx,
                                                        :kv.kv_allocated_len].tolist()]
        protected = int(kv.cache_protected_len or 0)
        for pos in range(protected):
            if row[pos] not in owner:
                raise CheckFailure("ownership", f"{req.rid}'s row maps position {pos} to "
                                   f"slot {row[pos]} in its protected prefix ({protected} "
                                   "tokens), which no tree node holds")
        dead_lo = inst.compat.swa_dead_lo(sreq, page)
        evicted = inst.compat.swa_evicted(sreq)
        for pos in range(protected, len(row)):
            if not dead_lo <= pos < evicted:  # below: freed out of the window
                _own(owner, row[pos], f"{req.rid} (position {pos})")
    pages = _free_pages(inst.alloc.swa_attn_allocator)
    seen: set[int] = set()
    for p in pages:
        if p in seen:
            raise CheckFailure("ownership", f"{'slot' if page == 1 else 'page'} {p} is in "
                               "the free list twice: a double free")
        seen.add(p)
    free = _free_slots(inst.alloc.swa_attn_allocator, page)
    both = sorted(set(owner) & free)
    if both:
        raise CheckFailure("ownership", f"slot {both[0]} is free but still referenced by "
                           f"{owner[both[0]]}: a free released a slot its caller did not own")
    allocated = set(range(page, inst.swa_size + page)) - free
    leaked = sorted({s // page for s in allocated} - {s // page for s in owner})
    if leaked:
        raise CheckFailure("ownership", f"{'slot' if page == 1 else 'page'} {leaked[0]} is "
                           "allocated but no request or tree node references it: a leak")
