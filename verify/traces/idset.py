"""A set of sequence ids held as runs of consecutive ids.

The checker remembers every closed id whose model slot now serves another sequence (so a
later call on it gets the error a closed sequence gets). A server never reuses ids and
hands them out in increasing order, so over a day's log these are millions of ids in a
few runs: stored as runs, memory follows the gaps (ids still open), not the ids ever
closed, which is what lets `trace check --follow` run for ever in bounded memory.
"""

from __future__ import annotations

from bisect import bisect_right


class IdRuns:
    """A set of ints as sorted disjoint runs [start, end)."""

    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def _run_of(self, x: int) -> int:
        """The index of the last run starting at or before x (-1 if none)."""
        return bisect_right(self._starts, x) - 1

    def __contains__(self, x: object) -> bool:
        if not isinstance(x, int):
            return False
        i = self._run_of(x)
        return i >= 0 and x < self._ends[i]

    def __len__(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends, strict=True))

    @property
    def runs(self) -> int:
        return len(self._starts)

    def add(self, x: int) -> None:
        if x in self:
            return
        starts, ends = self._starts, self._ends
        i = self._run_of(x)
        joins_left = i >= 0 and ends[i] == x
        joins_right = i + 1 < len(starts) and starts[i + 1] == x + 1
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif joins_left:
            ends[i] = x + 1
        elif joins_right:
            starts[i + 1] = x
        else:
            starts.insert(i + 1, x)
            ends.insert(i + 1, x + 1)

    def discard(self, x: int) -> None:
        if x not in self:
            return
        starts, ends = self._starts, self._ends
        i = self._run_of(x)
        start, end = starts[i], ends[i]
        if start == x and end == x + 1:
            del starts[i], ends[i]
        elif start == x:
            starts[i] = x + 1
        elif end == x + 1:
            ends[i] = x
        else:
            ends[i] = x
            starts.insert(i + 1, x + 1)
            ends.insert(i + 1, end)
