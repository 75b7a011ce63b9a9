"""A persistent array that stores only the positions that differ from its default value.

The model's state is a set of arrays sized by the declared geometry (one entry per slot,
per page record, per block entry). A real manager declares 10^4 to 10^6 slots and uses
a few of them at a time, so the executable model stores its arrays as `SparseArray`s:
memory and the cost of a store follow the positions in use, not the declared length.
Only the concrete interpretation sees them (`ConcreteOps.store` writes through `set`);
Z3 keeps plain tuples, and a `SparseArray` reads like a tuple (`len`, indexing,
iteration, equality with a tuple of the same values).

Persistence: `set` returns a new array and never changes the old one, which the model's
rollback and the incremental invariant check rely on. Each array is a shared, never
mutated `base` dict plus a small `overlay` dict of later writes; `set` copies the
overlay, and folds it into a new base once it grows past a bound that scales with the
square root of the base, up to 128 (a read is O(1), a store amortised O(sqrt(used))).
An array remembers the one it was written from, back to the last fold, and the positions
each of its last `_MAX_FOLDS` folds merged, so `changed_since` can name the positions
written since an earlier version (an event that stores hundreds of times folds often).
"""

from __future__ import annotations

import builtins
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import Any, overload

_MISSING: Any = object()
_MIN_OVERLAY = 32
_MAX_OVERLAY = 128  # bounds the versions kept since the last fold (`changed_since`)
_MAX_FOLDS = 16  # folds remembered (`changed_since` across them); bounds what they keep


