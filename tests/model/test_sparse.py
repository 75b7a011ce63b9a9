"""The sparse state: a `SparseArray` reads like the tuple it stands for, whatever was
written in whatever order; a model on sparse arrays runs exactly like one on tuples; and
its size follows the positions in use, not the declared geometry (sizes, never seconds)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import random_calls

from kvpocket.model import Model
from kvpocket.model.executor import Candidates, LookupLabel
from kvpocket.model.logic import CONCRETE, any_equal, count_equal, replace_equal
from kvpocket.model.sparse import SparseArray, used_items, values_in
from kvpocket.model.state import STATE_FIELDS
from kvpocket.verify.presets import PRESETS, preset
from kvpocket.verify.traces.trace import EVENTS_KIND, parse_events, with_end_marker
from kvpocket.verify.traces.tracecheck import EventChecker, check_events

writes = st.lists(st.tuples(st.integers(0, 299), st.integers(-1, 3)), max_size=400)


@settings(max_examples=60, deadline=None)
@given(writes=writes, seg=st.integers(1, 299))
def test_reads_like_the_tuple_it_stands_for(writes: list[tuple[int, int]], seg: int) -> None:
    arr = SparseArray(300, -1, segments=(0, seg))
    ref = [-1] * 300
    versions = [(arr, tuple(ref))]
    for i, v in writes:
        arr, ref[i] = arr.set(i, v), v
        versions.append((arr, tuple(ref)))
    for a, t in versions:  # every version is intact (persistence)
        assert a == t and tuple(a) == t and len(a) == len(t)
        assert a[-1] == t[-1] and a[3:9] == t[3:9]
        assert values_in(a, range(seg // 2, seg)) == list(t[seg // 2:seg])
        assert dict(used_items(a, -1)) == {i: v for i, v in enumerate(t) if v != -1}
        assert a.count_used_in(range(0, seg)) == sum(1 for v in t[:seg] if v != -1)
        assert a.count_used_in(range(seg, 300)) == sum(1 for v in t[seg:] if v != -1)
        assert count_equal(CONCRETE, a, range(0, seg), -1) == t[:seg].count(-1)
        assert count_equal(CONCRETE, a, range(5, 50), 2) == t[5:50].count(2)
        assert any_equal(CONCRETE, a, 3) == (3 in t)
        assert tuple(replace_equal(CONCRETE, a, 2, -1)) == tuple(-1 if v == 2 else v for v in t)
        # a range longer than what is stored is read among the stored positions
        for r in (range(0, 300), range(seg // 2, seg), range(7, 9)):
            assert a.used_in(r) == [i for i in r if t[i] != -1]
        assert CONCRETE.all_over(a, lambda x: x < 3) == all(x < 3 for x in t)
        assert CONCRETE.any_over(a, lambda x: x == -1) == (-1 in t)
    rebuilt = SparseArray(300, -1, {i: v for i, v in enumerate(ref)})
    assert rebuilt == arr and hash(rebuilt) == hash(arr)  # equal whatever the history


@settings(max_examples=60, deadline=None)
@given(writes=st.lists(st.tuples(st.integers(0, 39), st.booleans(), st.booleans()), max_size=200))
def test_default_positions_are_the_unused_ones_after_any_writes(
        writes: list[tuple[int, bool, bool]]) -> None:
    """The remembered lowest unused position follows writes either way (a used position
    freed below it, the lowest one taken), read or not between writes, on every version."""
    arr = SparseArray(40, False)
    versions = [arr]
    for i, value, read in writes:
        arr = arr.set(i, value)
        versions.append(arr)
        if read:
            assert list(arr.default_positions()) == [k for k in range(40) if not arr[k]]
    for a in versions:  # older versions keep their own answer
        assert list(a.default_positions()) == [k for k in range(40) if not a[k]]


@settings(max_examples=60, deadline=None)
@given(before=writes, after=writes)
def test_changed_since_names_every_position_that_differs(
        before: list[tuple[int, int]], after: list[tuple[int, int]]) -> None:
    old = SparseArray(300, -1)
    for i, v in before:
        old = old.set(i, v)
    new = old
    for i, v in after:
        new = new.set(i, v)
    differ = {i for i in range(300) if old[i] != new[i]}
    changed = new.changed_since(old)
    # known across up to _MAX_FOLDS folds (400 writes fold at most 13 times): an event that
    # stores hundreds of times is still checked locally
    assert changed is not None
    assert differ <= changed
    if not before and len(after) <= 32:  # a fresh `old` and too few writes to fold since:
        # known, and only the positions written (after a fold it is a superset, above)
        assert changed is not None and changed <= {i for i, _ in after}


@settings(max_examples=15, deadline=None)
@given(name=st.sampled_from(sorted(PRESETS)), seed=st.integers(0, 10_000))
def test_a_sparse_model_runs_exactly_like_a_tuple_model(name: str, seed: int) -> None:
    cfg = PRESETS[name].config
    sparse, dense = Model(cfg, sparse_above=0), Model(cfg, sparse_above=1 << 62)
    assert isinstance(sparse.state.slot_owner, SparseArray)
    assert isinstance(dense.state.slot_owner, tuple)
    for _, _ in zip(random_calls(sparse, seed, 40), random_calls(dense, seed, 40),
                    strict=True):
        for f in STATE_FIELDS:
            a, b = getattr(sparse.state, f), getattr(dense.state, f)
            assert (tuple(a) if isinstance(a, SparseArray) else a) == b, f
        assert sparse.last_choices == dense.last_choices
        assert sparse.violations() == dense.violations() == []


def _header_only(slots_per_level: int) -> list[str]:
    cfg = replace(preset("two-level"), slots_per_level=(slots_per_level,) * 2, max_pages=0)
    header = json.dumps({"kvpocket_trace": 1, "kind": EVENTS_KIND, "config": cfg.to_json(),
                         "source": "test", "policy": "revalidate"})
    return with_end_marker([header])


def test_start_up_stores_nothing_per_declared_slot() -> None:
    # The validated maximum, 2**24 slots per level (2**25 page records): the checker's
    # state has every declared length and stores no position at all.
    lines = _header_only(1 << 24)
    assert check_events(parse_events(lines)).ok
    checker = EventChecker(parse_events(lines).config)
    state = checker.model.state
    arrays = [v for v in vars(state).values() if isinstance(v, SparseArray)]
    assert {len(a) for a in arrays} >= {1 << 25}
    assert sum(len(a.used()) for a in arrays) == 0


def test_a_run_at_real_geometry_stores_what_it_uses() -> None:
    # 100,000 slots per level: two sequences decoding 16 blocks each, suspended, then
    # pressure that asks for every GPU slot (the cascade visits every page). What is
    # stored is bounded by the pages used (16 fields each, at most), not by the slots.
    cfg = replace(preset("two-level"), slots_per_level=(100_000, 100_000), max_pages=0)
    m = Model(cfg)
    for seq in (0, 1):
        m.create(seq)
        assert m.resume(seq)
        for h in range(cfg.max_capacity):
            assert m.resize(seq, h + 1, h)
        m.suspend(seq)
    m.pressure(0, 0, 100_000)
    assert m.violations() == []
    pages = len(m.state.alive.used())  # type: ignore[attr-defined]
    stored = sum(len(a.used()) for a in vars(m.state).values() if isinstance(a, SparseArray))
    assert 0 < pages <= 2 * 16 * cfg.num_life_cycles
    assert stored <= 16 * pages
    assert m.state.slot_owner[random.Random(0).randrange(50_000, 100_000)] == -1


@given(want=st.integers(0, 9), named=st.one_of(st.none(), st.integers(-1, 12)))
@settings(max_examples=60, deadline=None)
def test_a_looked_up_label_finds_what_the_search_finds(want: int, named: int | None) -> None:
    """A recorded label is looked up (`LookupLabel`) instead of searched for: whatever the
    lookup answers (right, wrong, illegal, nothing), the candidate found is the one the
    search over every candidate finds, and the lookup is what answers when it is right."""
    legal = {1, 3, 4, 7, 8}
    labels = {c: (0, 0, 2 * c) for c in range(10)}
    asked: list[object] = []

    def lookup(label: object) -> int | None:
        asked.append(label)
        return named

    def found(label: Callable[[int], object]) -> int | None:
        return Candidates(range(10), legal.__contains__, label).find((0, 0, 2 * want))

    searched = found(labels.__getitem__)
    assert searched == (want if want in legal else None)
    assert found(LookupLabel(labels.__getitem__, lookup)) == searched and asked
    scanned: list[int] = []

    def counted(c: int) -> object:
        scanned.append(c)
        return labels[c]

    if named == want and want in legal:  # a right answer is checked, not searched for
        assert found(LookupLabel(counted, lookup)) == want and scanned == [want]


def test_the_programs_cost_what_a_sequence_uses_not_what_is_declared() -> None:
    # The same run on a configuration declaring 4 sequences of 16 blocks and on one
    # declaring 512 sequences of 4,096 blocks (a real manager's geometry): the API programs
    # read the same block entries and window decisions, as many times (they visit the
    # blocks a sequence holds or a resize moves, not every declared block or sequence).
    from kvpocket.model import api

    counted = ("_entry", "_stale", "_in_cap")

    def reads(num_sequences: int, max_blocks: int) -> dict[str, int]:
        cfg = replace(preset("two-level"), slots_per_level=(64, 64), num_sequences=num_sequences,
                      max_blocks=max_blocks, max_pages=0)
        m = Model(cfg)
        calls = dict.fromkeys(counted, 0)
        originals = {name: getattr(api, name) for name in counted}

        def counting(name: str) -> Callable[..., object]:
            def call(*args: object) -> object:
                calls[name] += 1
                return originals[name](*args)
            return call

        try:
            for name in counted:
                setattr(api, name, counting(name))
            m.create(3, [1, 0, 1])
            assert m.resume(3)
            for h in range(3, 24):
                assert m.resize(3, h + 1, h)
            m.commit(3, [1, 1])
            m.suspend(3)
            assert m.resume(3)
            m.stop_committing(3)
            assert m.resize(3, 30, 29)
            m.close(3)
        finally:
            for name, fn in originals.items():
                setattr(api, name, fn)
        assert m.violations() == []
        return calls

    small, large = reads(4, 16), reads(512, 4096)
    assert small == large and all(small.values())


def test_a_recorded_choice_is_looked_up_not_scanned_for() -> None:
    # A recorded slot at the end of a pool of 100,000, and a recorded victim named by its
    # location: the choice reads the legality of the named candidate only (before, the
    # candidates were scanned from the first to know that there is one: a full pool of 10^5
    # slots, or a list of every cached page, per allocation).
    from kvpocket.model.executor import ConcreteExecutor, RecordedChooser
    from kvpocket.model.state import Layout

    lay = Layout(replace(preset("two-level"), slots_per_level=(100_000, 100_000), max_pages=0))
    asked: list[int] = []

    def legal(x: int) -> bool:
        asked.append(x)
        return x >= 99_990

    chooser = RecordedChooser({"slot": [99_999], "victim": [(0, 0, 99_995)]}, by="label")
    ex = ConcreteExecutor(lay, lay.initial_state(), chooser)
    assert ex.choose("slot", range(100_000), legal) == 99_999
    assert asked == [99_999, 99_999]  # the lookup, then the chooser's own
    asked.clear()
    where = LookupLabel(lambda p: (0, 0, p), lambda w: w[2] if isinstance(w, tuple) else None)
    listed: list[int] = []

    def every_page() -> list[int]:
        listed.append(1)
        return list(range(100_000))

    assert ex.choose("victim", range(100_000), legal, where, among=every_page) == 99_995
    assert not listed and set(asked) == {99_995}
    # nothing recorded: the lowest legal candidate, found by a scan
    ex.chooser = RecordedChooser(None)
    assert ex.choose("victim", range(100_000), legal, where, among=every_page) == 99_990
    assert listed
