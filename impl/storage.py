"""Levels, slots, pages, eviction and migration (the storage half of the manager).

One `SlotAllocator` and one `EvictionQueue` per (level, pool group); one slot
pool array per (level, pool group). Everything that mutates goes through an
`Op` (see `undo.py`), so any failure rolls back exactly.

Evictable rule: `(DROPPABLE and committed) or (HELD and level < last_level)`,
except that pocket pages are never evictable under the `pin` policy. A page is
in its level's queue iff evictable (outside an operation); `requeue` restores
that after every status/level change.

Cascade (`make_room`): while level L lacks free slots, take the victim policy's
choice from L's queue. At the last level it is dropped (only DROPPABLE
committed pages are queued there). Otherwise make one slot free at L+1
(recursively); if that fails, a DROPPABLE victim is dropped instead (the
nested attempt is rolled back first) and a HELD one fails the operation.
Then the victim migrates to L+1.

Batched migration: the migrations of one operation that are deferred back to back
(no other stream work between them) join one `CopyBatch`: one event for all of
them, recorded after the last copy, and one `copy_slots` call per run of copies
between the same two pools. Every page in the batch carries that event, so a
consumer waits for the whole batch (never less than for its own copy), and no
wait or record is ever moved past a copy: the stream order is the per-page one.
A wait on the copy stream for an event it already waits on in this operation is
not enqueued twice (streams run in order), so a cascade from one sequence's pages
stays one batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from kvpocket.model.config import GPU_LEVEL, NO_SLOT, KVConfig, PocketPolicy

from .allocator import Events, FirstSlotPolicy, SlotAllocator, SlotPolicy
from .backend.protocol import Backend, EventRef, StreamRef
from .eviction import EvictionQueue, QueueOrderVictimPolicy, VictimPolicy
from .exceptions import CopyFailedError, InjectedAllocationError, OutOfPagesError, SlotChoiceError
from .page import Page
from .radix import RadixTree
from .undo import Op


@dataclass
class CopyBatch:
    """Deferred migrations issued together on the copy stream (see the module doc).

    `items`: (destination pool, destination slot, source pool, source slot) in the
    order the per-page copies would have run. Consecutive items between the same two
    pools with distinct destination slots form one `copy_slots` call: within such a
    segment every copy reads the source pool and writes the destination pool, so the
    copies are independent; a change of pools, or a destination slot written twice,
    starts a new segment after the previous one on the same stream.
    """

    backend: Backend
    stream: StreamRef
    event: EventRef
    items: list[tuple[Any, int, Any, int]] = field(default_factory=list)

    def segments(self) -> list[tuple[Any, list[int], Any, list[int]]]:
        out: list[tuple[Any, list[int], Any, list[int]]] = []
        seen: set[int] = set()
        for dst_pool, dst_slot, src_pool, src_slot in self.items:
            if (not out or out[-1][0] is not dst_pool or out[-1][2] is not src_pool
                    or dst_slot in seen):
                out.append((dst_pool, [], src_pool, []))
                seen = set()
            out[-1][1].append(dst_slot)
            out[-1][3].append(src_slot)
            seen.add(dst_slot)
        return out

    def __call__(self) -> None:
        for dst_pool, dst_slots, src_pool, src_slots in self.segments():
            self.backend.copy_slots(self.stream, dst_pool, dst_slots, src_pool, src_slots)
        self.backend.record(self.event, self.stream)


class Storage:
    def __init__(
        self, cfg: KVConfig, backend: Backend, slot_elems: int, dtype: Any,
        slot_policy: SlotPolicy | None = None, victim_policy: VictimPolicy | None = None,
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self.last = cfg.last_level
        self.pin = cfg.pocket.policy is PocketPolicy.PIN
        self.num_groups = cfg.num_pool_groups
        groups = range(cfg.num_pool_groups)
        self.allocs = [[SlotAllocator(lv, g, n) for g in groups]
                       for lv, n in enumerate(cfg.slots_per_level)]
        self.queues = [[EvictionQueue(lv, g) for g in groups] for lv in range(cfg.num_levels)]
        self.pools = [[backend.create_pool(lv, n, slot_elems, dtype) for _ in groups]
                      for lv, n in enumerate(cfg.slots_per_level)]
        self.pages: dict[int, Page] = {}
        self.next_pid = 0
        self.tree = RadixTree(cfg.num_life_cycles, cfg.tokens_per_block)
        self.copy_stream = backend.new_stream("copy")
        self.slot_policy: SlotPolicy = slot_policy or FirstSlotPolicy()
        self.victim_policy: VictimPolicy = victim_policy or QueueOrderVictimPolicy()
        self.fail_next_alloc = False
        self.fail_next_copy = False
        self._new_events: set[int] = set()  # ids of events recorded by the current op
        self._waited: set[tuple[int, int]] = set()  # (stream id, event id) waits of the op

    # ---- pages -------------------------------------------------------------------------
    def new_page(
        self, lc: int, level: int, slot: int, owner: int | None, ordinal: int, op: Op
    ) -> Page:
        lcfg = self.cfg.life_cycles[lc]
        page = Page(self.next_pid, lc, lcfg.pool_group, level, slot, lcfg.priority, owner, ordinal)
        op.set(self, "next_pid", self.next_pid + 1)
        self.pages[page.pid] = page
        op.on_undo(self.pages.pop, page.pid)
        return page

    def _kill(self, page: Page, op: Op) -> None:
        assert page.locks == 0 and page.holds == 0
        del self.pages[page.pid]
        op.on_undo(self.pages.__setitem__, page.pid, page)
        op.set(page, "alive", False)

    def evictable(self, page: Page) -> bool:
        if page.locks:
            return False
        if page.holds:
            if self.pin and page.pocket_owner is not None:
                return False
            return page.level < self.last
        return page.committed

    def requeue(self, page: Page, op: Op) -> None:
        q = self.queues[page.level][page.group]
        want = page.alive and page.has_slot and self.evictable(page)
        if want and page.pid not in q:
            q.push(page.pid, page.priority, op)
        elif not want and page.pid in q:
            q.remove(page.pid, op)

    def unqueue(self, page: Page, op: Op) -> None:
        """Remove a page from its level's queue (no-op if not queued). `requeue` only
        ever queues a page at its current level, and migration re-queues it."""
        q = self.queues[page.level][page.group]
        if page.pid in q:
            q.remove(page.pid, op)

    def settle(self, page: Page, op: Op, seq: int | None) -> None:
        """After a lock/hold went away: an unowned uncommitted page dies, else requeue."""
        if page.locks == 0 and page.holds == 0 and not page.committed:
            self.unqueue(page, op)
            if page.has_slot:
                self.release_slot(page, op, seq)
            self._kill(page, op)
        else:
            self.requeue(page, op)

    # ---- events ------------------------------------------------------------------------
    def begin_op(self) -> None:
        self._new_events.clear()
        self._waited.clear()

    def fence(self, page: Page, op: Op, seq: int | None) -> Events:
        """Events that cover every use of the page's slot so far (recording, on each
        stream that used it, at most one event per stream per operation)."""
        if not page.users:
            return page.events
        evs = [self.stream_fence(s, op, seq) for s in page.users]
        op.set(page, "users", ())
        op.set(page, "events", tuple(evs))
        return page.events

    def stream_fence(self, stream: StreamRef, op: Op, seq: int | None) -> EventRef:
        ev: EventRef | None = op.fences.get(stream.id)
        if ev is None:
            ev = self.backend.new_event()
            ev.stream = stream  # known now; the record itself is deferred to commit
            self._new_events.add(ev.id)
            op.fences[stream.id] = ev
            op.defer(partial(self.backend.record, ev, stream))
            op.count("events_recorded", seq)
        return ev

    def done(self, ev: EventRef) -> bool:
        return ev.id not in self._new_events and self.backend.query(ev)

    def ready(self, evs: Events) -> bool:
        return all(self.done(e) for e in evs)

    def wait_for(self, stream: StreamRef, evs: Events, op: Op, seq: int | None) -> None:
        """Make `stream` wait on the events it is not already ordered after."""
        for ev in evs:
            if ev.stream is None or ev.stream.id == stream.id or self.done(ev):
                continue
            key = (stream.id, ev.id)
            if key in self._waited:
                continue  # this op already made `stream` wait on it (events record once)
            self._waited.add(key)
            op.on_undo(self._waited.discard, key)
            op.defer(partial(self.backend.wait_event, stream, ev))
            op.count("cross_stream_waits", seq)

    # ---- slots -------------------------------------------------------------------------
    def alloc(self, level: int, group: int, op: Op, seq: int | None) -> tuple[int, Events]:
        if self.fail_next_alloc:
            self.fail_next_alloc = False  # consumed outside the undo log on purpose
            raise InjectedAllocationError(f"injected allocation failure at level {level}")
        a = self.allocs[level][group]
        if a.num_free == 0:
            raise OutOfPagesError(f"no free slot at level {level}, pool group {group}")
        slot = self.slot_policy.choose(level, group, a.candidates(self.ready))
        evs = a.take(slot, op)
        op.choose(("alloc", level, group, slot))
        op.count("alloc_calls", seq)
        return slot, evs

    def release_slot(self, page: Page, op: Op, seq: int | None) -> None:
        evs = self.fence(page, op, seq)
        self.allocs[page.level][page.group].release(page.slot, evs, op)
        op.set(page, "slot", NO_SLOT)
        op.count("releases", seq)

    # ---- eviction cascade --------------------------------------------------------------
    def make_room(self, level: int, group: int, n: int, op: Op, seq: int | None) -> None:
        a = self.allocs[level][group]
        if n > a.capacity:
            raise OutOfPagesError(
                f"{n} slots requested at level {level}, pool group {group}; "
                f"capacity is {a.capacity}"
            )
        q = self.queues[level][group]
        while a.num_free < n:
            pid = self.victim_policy.choose(level, group, q)
            if pid is None:
                raise OutOfPagesError(
                    f"level {level}, pool group {group}: need {n} free slots, "
                    f"{a.num_free} free and nothing left to evict"
                )
            if pid not in q:
                raise SlotChoiceError(f"victim {pid} is not queued at level {level}")
            self.evict(self.pages[pid], op, seq)

    def evict(self, page: Page, op: Op, seq: int | None) -> None:
        level = page.level
        self.queues[level][page.group].remove(page.pid, op)
        op.choose(("evict", level, page.group, page.pid))
        op.count("evictions", seq)
        if level == self.last:
            assert page.holds == 0 and page.locks == 0 and page.committed, page
            self.drop(page, op, seq)
            return
        if page.pocket_owner is not None and self.cfg.pocket.drops_parked:
            self.drop_parked(page, op, seq)
            return
        sp = op.savepoint()
        try:
            self.make_room(level + 1, page.group, 1, op, seq)
        except InjectedAllocationError:
            raise  # the whole call fails: its choices so far were made, not undone
        except OutOfPagesError:
            op.rollback_to(sp)
            if page.holds == 0 and page.locks == 0:
                self.drop(page, op, seq)
                return
            raise
        self.migrate(page, level + 1, op, seq)
        self.requeue(page, op)

    def drop(self, page: Page, op: Op, seq: int | None) -> None:
        """Destroy a DROPPABLE committed page: unlink from the tree, free its slot."""
        assert page.committed and page.holds == 0 and page.locks == 0, page
        op.choose(("drop", page.level, page.pid))
        op.count("drops", seq)
        self.unqueue(page, op)
        if page.node is not None:
            self.tree.unset_page(page.node, page.lc, op)
        if page.has_slot:
            self.release_slot(page, op, seq)
        self._kill(page, op)

    def drop_parked(self, page: Page, op: Op, seq: int | None) -> None:
        """Release a parked victim's slot without a copy (`evict_parked=drop`): its data is
        out of the window and uncommitted, so nobody reads it again. The slot goes back
        with the page's fenced events; the page stays HELD by its pocket entry, slotless,
        until a pop refuses it (revalidate) or a drain releases it."""
        assert page.pocket_owner is not None and page.locks == 0 and not page.committed, page
        op.choose(("drop_parked", page.level, page.pid))
        op.count("drops", seq)
        self.release_slot(page, op, seq)

    def migrate(self, page: Page, dst_level: int, op: Op, seq: int | None) -> None:
        """Move a page to another level: async copy on the copy stream, ordered after
        the source's last use and the destination slot's previous owner."""
        if self.fail_next_copy:
            self.fail_next_copy = False
            raise CopyFailedError(f"injected copy failure migrating page {page.pid}")
        src_level, src_slot = page.level, page.slot
        dst_slot, dst_evs = self.alloc(dst_level, page.group, op, seq)
        src_evs = self.fence(page, op, seq)
        cs = self.copy_stream
        self.wait_for(cs, src_evs + dst_evs, op, seq)
        dst_pool = self.pools[dst_level][page.group]
        src_pool = self.pools[src_level][page.group]
        batch = op.deferred[-1] if op.deferred else None
        if not (isinstance(batch, CopyBatch) and batch.backend is self.backend):
            ev = self.backend.new_event()
            ev.stream = cs
            self._new_events.add(ev.id)
            batch = CopyBatch(self.backend, cs, ev)
            op.defer(batch)
            op.count("events_recorded", seq)
        batch.items.append((dst_pool, dst_slot, src_pool, src_slot))
        op.on_undo(batch.items.pop)
        ev = batch.event
        op.count("migrations", seq)
        op.set(page, "level", dst_level)
        op.set(page, "slot", dst_slot)
        op.set(page, "events", (ev,))
        self.allocs[src_level][page.group].release(src_slot, (ev,), op)
        op.count("releases", seq)
        op.choose(("migrate", page.pid, src_level, dst_level, dst_slot))

    def bring_to_gpu(self, pages: list[Page], op: Op, seq: int | None) -> None:
        """Migrate (already unqueued) pages up to GPU, making room first."""
        need = [0] * self.num_groups
        for p in pages:
            if p.level != GPU_LEVEL:
                need[p.group] += 1
        for g, n in enumerate(need):
            if n:
                self.make_room(GPU_LEVEL, g, n, op, seq)
        for p in pages:
            if p.level != GPU_LEVEL:
                self.migrate(p, GPU_LEVEL, op, seq)
