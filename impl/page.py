"""A page: one block's data for one life cycle, living in one slot at one level.

Lifetimes are explicit: the manager counts locks and holds on each page and
kills a page (releasing its slot) in the same call that removes its last
holder, unless the page is committed (the radix tree keeps it, DROPPABLE and
queued). No `__del__`, no weak references.

Status (as upstream): LOCKED if any block entry locks it (then it is at GPU
and never queued); HELD if something holds it without a lock (a block entry
of a suspended sequence, a kept stale uncommitted block, a pocket entry, a
backup holder during resize); DROPPABLE otherwise.

Ordering: `events` are the events the slot's data depends on (the copy that
filled it); `users` are streams that used the page since it was last fenced.
A consumer on another stream must wait on both (see `Manager._fence`).
"""

from __future__ import annotations

from kvpocket.model.config import NO_SLOT, PageStatus

from .backend.protocol import EventRef, StreamRef


class Page:
    __slots__ = (
        "alive", "committed", "events", "group", "holds", "lc", "level", "locks", "node",
        "ordinal", "owner", "pid", "pocket_owner", "priority", "slot", "users",
    )

    def __init__(
        self, pid: int, lc: int, group: int, level: int, slot: int, priority: int,
        owner: int | None, ordinal: int,
    ) -> None:
        self.pid = pid
        self.lc = lc
        self.group = group
        self.level = level
        self.slot = slot
        self.priority = priority
        self.owner = owner  # sequence that created it (None once committed)
        self.ordinal = ordinal
        self.committed = False
        self.node: int | None = None  # radix-tree node id once committed
        self.locks = 0
        self.holds = 0
        self.pocket_owner: int | None = None
        self.events: tuple[EventRef, ...] = ()
        self.users: tuple[StreamRef, ...] = ()
        self.alive = True

    @property
    def status(self) -> PageStatus:
        if self.locks:
            return PageStatus.LOCKED
        if self.holds:
            return PageStatus.HELD
        return PageStatus.DROPPABLE

    @property
    def has_slot(self) -> bool:
        return self.slot != NO_SLOT

    def __repr__(self) -> str:
        return (f"Page({self.pid}, lc={self.lc}, L{self.level}:{self.slot}, "
                f"{self.status.name}, committed={self.committed})")