class SparseArray(Sequence[Any]):
    """An immutable array of `length` values, `default` except at the stored positions."""

    __slots__ = ("_base", "_counts", "_folds", "_hash", "_key", "_overlay", "_parent",
                 "_unused_from", "default", "length", "segments")

    def __init__(self, length: int, default: Any, values: dict[int, Any] | None = None,
                 segments: tuple[int, ...] = (0,)) -> None:
        """`segments`: the first positions of consecutive segments (ascending, from 0);
        `count_used_in` answers for a whole segment in O(1)."""
        self.length = length
        self.default = default
        self.segments = segments
        # invariant: `_base` holds no default values; `_overlay` may (a write back to it)
        self._base: dict[int, Any] = {i: v for i, v in (values or {}).items() if v != default}
        self._overlay: dict[int, Any] = {}
        self._hash: int | None = None
        counts = [0] * len(segments)
        for i in self._base:
            counts[bisect_right(segments, i) - 1] += 1
        self._counts = tuple(counts)
        # (the base before a fold, the positions that fold wrote), the last fold first
        self._folds: tuple[tuple[dict[int, Any], frozenset[int]], ...] = ()
        # the array this one was written from (position `_key`), back to the last fold
        self._parent: SparseArray | None = None
        self._key = -1
        # every position below this one holds a non-default value (`default_positions`)
        self._unused_from = 0

    # ---- reading --------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Any, ...]: ...

    def __getitem__(self, i: int | slice) -> Any:
        # the model's hottest read: stored positions first, the checks only for the rest
        try:
            v = self._overlay.get(i, _MISSING)  # type: ignore[arg-type]
        except TypeError:  # a slice
            return self._read_other(i)
        if v is _MISSING:
            v = self._base.get(i, _MISSING)  # type: ignore[arg-type]
            if v is _MISSING:
                if type(i) is int and 0 <= i < self.length:
                    return self.default
                return self._read_other(i)
        return v

    def _read_other(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return tuple(self[k] for k in range(*i.indices(self.length)))
        if -self.length <= i < 0:  # as a tuple reads it
            return self[i + self.length]
        raise IndexError(i)

    def __iter__(self) -> Iterator[Any]:
        get = self.__getitem__
        return (get(i) for i in range(self.length))

    def items(self) -> Iterator[tuple[int, Any]]:
        """The positions whose value is not the default, with their values (any order)."""
        overlay, default = self._overlay, self.default
        for i, v in self._base.items():
            if i not in overlay:
                yield i, v
        for i, v in overlay.items():
            if v != default:
                yield i, v

    def truthy(self) -> list[int]:
        """The positions whose value is true (any order): comprehensions over the two dicts,
        no generator step per position (the model lists its live or queued pages often)."""
        overlay = self._overlay
        out = [i for i, v in self._base.items() if v and i not in overlay]
        out += [i for i, v in overlay.items() if v]
        return out

    def iter_truthy(self) -> Iterator[int]:
        """`truthy`, as a generator: a search that stops at the first position it wants
        reads no more of the array than it needs."""
        overlay = self._overlay
        for i, v in self._base.items():
            if v and i not in overlay:
                yield i
        for i, v in overlay.items():
            if v:
                yield i

    def used(self) -> builtins.set[int]:
        """The positions whose value is not the default."""
        return {i for i, _ in self.items()}

    def used_in(self, positions: range) -> list[int]:
        """The positions of `positions` whose value is not the default, in its order (a
        short range read without a call per position; a range longer than what is stored
        found among the stored positions)."""
        overlay, base, default = self._overlay, self._base, self.default
        if positions.step == 1 and len(positions) > len(base) + len(overlay):
            lo, hi = positions.start, positions.stop
            return sorted(i for i, _ in self.items() if lo <= i < hi)
        out = []
        for i in positions:
            v = overlay.get(i, _MISSING)
            if v is _MISSING:
                v = base.get(i, default)
            if v != default:
                out.append(i)
        return out

    def values_in(self, positions: range) -> list[Any]:
        """The values at `positions`, in its order (a short range read without a call per
        position)."""
        overlay, base, default = self._overlay, self._base, self.default
        out = []
        for i in positions:
            if not 0 <= i < self.length:
                raise IndexError(i)
            v = overlay.get(i, _MISSING)
            out.append(base.get(i, default) if v is _MISSING else v)
        return out

    def count_used_in(self, positions: range) -> int:
        """How many positions of `positions` (a step-1 range) hold a non-default value: O(1)
        for a whole segment, else O(used)."""
        lo, hi = positions.start, positions.stop
        k = bisect_right(self.segments, lo) - 1
        if self.segments[k] == lo and hi == (
                self.segments[k + 1] if k + 1 < len(self.segments) else self.length):
            return self._counts[k]
        return sum(1 for i, _ in self.items() if lo <= i < hi)

    def default_positions(self) -> Iterator[int]:
        """The positions holding the default value, ascending (lazily). The lowest is
        remembered from write to write, so finding it costs what changed since, not every
        stored position (the model takes the lowest unused page record on every
        allocation)."""
        overlay, base, default = self._overlay, self._base, self.default
        i, lowest = self._unused_from, True
        while i < self.length:
            v = overlay.get(i, _MISSING)
            if v is _MISSING:
                v = base.get(i, default)
            if v == default:
                if lowest:  # every position before i holds a non-default value
                    self._unused_from, lowest = i, False
                yield i
            i += 1

    # ---- writing ------------------------------------------------------------------------
    def set(self, i: int, value: Any) -> SparseArray:
        """A new array with position i set to value (this one is unchanged)."""
        if i < 0:
            i += self.length
        if not 0 <= i < self.length:
            raise IndexError(i)
        old = self._overlay.get(i, _MISSING)
        if old is _MISSING:
            old = self._base.get(i, self.default)
        if old is value or (old == value and type(old) is type(value)):
            return self
        overlay = self._overlay.copy()
        overlay[i] = value
        counts = self._counts
        was_used, now_used = old != self.default, value != self.default
        if was_used != now_used:
            if len(counts) == 1:  # one segment (most arrays): no search
                counts = (counts[0] + (1 if now_used else -1),)
            else:
                k = bisect_right(self.segments, i) - 1
                counts = (*counts[:k], counts[k] + (1 if now_used else -1), *counts[k + 1:])
        base, folds = self._base, self._folds
        parent: SparseArray | None = self
        size = len(overlay)
        if size > _MIN_OVERLAY and size > min(_MAX_OVERLAY, _MIN_OVERLAY + int(len(base) ** 0.5)):
            folds, parent = ((base, frozenset(overlay)), *folds[:_MAX_FOLDS - 1]), None
            base = base.copy()
            for k, v in overlay.items():
                if v == self.default:
                    base.pop(k, None)
                else:
                    base[k] = v
            overlay = {}
        # built without __init__: a store is the model's hottest write
        new = object.__new__(SparseArray)
        new.length, new.default, new.segments, new._base, new._overlay, new._hash = (
            self.length, self.default, self.segments, base, overlay, None)
        new._folds, new._parent, new._key = folds, parent, i
        new._counts = counts
        new._unused_from = self._unused_from if now_used or i > self._unused_from else i
        return new

    def changed_since(self, older: SparseArray) -> builtins.set[int] | None:
        """A superset of the positions where this array differs from `older`, when both
        grew from one base (or `older` from the base one of this one's last `_MAX_FOLDS`
        folds started from); None when that is not known cheaply."""
        if older is self:
            return set()
        if older.length != self.length:
            return None
        written: builtins.set[int] = set()
        node: SparseArray | None = self
        while node is not None and node._parent is not None:  # exact, back to the last fold
            written.add(node._key)
            node = node._parent
            if node is older:
                return written
        written = set(chain(older._overlay, self._overlay))
        if older._base is not self._base:
            for before, merged in self._folds:  # back through the folds to older's base
                written.update(merged)
                if before is older._base:
                    break
            else:
                return None
        # past a fold the written positions are those of whole overlays: keep the ones whose
        # value differs (fewer positions for the checks that look at each)
        return {i for i in written if self._value(i) != older._value(i)}

    def _value(self, i: int) -> Any:
        v = self._overlay.get(i, _MISSING)
        return self._base.get(i, self.default) if v is _MISSING else v

    # ---- comparing ------------------------------------------------------------------------
    def _canonical(self) -> frozenset[tuple[int, Any]]:
        return frozenset(self.items())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SparseArray):
            if self.length != other.length:
                return False
            if self.default == other.default:
                return self._canonical() == other._canonical()
            return tuple(self) == tuple(other)
        if isinstance(other, tuple):
            return len(other) == self.length and tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            # equal arrays hash alike whatever their history. (An equal tuple hashes
            # differently: the model keeps one representation per run, never both.)
            self._hash = hash((self.length, self._canonical()))
        return self._hash

    def __repr__(self) -> str:
        shown = ", ".join(f"{i}: {v!r}" for i, v in sorted(self.items()))
        return f"SparseArray({self.length}, default={self.default!r}, {{{shown}}})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (SparseArray, (self.length, self.default, dict(self.items()), self.segments))


