"""Indexes the executable model keeps beside its persistent state, for block keys.

`commit` interns each newly full block's token prefix (its key is its position in
`State.block_keys`) and asks whether a live committed page has that key; `create` asks
which committed pages hold each block of a prompt. Searched directly, both cost the keys
ever interned or the pages in use, per block: a long event log gets slower as it grows.
These indexes answer by hashing instead, and stay exact whatever state is asked about (a
rolled-back action, another state that fits a log): the state is persistent, so each index
is tied to the very object it describes and is brought to another one by what differs.
Speed only: they change no answer (`tests/model/test_keyindex.py`).
"""

from __future__ import annotations

from typing import Any

from .config import NONE
from .sparse import PositionsByValue, SparseArray
from .state import Layout, State

Keys = tuple[tuple[int, ...], ...]


class _Lineage:
    """The position of every key of the longest `block_keys` tuple seen of one lineage (each
    tuple of it extends the one before: `commit` only appends); a shorter tuple of the
    lineage reads the positions below its length."""

    __slots__ = ("at", "length")

    def __init__(self, keys: Keys) -> None:
        self.at: dict[tuple[int, ...], int] = {}
        for i, k in enumerate(keys):
            self.at.setdefault(k, i)  # the first position, as `tuple.index` finds it
        self.length = len(keys)


class KeyTable:
    """The interned keys of one `block_keys` tuple: look a prefix up, intern new ones, and
    read the tuple back (`keys`)."""

    def __init__(self, keys: Keys, lineage: _Lineage) -> None:
        self._keys = keys
        self._added: list[tuple[int, ...]] = []
        self._lineage = lineage

    def find(self, prefix: tuple[int, ...]) -> int:
        """The key of `prefix`, or NONE when it was never interned."""
        i = self._lineage.at.get(prefix, NONE)
        return i if 0 <= i < len(self._keys) + len(self._added) else NONE

    def intern(self, prefix: tuple[int, ...]) -> int:
        """The key of `prefix`, interned as the next one if it is new."""
        found = self.find(prefix)
        if found != NONE:
            return found
        n = len(self._keys) + len(self._added)
        lineage = self._lineage
        if lineage.length != n:  # another tuple grew from this one first: a lineage of its own
            lineage = self._lineage = _Lineage((*self._keys, *self._added))
        lineage.at.setdefault(prefix, n)
        lineage.length = n + 1
        self._added.append(prefix)
        return n

    def keys(self, lay: Layout) -> Keys:
        """The tuple with the keys interned here appended (the same one if none was)."""
        if not self._added:
            return self._keys
        out = (*self._keys, *self._added)
        _remember(lay, out, self._lineage)
        return out


_TABLES = "block_key_tables"
_TABLES_KEPT = 64  # tuples remembered per layout (the current ones, and a few fitting states)


def _remember(lay: Layout, keys: Keys, lineage: _Lineage) -> None:
    tables: dict[int, tuple[Keys, _Lineage]] = lay.memo.setdefault(_TABLES, {})
    if len(tables) >= _TABLES_KEPT:
        tables.clear()
    tables[id(keys)] = (keys, lineage)  # the tuple is kept: its id names no other meanwhile


def key_table(lay: Layout, keys: Keys) -> KeyTable:
    """The interned keys of `keys` (a `State.block_keys`), found by identity when this tuple
    was indexed before, else indexed once."""
    tables: dict[int, tuple[Keys, _Lineage]] = lay.memo.setdefault(_TABLES, {})
    known = tables.get(id(keys))
    if known is not None and known[0] is keys:
        return KeyTable(keys, known[1])
    lineage = _Lineage(keys)
    _remember(lay, keys, lineage)
    return KeyTable(keys, lineage)


def pages_with_key(lay: Layout, s: State, key: int) -> list[int]:
    """The page records whose `key` field is `key` (alive or not, committed or not),
    ascending: on a sparse state from an index of the key array, so the cost follows the
    pages with that key, not the pages in use."""
    arr: Any = s.key
    if isinstance(arr, SparseArray) and arr.default == NONE and key != NONE:
        index: PositionsByValue = lay.memo.setdefault("pages_by_key", PositionsByValue(NONE))
        return sorted(index.at(arr).get(key, ()))
    return [q for q in range(len(arr)) if arr[q] == key]


def remembered(lay: Layout) -> list[tuple[Keys, dict[tuple[int, ...], int], int]]:
    """Each `block_keys` tuple indexed for this layout, with its lineage's positions and
    length (read-only: what `speedcheck.key_tables` recomputes)."""
    tables: dict[int, tuple[Keys, _Lineage]] = lay.memo.get(_TABLES, {})
    return [(keys, lineage.at, lineage.length) for keys, lineage in tables.values()]


def key_index(lay: Layout) -> PositionsByValue | None:
    """The index of pages by key that `pages_with_key` keeps for this layout, if any."""
    found: PositionsByValue | None = lay.memo.get("pages_by_key")
    return found
