"""Window arithmetic: block b is stale iff (b+1)*t <= h+1-w; sinks never leave."""

from __future__ import annotations

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
