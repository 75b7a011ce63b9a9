"""Slot allocator of one (level, pool group), and the replaceable slot policy.

Free slots are the recycled ones (FIFO, each carrying the events of its last
use) plus never-issued ids, issued in ascending order. Preference, as
upstream: a ready recycled slot (oldest first), then a never-issued one, then
a not-ready recycled slot (the new owner must wait on its events).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

from .backend.protocol import EventRef
from .exceptions import DoubleReleaseError, OutOfPagesError, SlotChoiceError
from .undo import Op

Events = tuple[EventRef, ...]


class SlotAllocator:
    __slots__ = ("capacity", "events", "group", "level", "next_fresh", "occupied", "recycled")

    def __init__(self, level: int, group: int, capacity: int) -> None:
        self.level = level
        self.group = group
        self.capacity = capacity
        self.recycled: deque[int] = deque()
        self.events: dict[int, Events] = {}  # recycled slot -> events of its last use
        self.next_fresh = 0
        self.occupied: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self.recycled) + self.capacity - self.next_fresh

    def free_slots(self) -> list[int]:
        return sorted([*self.recycled, *range(self.next_fresh, self.capacity)])

    def candidates(self, ready: Callable[[Events], bool]) -> Iterator[int]:
        """Free slots in preference order (lazy: the default policy takes the first)."""
        not_ready: list[int] = []
        for s in self.recycled:
            if ready(self.events[s]):
                yield s
            else:
                not_ready.append(s)
        if self.next_fresh < self.capacity:
            yield self.next_fresh
        yield from not_ready

    def take(self, slot: int, op: Op) -> Events:
        """Mark `slot` (a free candidate) occupied; returns the events to wait on."""
        if slot in self.occupied:
            raise SlotChoiceError(f"slot {slot} at level {self.level} is not free")
        if slot == self.next_fresh and slot < self.capacity:
            op.set(self, "next_fresh", slot + 1)
            evs: Events = ()
        else:
            try:
                i = self.recycled.index(slot)
            except ValueError:
                raise SlotChoiceError(
                    f"slot {slot} is not a free candidate at level {self.level} "
                    f"(never-issued slots are issued in ascending order)"
                ) from None
            del self.recycled[i]
            evs = self.events.pop(slot)
            op.on_undo(self._unrecycle, i, slot, evs)
        self.occupied.add(slot)
        op.on_undo(self.occupied.discard, slot)
        return evs

    def _unrecycle(self, i: int, slot: int, evs: Events) -> None:
        self.recycled.insert(i, slot)
        self.events[slot] = evs

    def release(self, slot: int, evs: Events, op: Op) -> None:
        if not 0 <= slot < self.capacity:
            raise DoubleReleaseError(
                f"release of slot {slot} out of range [0, {self.capacity}) "
                f"at level {self.level}, pool group {self.group}"
            )
        if slot not in self.occupied:
            raise DoubleReleaseError(
                f"double release: slot {slot} at level {self.level}, pool group {self.group} "
                f"is not occupied"
            )
        self.occupied.discard(slot)
        self.recycled.append(slot)
        self.events[slot] = evs
        op.on_undo(self._unrelease, slot)

    def _unrelease(self, slot: int) -> None:
        last = self.recycled.pop()
        assert last == slot
        del self.events[slot]
        self.occupied.add(slot)


class SlotPolicy(Protocol):
    """Chooses which free slot an allocation takes (replaceable to force a trace)."""

    def choose(
        self, level: int, pool_group: int, candidates: Iterator[int]
    ) -> int: ...


class FirstSlotPolicy:
    """The default: the allocator's preference order."""

    def choose(self, level: int, pool_group: int, candidates: Iterator[int]) -> int:
        for s in candidates:
            return s
        raise OutOfPagesError(f"no free slot at level {level}, pool group {pool_group}")
