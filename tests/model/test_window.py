"""Window arithmetic: block b is stale iff (b+1)*t <= h+1-w; sinks never leave."""

from __future__ import annotations

from kvpocket.model.config import LifeCycle, full_life_cycle, stale_range, swa_life_cycle


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
