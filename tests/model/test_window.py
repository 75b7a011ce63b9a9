"""Window arithmetic: block b is stale iff (b+1)*t <= h+1-w; sinks never leave."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpocket.model.api import WINDOW_START
from kvpocket.model.config import (
    KVConfig,
    LifeCycle,
    full_life_cycle,
    stale_range,
    swa_life_cycle,
)
from kvpocket.model.logic import CONCRETE
from kvpocket.model.overrides import overriding
from kvpocket.model.state import stale


def test_upstream_examples() -> None:
    lc = swa_life_cycle(window=128)
    assert stale_range(lc, 255, 32) == (0, 4)
    assert stale_range(lc, 256, 32) == (0, 4)
    assert stale_range(lc, 286, 32) == (0, 4)
    assert stale_range(lc, 287, 32) == (0, 5)


def test_block_leaves_exactly_when_history_reaches_boundary() -> None:
    lc = swa_life_cycle(window=5)
    t = 2
    for b in range(6):
        leave = (b + 1) * t + 5 - 1
        assert not stale_range(lc, leave - 1, t)[0] <= b < stale_range(lc, leave - 1, t)[1]
        start, end = stale_range(lc, leave, t)
        assert start <= b < end


def test_sinks_never_leave_and_full_attention_has_no_window() -> None:
    lc = LifeCycle("swa", window=4, sink_tokens=3)
    start, end = stale_range(lc, 100, 2)
    assert start == 2 and end > start
    assert stale_range(full_life_cycle(), 1000, 2) == (0, 0)


def test_the_window_rule_agrees_with_its_closed_form() -> None:
    """`state.stale` (read by the API programs and the invariants, on values or on Z3
    terms) and `config.stale_range` (its closed form, which the impl reads) agree."""
    lcs = (LifeCycle("sink", window=5, sink_tokens=3), LifeCycle("w4", window=4),
           LifeCycle("w1", window=1), full_life_cycle())
    for t in (1, 2, 3):
        cfg = KVConfig(life_cycles=lcs, tokens_per_block=t)
        for lc_i, lc in enumerate(lcs):
            for h in range(40):
                start, end = stale_range(lc, h, t)
                for o in range(16):
                    assert stale(CONCRETE, cfg, lc_i, o, h) == (start <= o < end), (lc, t, h, o)


def test_a_window_override_moves_the_programs_rule_only() -> None:
    """The spec mutant of the window start changes what the API programs decide, not the
    invariant that checks them (it reads the rule without the label)."""
    cfg = KVConfig(life_cycles=(swa_life_cycle(window=4),), tokens_per_block=2)
    # block 0 (tokens 0, 1) leaves the window at h = 5: start = h + 1 - 4 = 2
    assert stale(CONCRETE, cfg, 0, 0, 5, start_label=WINDOW_START)
    with overriding({WINDOW_START: ("add", -1)}):
        assert not stale(CONCRETE, cfg, 0, 0, 5, start_label=WINDOW_START)
        assert stale(CONCRETE, cfg, 0, 0, 5)


@settings(max_examples=200, deadline=None)
@given(window=st.integers(1, 9), sink=st.integers(0, 5), t=st.integers(1, 4),
       lengths=st.lists(st.integers(0, 40), min_size=4, max_size=4))
def test_resize_visits_only_the_blocks_that_move(window: int, sink: int, t: int,
                                                 lengths: list[int]) -> None:
    # On plain values `api._resize_blocks` looks only at the blocks between the old and
    # the new lengths (read off the closed form `stale_range`); the blocks it visits, and
    # their conditions, are those of the whole pass over every block (what it computes
    # under an override, which the narrowing must not use).
    from dataclasses import replace

    from kvpocket.model.api import _resize_blocks
    from kvpocket.model.executor import ConcreteExecutor, LowestChooser
    from kvpocket.model.state import Layout
    from kvpocket.verify.presets import PRESETS

    base = PRESETS["two-level"].config
    cfg = replace(base, tokens_per_block=t, max_blocks=12, life_cycles=(
        LifeCycle("swa", window=window, sink_tokens=sink), full_life_cycle()))
    old_h, h, old_cap, cap = sorted(lengths)  # old_h <= h, each history within its capacity
    old_cap, cap = min(old_cap, cfg.max_capacity), min(cap, cfg.max_capacity)
    old_h, h = min(old_h, old_cap), min(h, cap)
    if old_h > h:
        return
    lay = Layout(cfg)
    ex = ConcreteExecutor(lay, lay.initial_state(), LowestChooser())
    narrow = _resize_blocks(ex, old_cap, cap, old_h, h)
    with overriding({WINDOW_START: ("add", 0)}):  # the same rule, every block looked at
        whole = _resize_blocks(ex, old_cap, cap, old_h, h)
    assert narrow[1] == whole[1]
    for conds, visits, every in zip(narrow[0], narrow[1], whole[0], strict=True):
        assert {k: conds[k] for k in visits} == {k: every[k] for k in visits}
