"""Eviction queue of one (level, pool group), and the replaceable victim policy.

Order: priority ascending, then least recently scheduled. Each push takes a
fresh sequence number; removal remembers it, so an undo re-inserts the page
at exactly its old position. A lazy-deletion heap keeps push/remove O(log n)
and O(1).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Protocol

from .undo import Op

_ticket = itertools.count()


class EvictionQueue:
    __slots__ = ("_heap", "entries", "group", "level")

    def __init__(self, level: int, group: int) -> None:
        self.level = level
        self.group = group
        self.entries: dict[int, tuple[int, int]] = {}  # page id -> (priority, ticket)
        self._heap: list[tuple[int, int, int]] = []

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
        if len(self._heap) > 4 * len(self.entries) + 64:  # bound the lazy garbage
            self._heap = [(p, t, i) for i, (p, t) in self.entries.items()]
            heapq.heapify(self._heap)

    def first(self) -> int | None:
        """The next victim in queue order, or None."""
        h = self._heap
        while h:
            p, t, pid = h[0]
            if self.entries.get(pid) == (p, t):
                return pid
            heapq.heappop(h)  # stale entry
        return None

    def ordered(self) -> list[int]:
        """Page ids in eviction order."""
        return [pid for pid, _ in sorted(self.entries.items(), key=lambda kv: kv[1])]

    def iter_ordered(self) -> Iterator[int]:
        yield from self.ordered()


class VictimPolicy(Protocol):
    """Chooses the next victim from a queue (replaceable to force a trace).

    Returns a page id in `queue` or None when the queue is empty.
    """

    def choose(self, level: int, pool_group: int, queue: EvictionQueue) -> int | None: ...


class QueueOrderVictimPolicy:
    """The default: priority ascending, then least recently scheduled."""

    def choose(self, level: int, pool_group: int, queue: EvictionQueue) -> int | None:
        return queue.first()
