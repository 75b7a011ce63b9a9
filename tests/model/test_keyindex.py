"""The block-key indexes (`model/keyindex.py`) answer what a search would, on any version
of the persistent state asked in any order: interning on a tuple another tuple already
grew from, and the positions of each value of a sparse array read back and forth."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpocket.model.config import NONE, KVConfig
from kvpocket.model.keyindex import key_table
from kvpocket.model.sparse import PositionsByValue, SparseArray
from kvpocket.model.state import Layout
from kvpocket.verify.presets import PRESETS

Keys = tuple[tuple[int, ...], ...]
prefixes = st.lists(st.integers(0, 2), min_size=1, max_size=3).map(tuple)


def _layout() -> Layout:
    cfg: KVConfig = PRESETS["two-level"].config
    return Layout(cfg)


@settings(max_examples=80, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 50), st.lists(prefixes, max_size=4)),
                      max_size=30),
       asked=st.lists(prefixes, min_size=1, max_size=6))
def test_key_table_interns_as_a_list_search_would(
        steps: list[tuple[int, list[tuple[int, ...]]]], asked: list[tuple[int, ...]]) -> None:
    """From any earlier tuple (a rollback, another fitting state), interning finds an old
    key at its first position and appends a new one, as `list.index`/`append` did."""
    lay = _layout()
    versions: list[Keys] = [()]
    for pick, new in steps:
        base = versions[pick % len(versions)]
        table, ref = key_table(lay, base), list(base)
        for prefix in new:
            want = ref.index(prefix) if prefix in ref else len(ref)
            if want == len(ref):
                ref.append(prefix)
            assert table.intern(prefix) == want
        out = table.keys(lay)
        assert out == tuple(ref)
        versions.append(out)
    for keys in versions:
        table = key_table(lay, keys)
        for prefix in asked:
            assert table.find(prefix) == (keys.index(prefix) if prefix in keys else NONE)
        assert table.keys(lay) is keys  # nothing interned: the same tuple


@settings(max_examples=60, deadline=None)
@given(writes=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 60), st.integers(-1, 3)),
                       max_size=300),
       order=st.lists(st.integers(0, 400), min_size=1, max_size=40))
def test_positions_by_value_on_any_version_in_any_order(
        writes: list[tuple[int, int, int]], order: list[int]) -> None:
    """Versions written from one another (branching, past folds) are asked about in any
    order; each answer is every position holding each non-default value."""
    versions = [SparseArray(61, -1)]
    for pick, i, v in writes:
        versions.append(versions[pick % len(versions)].set(i, v))
    index = PositionsByValue(-1)
    for k in order:
        arr = versions[k % len(versions)]
        want: dict[int, set[int]] = {}
        for i, v in enumerate(arr):
            if v != -1:
                want.setdefault(v, set()).add(i)
        assert index.at(arr) == want
