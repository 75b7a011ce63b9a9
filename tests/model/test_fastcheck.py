"""The one-pass invariant companions agree exactly with the definitions Z3 reads,
on reachable states and on states with a field perturbed at random."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import perturb, reachable

from kvpocket.model.fastcheck import FAST
from kvpocket.model.invariants import INVARIANTS_BY_NAME
from kvpocket.model.logic import CONCRETE
from kvpocket.model.state import State
from kvpocket.verify.presets import PRESETS


@settings(max_examples=int(__import__("os").environ.get("KVPOCKET_FASTCHECK_EXAMPLES", "60")), deadline=None)
@given(preset=st.sampled_from(sorted(PRESETS)), seed=st.integers(0, 10_000),
       steps=st.integers(0, 40), mutations=st.integers(0, 3), sparse=st.booleans())
def test_fast_companions_agree(preset: str, seed: int, steps: int, mutations: int,
                               sparse: bool) -> None:
    m = reachable(preset, seed, steps, sparse)
    rng = random.Random(seed)
    s = m.state
    for _ in range(mutations):
        s = perturb(s, rng)
    for name, fast in FAST.items():
        assert fast(m.layout, s) == bool(
            INVARIANTS_BY_NAME[name].predicate(CONCRETE, m.layout, s)), name


@pytest.mark.parametrize("name", sorted(FAST))
def test_every_companion_names_an_invariant(name: str) -> None:
    assert name in INVARIANTS_BY_NAME


def test_a_drifted_companion_would_be_caught() -> None:
    # The agreement check has teeth: a companion that ignores pocket references disagrees.
    m = reachable("tiny", 3, 0)
    m.create(0)
    assert m.resume(0)
    m.stop_committing(0)
    for h in range(1, 5):
        assert m.resize(0, h + 1, h)
    assert any(p != -1 for p in m.state.pocket)

    def drifted(lay: object, s: State) -> bool:
        return all(s.holds[p] == sum(1 for e, lk in zip(s.entry, s.entry_locked, strict=True)
                                     if e == p and not lk) for p in range(len(s.alive)))

    truth = bool(INVARIANTS_BY_NAME["refcounts_match"].predicate(CONCRETE, m.layout, m.state))
    assert truth and not drifted(m.layout, m.state)


@pytest.mark.parametrize("order", ["any", "lru"])
@pytest.mark.parametrize("preset", ["two-level", "three-level", "split-pools"])
def test_victim_fast_path_agrees_with_the_definition(preset: str, order: str) -> None:
    """`api._victims_at` evaluates the victim guard once per call on concrete states;
    it must name exactly the pages the definition Z3 reads accepts, under the safety spec
    (any queued page) and under the `lru` profile (the queue head)."""
    from kvpocket.model.api import _victims_at
    from kvpocket.model.executor import ConcreteExecutor, LowestChooser
    from kvpocket.model.pages import pool_group, victim_cond

    heads = 0
    for seed, steps in [(seed, steps) for seed in range(6) for steps in range(20, 201, 20)]:
        m = reachable(preset, seed, steps, order=order)
        lay, s = m.layout, m.state
        ex = ConcreteExecutor(lay, s, LowestChooser())
        for level in range(m.cfg.num_levels):
            for pg in range(m.cfg.num_pool_groups):
                fast = _victims_at(ex, level, pg)
                for p in range(lay.pages):
                    slow = CONCRETE.and_(victim_cond(CONCRETE, lay, s, p)[1], s.level[p] == level,
                                         pool_group(CONCRETE, lay, s.lc[p]) == pg)
                    assert bool(fast(p)) == bool(slow), (preset, seed, level, pg, p)
                    heads += bool(slow)
    assert heads > 0, "the sampled states have queued pages"


def test_derived_checks_look_where_the_statement_can_fail() -> None:
    """The records a derived check visits are read off the one-page statement: a guard
    false at Init narrows them to the records its fields use; a guard true at Init (or
    none) leaves every field the statement reads; a guard that reads another domain (the
    pocket) leaves every record."""
    from kvpocket.model.fastcheck import _page_scope
    from kvpocket.model.invariants import ForEachPage
    from kvpocket.model.pages import in_pocket
    from kvpocket.model.state import Layout

    lay = Layout(PRESETS["two-level"].config)

    def where(name: str) -> tuple[str, ...] | None:
        form = INVARIANTS_BY_NAME[name].per_page
        assert form is not None, name
        return _page_scope(lay, name, form).where

    assert where("locked_at_gpu") == ("locks",)
    assert where("migrations_reserved") == ("dst_level",)
    assert where("no_migration_in_flight") == ("dst_level",)
    assert where("dead_pages_are_blank") == ("alive", "dst_level", "holds", "locks", "queued",
                                             "slot")
    odd = ForEachPage(when=lambda ops, lay, s, p: in_pocket(ops, s, p),
                      then=lambda ops, lay, s, p: s.alive[p])
    assert _page_scope(lay, "_odd", odd).where is None


def test_derived_entry_checks_look_where_the_statement_can_fail() -> None:
    """The entries a derived one-entry check visits: those where an entry field that decides
    the statement is in use (page fields are read through the entry, so an empty entry reads
    defaults); every entry when a sequence field decides it (a sequence alone can break it)."""
    from kvpocket.model.config import SeqStatus
    from kvpocket.model.fastcheck import _entry_scope
    from kvpocket.model.invariants import ForEachEntry
    from kvpocket.model.state import Layout

    lay = Layout(PRESETS["two-level"].config)

    def where(name: str) -> tuple[str, ...] | None:
        form = INVARIANTS_BY_NAME[name].per_entry
        assert form is not None, name
        got = _entry_scope(lay, name, form).where
        return None if got is None else tuple(f for f, _ in got)

    assert where("entries_are_live") == ("entry", "entry_locked")
    assert where("index_matches_locks") == ("entry", "entry_locked", "index")
    assert where("inactive_sequences_unlocked") == ("entry_locked",)
    assert where("gone_sequences_hold_nothing") == ("entry",)
    active_locks_all = ForEachEntry(
        when=lambda ops, lay, s, e: ops.eq(s.seq_status[e.seq], int(SeqStatus.ACTIVE)),
        then=lambda ops, lay, s, e: s.entry_locked[e.ix])
    assert _entry_scope(lay, "_odd", active_locks_all).where is None
