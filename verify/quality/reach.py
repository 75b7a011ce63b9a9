"""Bugs the preset matrix could not reach: the default campaign's reach, tested.

Each bug here shows only in a part of the space that the matrix of presets left out
before configurations were drawn and the event log was checked in the lockstep
(issue 24): a second sliding window, sinks on the suspend/resume path, the event-log
writer. Like every seeded bug they are source patches applied from outside the product
(`patches.py: BUGS`, under the same names), so spawned campaign workers get them too and
`kvpocket fuzz --mutant NAME` switches one on.

`tests/quality/test_reach.py` requires the default campaign, with its example budget,
to kill each one within half of `matrix.DEFAULT_EXAMPLES`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

from kvpocket.verify.quality.patches import switched_on


@dataclass(frozen=True)
class ReachBug:
    name: str
    needs: str  # what part of the space the bug needs, which the preset matrix lacked
    description: str

    def apply(self) -> AbstractContextManager[None]:
        """The bug switched on for a `with` block (`patches.py` holds its edits)."""
        return switched_on(self.name)


REACH_BUGS: dict[str, ReachBug] = {b.name: b for b in (
    ReachBug("two-windows-fast-path", "two sliding-window life cycles of different sizes",
             "the resize fast path's bound looks at the first sliding window only"),
    ReachBug("resume-forgets-sinks", "sink tokens, then suspend and resume",
             "resume decides the window without the sink tokens (sink blocks not locked)"),
    ReachBug("eventlog-failed-resize-true", "the event log checked in the lockstep",
             "the event-log writer logs a resize that ran out of pages as successful"),
)}
