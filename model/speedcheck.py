"""Checks of the executable model's speed machinery against its plain meaning.

The model keeps a few structures for speed only (`incremental.py`'s memory of which
invariants held, the entry-by-page index it follows from state to state, the block-key
tables of `keyindex.py`, `api._resize_blocks`'s remembered answers, the sparse arrays of
`sparse.py`). Each check below recomputes what its structure claims from the primary
data (the state) and lists each disagreement; `SPEED_CHECKS` names them. The lockstep
runs them after every step (`verify/conformance/speed.py`), next to the implementation's
(`impl/selfcheck.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import api
from .executor import ConcreteExecutor, LowestChooser
from .fastcheck import FAST
from .invariants import INVARIANTS
from .keyindex import key_index, remembered
from .logic import CONCRETE
from .machine import Model
from .sparse import PositionsByValue, SparseArray, used_items

Check = Callable[[Model], list[str]]
_BY_NAME = {inv.name: inv for inv in INVARIANTS}


def incremental_held(m: Model, part: int = 0, parts: int = 1) -> list[str]:
    """Every invariant the incremental checker takes to hold in the state it checked last
    does hold there, by its full check (the one-pass form of `fastcheck.FAST` where there
    is one, tested to agree with the definition; else the definition): the skipping and
    the local checks are what is checked, not the definitions themselves). `part` of
    `parts`: only the invariants at those positions of the catalogue (a caller that checks
    after every step rotates through them: a remembered violation lasts until a step
    repairs the state, so it is met within `parts` steps)."""
    chk = m.checker
    last = chk.last
    if last is None:
        return []
    lay = m.layout
    return [f"{name} is remembered as holding in the last checked state, but does not"
            for i, name in enumerate(_BY_NAME) if i % parts == part and name in chk.held
            and not (FAST[name](lay, last) if name in FAST
                    else _BY_NAME[name].predicate(CONCRETE, lay, last))]


def _positions(index: PositionsByValue, what: str) -> list[str]:
    arr = index.array
    if arr is None:
        return []
    want: dict[Any, set[int]] = {}
    for i, v in used_items(arr, index.default):
        want.setdefault(v, set()).add(i)
    if index.positions != want:
        wrong = sorted(k for k in set(want) | set(index.positions)
                       if want.get(k) != index.positions.get(k))
        return [f"{what} differs from its array at values {wrong[:6]}"]
    return []


def entry_refs(m: Model) -> list[str]:
    """The incremental checker's entries-by-page index against the `entry` array it says
    it describes."""
    return _positions(m.checker.refs, "entries by page")


def key_tables(m: Model) -> list[str]:
    """Each remembered block-key table: a key's position is its first position in the
    tuple, every key of the tuple is found, and none found beyond it."""
    bad: list[str] = []
    for keys, at, length in remembered(m.layout):
        first: dict[tuple[int, ...], int] = {}
        for i, k in enumerate(keys):
            first.setdefault(k, i)
        seen = {k: i for k, i in at.items() if 0 <= i < len(keys)}
        if seen != first or length < len(keys):
            wrong = sorted(set(seen.items()) ^ set(first.items()))
            bad.append(f"block-key table of {len(keys)} keys (lineage length {length}) "
                       f"differs from its tuple at {wrong[:3]}")
    index = key_index(m.layout)
    if index is not None:
        bad += _positions(index, "pages by key")
    return bad


def resize_memo(m: Model, seen: set[tuple[Any, ...]] | None = None) -> list[str]:
    """Each remembered resize answer (blocks leaving, shrinking, growing, and the order a
    phase visits them) equals the rule's over every block; `seen`: keys checked before
    (each answer is remembered unchanged, so it is checked once)."""
    memo: dict[tuple[Any, ...], Any] = m.layout.memo.get("resize_blocks", {})
    bad: list[str] = []
    ex = ConcreteExecutor(m.layout, m.state, LowestChooser())
    for key, (conds, visits) in list(memo.items()):
        if seen is not None:
            if key in seen:
                continue
            seen.add(key)
        old_cap, cap, old_h, h = key
        plain_conds, plain_visits = api._resize_blocks(ex, old_cap, cap, old_h, h,
                                                       remember=False)
        same = visits == plain_visits and all(
            {k: c[k] for k in v} == {k: p[k] for k in pv}
            for c, v, p, pv in zip(conds, visits, plain_conds, plain_visits, strict=True))
        if not same:
            bad.append(f"resize (capacity {key[0]} -> {key[1]}, history {key[2]} -> "
                       f"{key[3]}): remembered visits {visits}, the rule's {plain_visits}")
    return bad


def _sparse_ok(name: str, arr: SparseArray) -> list[str]:
    used = dict(arr.items())
    counts = [sum(1 for i in used if lo <= i < hi) for lo, hi in
              zip(arr.segments, (*arr.segments[1:], arr.length), strict=True)]
    bad = []
    if [arr.count_used_in(range(lo, hi)) for lo, hi in
            zip(arr.segments, (*arr.segments[1:], arr.length), strict=True)] != counts:
        bad.append(f"{name}: segment counts differ from the stored positions {counts}")
    lowest = next((i for i in range(arr.length) if i not in used), arr.length)
    if next(arr.default_positions(), arr.length) != lowest:
        bad.append(f"{name}: lowest default position is {lowest}, the array says "
                   f"{next(arr.default_positions(), arr.length)}")
    if hash(arr) != hash((arr.length, frozenset(used.items()))):
        bad.append(f"{name}: remembered hash differs from its values'")
    return bad


def sparse_arrays(m: Model) -> list[str]:
    """Each sparse array of the state: its per-segment counts, its lowest default position
    and its remembered hash against its stored values."""
    bad: list[str] = []
    for name, value in vars(m.state).items():
        if isinstance(value, SparseArray):
            bad += _sparse_ok(name, value)
    return bad


SPEED_CHECKS: dict[str, Check] = {
    "incremental checker's memory": incremental_held,
    "entries-by-page index": entry_refs,
    "block-key tables": key_tables,
    "remembered resize answers": resize_memo,
    "sparse arrays": sparse_arrays,
}


def check_speed_structures(m: Model, checks: Sequence[str] | None = None) -> list[str]:
    """Every model speed structure's disagreements, each line led by its name."""
    return [f"{name}: {line}" for name, check in SPEED_CHECKS.items()
            if checks is None or name in checks for line in check(m)]
