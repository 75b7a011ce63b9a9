"""The incremental invariant checker skips only what cannot have changed: the fields a
definition reads do not depend on the state, and over a run of reachable and corrupted
states it reports exactly what the full check reports."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import perturb, random_calls, reachable

from kvpocket.model.config import NONE, SeqStatus
from kvpocket.model.fastcheck import ReadRecorder, violated
from kvpocket.model.incremental import (
    IncrementalChecker,
    fields_read,
    fields_read_by_evaluation,
    miniature,
)
from kvpocket.model.invariants import INVARIANTS
from kvpocket.model.logic import CONCRETE
from kvpocket.model.machine import Model
from kvpocket.model.sparse import SparseArray
from kvpocket.model.state import Layout, State, evolve
from kvpocket.verify.presets import PRESETS


@settings(max_examples=30, deadline=None)
@given(preset=st.sampled_from(sorted(PRESETS)), seed=st.integers(0, 10_000),
       steps=st.integers(0, 40), mutations=st.integers(0, 3))
def test_fields_read_do_not_depend_on_the_state(preset: str, seed: int, steps: int,
                                                mutations: int) -> None:
    m = reachable(preset, seed, steps)
    rng = random.Random(seed)
    s = m.state
    for _ in range(mutations):
        s = perturb(s, rng)
    expected = fields_read(m.layout)
    for inv in INVARIANTS:
        rec = ReadRecorder(s)
        inv.predicate(CONCRETE, m.layout, rec)  # type: ignore[arg-type]
        assert tuple(sorted(rec.read)) == expected[inv.name], inv.name


@settings(max_examples=30, deadline=None)
@given(preset=st.sampled_from(sorted(PRESETS)), seed=st.integers(0, 10_000))
def test_agrees_with_the_full_check_over_a_run(preset: str, seed: int) -> None:
    rng = random.Random(seed)
    m = reachable(preset, seed, 0)
    checker = IncrementalChecker(m.layout)
    states: list[State] = []
    for k in range(1, 25):  # a run with corrupted states mixed in (and recovering)
        s = reachable(preset, seed, k).state
        states.append(perturb(s, rng) if rng.random() < 0.3 else s)
    states += [states[0], states[0]]  # an unchanged state is skipped, a violation repeats
    for s in states:
        for scope in ("api", "step"):
            assert checker.violated(s, scope) == violated(CONCRETE, m.layout, s, scope)


def test_it_skips_when_nothing_read_changed() -> None:
    lay = Layout(PRESETS["tiny"].config)
    s = lay.initial_state()
    checker = IncrementalChecker(lay)
    assert checker.violated(s) == []
    evaluated = checker.evaluated
    assert checker.violated(s) == [] and checker.evaluated == evaluated
    assert checker.skipped >= len(INVARIANTS)


@settings(max_examples=25, deadline=None)
@given(preset=st.sampled_from(sorted(PRESETS)), seed=st.integers(0, 10_000))
def test_checks_of_what_changed_agree_with_the_full_check(preset: str, seed: int) -> None:
    # One run of sparse states (every array a SparseArray, so each state knows what it
    # wrote since the last), with corrupted states derived from them mixed in: the checks
    # of what changed (fastcheck.LOCAL) report exactly what the full check reports.
    rng = random.Random(seed)
    m = reachable(preset, seed, 0, sparse=True)
    checker = IncrementalChecker(m.layout)
    for _ in random_calls(m, seed, 30):
        s = m.state
        if rng.random() < 0.3:
            s = perturb(s, rng)
        for scope in ("api", "step"):
            assert checker.violated(s, scope) == violated(CONCRETE, m.layout, s, scope)
    assert checker.local > 0  # the checks of what changed ran


def test_fields_read_off_the_miniature_are_the_fields_read() -> None:
    # fields_read evaluates the definitions on a miniature of the configuration (start-up
    # must not grow with the declared geometry); on every preset, and on each with larger
    # counts, the miniature's fields are the configuration's own.
    for p in PRESETS.values():
        bigger = replace(p.config, max_blocks=p.config.max_blocks + 5, num_sequences=3,
                         slots_per_level=tuple(n + 3 for n in p.config.slots_per_level),
                         max_pages=0)
        for cfg in (p.config, bigger):
            assert miniature(cfg) != cfg
            assert fields_read_by_evaluation(Layout(miniature(cfg))) == \
                fields_read_by_evaluation(Layout(cfg)), p.name


def _store(arr: Sequence[Any], i: int, value: object) -> SparseArray:
    assert isinstance(arr, SparseArray)  # the models below keep every array sparse
    return arr.set(i, value)


@given(shift=st.integers(-3, 3), grow=st.integers(-3, 3))
@settings(max_examples=30, deadline=None)
def test_lengths_changed_alone_are_rechecked_where_blocks_change_sides(shift: int,
                                                                        grow: int) -> None:
    # A resize per decoded token re-checks only the blocks that crossed the capacity or
    # the window's edge (`fastcheck._window_moved`). Here only the lengths change, no entry
    # with them (a window or capacity off by one or more): the local check must see it.
    m = Model(replace(PRESETS["two-level"].config, slots_per_level=(40, 40)), sparse_above=0)
    m.create(0, [1, 2])
    assert m.resume(0) and m.resize(0, 9, 8)  # 2 tokens per block, SWA window 3
    checker = IncrementalChecker(m.layout)
    assert checker.violated(m.state) == []
    s = m.state
    moved = evolve(s, history=_store(s.history, 0, s.history[0] + shift),
                   capacity=_store(s.capacity, 0, s.capacity[0] + grow))
    assert checker.violated(moved) == violated(CONCRETE, m.layout, moved)
    if shift >= 2 or abs(grow) >= 2:  # a block left the window, or crossed the capacity
        assert "window_is_mapped" in {i.name for i in checker.violated(moved)}
    if (shift, grow) != (0, 0):
        assert checker.local > 0  # the check of what changed ran


def test_entry_and_status_corruptions_are_caught_by_the_local_checks() -> None:
    # The local checks of the entry-wide invariants (a sequence's status against its
    # blocks and locks, a parked page that a block references) look at the changed
    # entries and sequences only: each corruption of that kind is still reported.
    m = Model(PRESETS["tiny"].config.with_pocket(True, "revalidate"), sparse_above=0)
    m.create(0, [1, 2])
    assert m.resume(0)
    m.stop_committing(0)
    assert m.resize(0, 4, 3) and m.resize(0, 6, 5)  # block 0 left the window: parked
    s, lay = m.state, m.layout
    parked = [p for p in s.pocket if p != NONE]
    assert parked and violated(CONCRETE, lay, s) == []
    at = next(k for k, p in enumerate(s.pocket) if p != NONE)
    assert (at + 1) % lay.pocket_cap and s.pocket[at + 1] == NONE  # room behind it
    suspended = evolve(s, seq_status=_store(s.seq_status, 0, int(SeqStatus.SUSPENDED)))
    wrong = {"gone_sequences_hold_nothing": evolve(
                 s, seq_status=_store(s.seq_status, 0, int(SeqStatus.CLOSED))),
             "inactive_sequences_unlocked": suspended,
             "pocket_entries_orphaned": evolve(
                 s, entry=_store(s.entry, lay.entry_ix(CONCRETE, 1, 0, 3), parked[0])),
             # the one-sequence invariants (`invariants.ForEachSeq`)
             "inactive_pockets_empty": suspended,
             "lengths_ordered": evolve(
                 s, committed_tokens=_store(s.committed_tokens, 0, s.history[0] + 1)),
             "pocket_packed_and_bounded": evolve(s, pocket=_store(s.pocket, at + 1, s.pocket[at]))}
    for name, bad in wrong.items():
        checker = IncrementalChecker(lay)
        assert checker.violated(s) == []
        found = checker.violated(bad)
        assert found == violated(CONCRETE, lay, bad)
        assert name in {i.name for i in found}


def test_many_declared_sequences_need_no_sequence_wide_check() -> None:
    # A real manager declares hundreds of sequences and runs a few: after the first check,
    # the one-sequence invariants are re-checked on the sequences an event touched only
    # (their full check, over every sequence in use, never runs again).
    from kvpocket.model.invariants import INVARIANTS_BY_NAME

    cfg = replace(PRESETS["tiny"].config.with_pocket(True, "revalidate"), num_sequences=300,
                  max_pages=0)
    m = Model(cfg)  # 300 sequences: the sequence arrays are sparse
    assert isinstance(m.state.capacity, SparseArray)
    checker = IncrementalChecker(m.layout)
    assert checker.violated(m.state) == []
    per_seq = [n for n, inv in INVARIANTS_BY_NAME.items() if inv.per_seq is not None]
    assert {"lengths_ordered", "inactive_pockets_empty", "pocket_packed_and_bounded"} <= set(per_seq)

    def whole(s: State) -> bool:
        raise AssertionError("a sequence-wide check ran")

    for name in per_seq:
        checker._checks[name] = whole
    calls: list[tuple[str, dict[str, Any]]] = [
        ("create", {"seq": 5, "prompt": [1, 2]}), ("resume", {"seq": 5}),
        ("stop_committing", {"seq": 5}), ("resize", {"seq": 5, "capacity": 4, "history": 3}),
        ("resize", {"seq": 5, "capacity": 6, "history": 5}),  # a block leaves: parked
        ("create", {"seq": 299, "prompt": []}), ("resume", {"seq": 299}),
        ("resize", {"seq": 299, "capacity": 2, "history": 1}), ("suspend", {"seq": 5}),
        ("resume", {"seq": 5}), ("close", {"seq": 299}), ("close", {"seq": 5})]
    parked = False
    for name, params in calls:
        m.run(name, params)
        parked = parked or any(p != NONE for p in m.state.pocket)
        assert checker.violated(m.state) == violated(CONCRETE, m.layout, m.state) == []
    assert parked and checker.local > 0