def used_items(arr: Sequence[Any], default: Any) -> Iterable[tuple[int, Any]]:
    """(position, value) for every position of `arr` whose value is not `default`: only the
    stored ones of a `SparseArray` with that default, every position of a tuple."""
    if isinstance(arr, SparseArray) and arr.default == default:
        return arr.items()
    return ((i, v) for i, v in enumerate(arr) if v != default)


def used_in(arr: Sequence[Any], default: Any, positions: range) -> list[int]:
    """The positions of `positions` where `arr` does not hold `default`."""
    if isinstance(arr, SparseArray) and arr.default == default:
        return arr.used_in(positions)
    return [i for i in positions if arr[i] != default]


def values_in(arr: Sequence[Any], positions: range) -> list[Any]:
    """`[arr[i] for i in positions]`, for a `SparseArray` without a call per position."""
    if isinstance(arr, SparseArray):
        return arr.values_in(positions)
    return [arr[i] for i in positions]


def sparse(values: Sequence[Any], default: Any) -> SparseArray:
    """A `SparseArray` with the values of `values`."""
    return SparseArray(len(values), default, dict(used_items(values, default)))


class PositionsByValue:
    """Which positions of an array hold each value other than `default`, for one array at a
    time (`array`), brought from array to array by the positions that differ: asking after
    a newer (or older) version of a `SparseArray` costs what was written between them, not
    the positions in use. The positions are exact for `array`; never change them."""

    def __init__(self, default: Any) -> None:
        self.default = default
        self.array: Sequence[Any] | None = None
        self.positions: dict[Any, builtins.set[int]] = {}

    def follow(self, arr: Sequence[Any], changed: builtins.set[int] | None) -> None:
        """Bring the map to `arr`; `changed`: a superset of the positions where it may
        differ from the array the map is for (None: unknown, rebuilt)."""
        if arr is self.array:
            return
        old, positions, default = self.array, self.positions, self.default
        if old is None or changed is None:
            positions.clear()
            for i, v in used_items(arr, default):
                positions.setdefault(v, set()).add(i)
        else:
            for i in changed:
                was, now = old[i], arr[i]
                if was != now:
                    if was != default:
                        at = positions[was]
                        at.discard(i)
                        if not at:
                            del positions[was]
                    if now != default:
                        positions.setdefault(now, set()).add(i)
        self.array = arr

    def at(self, arr: Sequence[Any]) -> dict[Any, builtins.set[int]]:
        """The map for `arr` (value -> its positions), found from the last array asked
        about when one of the two was written from the other."""
        old = self.array
        if arr is not old:
            changed = None
            if isinstance(arr, SparseArray) and isinstance(old, SparseArray):
                changed = arr.changed_since(old)
                if changed is None:
                    changed = old.changed_since(arr)
            self.follow(arr, changed)
        return self.positions
