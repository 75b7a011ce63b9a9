"""The sliding window as the manager computes it.

This is the manager's own arithmetic, written from token positions, apart from the spec's
closed form (`model.config.stale_range`): were impl/ to borrow the spec's formula, a wrong
window would be wrong in both and the lockstep could not see it. The lockstep compares
the two readings on every step (the pages each one locks), and
`tests/impl/test_window_arithmetic.py` compares them directly over a grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class WindowRule(Protocol):
    """What the arithmetic reads of a life cycle (`model.config.LifeCycle` has both)."""

    @property
    def window(self) -> int | None: ...

    @property
    def sink_tokens(self) -> int: ...


def out_of_window(lc: WindowRule, history: int, tokens_per_block: int) -> tuple[int, int]:
    """The blocks `[first, end)` that attention no longer reads once `history` tokens are
    written and the token at position `history` is being computed.

    Attention at position h reads the sink tokens `[0, sink)` and the window's tokens
    `[h + 1 - w, h]`. A block leaves when it holds no sink token (it starts at or after the
    first block that has none) and its last token lies before the window's first. An empty
    range may start anywhere: callers read it as a set of blocks."""
    t = tokens_per_block
    first_without_sink = (lc.sink_tokens + t - 1) // t
    if lc.window is None:
        return first_without_sink, first_without_sink
    first_read = history + 1 - lc.window
    blocks_before = first_read // t if first_read > 0 else 0  # every token < first_read
    return first_without_sink, max(first_without_sink, blocks_before)


def next_window_move(lcs: Sequence[WindowRule], history: int, tokens_per_block: int) -> int:
    """A history above `history` below which no life cycle's out-of-window blocks change
    (a lower bound: a `resize` that stays below it moves no page). With the window's first
    token at h + 1 - w, block b leaves at the first h with (b + 1) * t <= h + 1 - w."""
    t = tokens_per_block
    best = 1 << 62
    for lc in lcs:
        if lc.window is None:
            continue
        _, end = out_of_window(lc, history, t)
        best = min(best, (end + 1) * t + lc.window - 1)
    return max(best, history + 1)
