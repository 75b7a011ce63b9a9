"""Bugs the preset matrix could not reach: the default campaign's reach, tested.

Each bug here shows only in a part of the space that the matrix of presets left out
before configurations were drawn and the event log was checked in the lockstep
(issue 24): a second sliding window, sinks on the suspend/resume path, the event-log
writer. They are applied from outside the product (a patch of `impl/` names for the
duration of a `with`, in this process), never switched inside `impl/`; a campaign that
must see one runs in this process (`workers=1`).

`tests/quality/test_reach.py` requires the default campaign, with its example budget,
to kill each one within half of `matrix.DEFAULT_EXAMPLES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any

from kvpocket.impl import eventlog, kvcache
from kvpocket.model.config import LifeCycle, stale_range


@contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` inside the block, and what it was afterwards."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


# ---- the bugs ------------------------------------------------------------------------


def _first_window_only() -> AbstractContextManager[None]:
    """The resize fast path's bound (the next history at which a stale range moves) is
    computed from the first sliding window only; a second window of another size moves
    its stale range unseen until the first one moves, so its blocks stay locked."""
    correct = kvcache._next_stale_change

    def bound(lcs: Sequence[LifeCycle], h: int, t: int) -> int:
        first = [next(lc for lc in lcs if lc.window is not None)] \
            if any(lc.window is not None for lc in lcs) else []
        return correct(first, h, t)

    return patched(kvcache, "_next_stale_change", bound)


def _resume_forgets_sinks() -> AbstractContextManager[None]:
    """Resume works out which blocks are in the window without the sink tokens, so after
    a suspend the sink blocks are neither brought back nor locked."""
    correct_resume = kvcache.KVCache._resume

    def no_sinks(lc: LifeCycle, history: int, t: int) -> tuple[int, int]:
        return stale_range(replace(lc, sink_tokens=0), history, t)

    def resume(self: kvcache.KVCache, op: Any) -> None:
        with patched(kvcache, "stale_range", no_sinks):
            correct_resume(self, op)

    return patched(kvcache.KVCache, "_resume", resume)


def _log_failed_resize_as_success() -> AbstractContextManager[None]:
    """The event-log writer reports a resize that ran out of pages (rolled back) as having
    succeeded: the log says true where the manager returned a failed result."""
    correct = eventlog.EventLog.write

    def write(self: eventlog.EventLog, obj: dict[str, Any]) -> None:
        if obj.get("action") == "resize" and obj.get("result") is False:
            obj = {**obj, "result": True}
        correct(self, obj)

    return patched(eventlog.EventLog, "write", write)


@dataclass(frozen=True)
class ReachBug:
    name: str
    needs: str  # what part of the space the bug needs, which the preset matrix lacked
    description: str
    apply: Callable[[], AbstractContextManager[None]]


REACH_BUGS: dict[str, ReachBug] = {b.name: b for b in (
    ReachBug("two-windows-fast-path", "two sliding-window life cycles of different sizes",
             "the resize fast path's bound looks at the first sliding window only",
             _first_window_only),
    ReachBug("resume-forgets-sinks", "sink tokens, then suspend and resume",
             "resume decides the window without the sink tokens (sink blocks not locked)",
             _resume_forgets_sinks),
    ReachBug("eventlog-failed-resize-true", "the event log checked in the lockstep",
             "the event-log writer logs a resize that ran out of pages as successful",
             _log_failed_resize_as_success),
)}
