"""Bugs the preset matrix could not reach: the default campaign's reach, tested.

Each bug here shows only in a part of the space that the matrix of presets left out
before configurations were drawn and the event log was checked in the lockstep
(issue 24): a second sliding window, sinks on the suspend/resume path, the event-log
writer. Like every seeded bug they are source patches applied from outside the product
(`patches.py: BUGS`, under the same names), so spawned campaign workers get them too and
`kvpocket fuzz --mutant NAME` switches one on.

The second group was found by a fresh-eyes hunt (issue: bugs the kit reports as clean):
invented bugs of classes no seeded or zoo bug covers, run under the default campaign. These
four survived it, for two reasons. No check looked at what they break: the public views
(`block_entries`) and the counters were never compared with the model, so
`verify/conformance/views.py` now compares every view and counter after each step. Or no
rule reached the state they need: a block committed again onto a prefix-tree node whose
pages were all dropped, and a load-back into a full GPU with two pool groups, now the
rule `node_or_load_back` of `stateful.py` and two rare states every cell that can reach
them must reach.

The third group (issue 31) needs a path the campaigns reached too rarely or never: a
speed structure's rare path run with live entries (an eviction heap rebuilt while pages
are queued: the rule `churn_queue` and the check `selfcheck.eviction_heap`), and one
guard combination no run of 1,000 examples reached (the rule `guard_sweep`, and the
guard-combination family of rare states, `verify/conformance/guards.py`).

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
    ReachBug("block-entries-stale-edge", "the public views checked against the model",
             "block_entries reports the first out-of-window block (a block held for "
             "committing) as in the window"),
    ReachBug("rollback-keeps-counts", "the counters checked against the choices made",
             "a nested make-room attempt that is rolled back keeps its counts (evictions, "
             "migrations) in the counters"),
    ReachBug("recommit-node-unreferenced", "a block committed again onto a prefix-tree "
             "node whose pages were dropped",
             "commit reuses the node of a dropped block without referencing it, so the node "
             "can be pruned under the sequence that refers to it"),
    ReachBug("load-back-one-pool-group", "a load-back into a full GPU with two pool groups",
             "resume makes room for every page it brings back in pool group 0"),
    ReachBug("heap-compaction-drops-tickets", "an eviction heap compacted while entries are "
             "live, and its heap checked against its entries",
             "the eviction queue's heap, rebuilt when its lazy garbage outgrows the bound, "
             "keys each page by priority only: every live entry then looks stale, so the "
             "queue seems empty to the victim policy"),
    ReachBug("restop-full-pocket-forgets-slotless", "stop_committing tried on an ACTIVE "
             "sequence that stopped already, its pocket full, a parked page without its "
             "slot (guard combination)",
             "a repeated stop_committing 'makes room' in a full pocket by unlisting a parked "
             "page that lost its slot, which keeps its hold: the page leaks"),
)}
