"""Eviction queue of one (level, pool group), and the replaceable victim policy.

Order: priority ascending, then least recently scheduled. Each push takes a
fresh sequence number; removal remembers it, so an undo re-inserts the page
at exactly its old position. A lazy-deletion heap keeps push/remove O(log n)
and O(1); when the garbage outgrows the live entries (`COMPACT_FACTOR` times, plus
`COMPACT_SLACK`) the heap is rebuilt from the live entries (`compactions` counts the
rebuilds, `compacted_live` the live entries the last one kept: statistics for the
verifier's rare-state gate, outside the undo log). `heap_items` exposes the heap so a
check can recompute its meaning (`selfcheck.eviction_heap`).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Protocol

from .undo import Op

_ticket = itertools.count()


class EvictionQueue:
    __slots__ = ("_heap", "compacted_live", "compactions", "entries", "group", "level")

    COMPACT_FACTOR = 4
    COMPACT_SLACK = 64

    def __init__(self, level: int, group: int) -> None:
        self.level = level
        self.group = group
        self.entries: dict[int, tuple[int, int]] = {}  # page id -> (priority, ticket)
        self._heap: list[tuple[int, int, int]] = []
        self.compactions = 0
        self.compacted_live = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, pid: int) -> bool:
        return pid in self.entries

    def push(self, pid: int, priority: int, op: Op) -> None:
        self._insert(pid, (priority, next(_ticket)))
        op.on_undo(self._delete, pid)

    def remove(self, pid: int, op: Op) -> None:
        key = self.entries[pid]
        self._delete(pid)
        op.on_undo(self._insert, pid, key)

    def _insert(self, pid: int, key: tuple[int, int]) -> None:
        assert pid not in self.entries
        self.entries[pid] = key
        heapq.heappush(self._heap, (key[0], key[1], pid))

    def _delete(self, pid: int) -> None:
        del self.entries[pid]
        if len(self._heap) > self.COMPACT_FACTOR * len(self.entries) + self.COMPACT_SLACK:
            self._compact()  # bound the lazy garbage

    def _compact(self) -> None:
        self._heap = [(p, t, i) for i, (p, t) in self.entries.items()]
        heapq.heapify(self._heap)
        self.compactions += 1
        self.compacted_live = len(self.entries)

    def first(self) -> int | None:
        """The next victim in queue order, or None."""
        h = self._heap
        while h:
            p, t, pid = h[0]
            if self.entries.get(pid) == (p, t):
                return pid
            heapq.heappop(h)  # stale entry
        return None

    def heap_items(self) -> tuple[tuple[int, int, int], ...]:
        """The heap as it is stored, (priority, ticket, page id) per item, garbage included
        (read-only: a copy)."""
        return tuple(self._heap)

    def ordered(self) -> list[int]:
        """Page ids in eviction order."""
        return [pid for pid, _ in sorted(self.entries.items(), key=lambda kv: kv[1])]

class VictimPolicy(Protocol):
    """Chooses the next victim from a queue (replaceable to force a trace).

    Returns a page id in `queue` or None when the queue is empty.
    """

    def choose(self, level: int, pool_group: int, queue: EvictionQueue) -> int | None: ...


class QueueOrderVictimPolicy:
    """The default: priority ascending, then least recently scheduled."""

    def choose(self, level: int, pool_group: int, queue: EvictionQueue) -> int | None:
        return queue.first()
