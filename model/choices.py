"""The manager's free choices: every nondeterministic pick the spec makes, by kind.

The API programs (`api.py`) pick with `ex.choose(kind, ...)`; this table is the one list
of those kinds. The executors replay recorded ones (`executor.RecordedChooser`), the
event-log format accepts the recorded ones (`verify/traces/trace.py`), and the trace
checker searches the open ones a log leaves out (`verify/traces/tracecheck.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

SLOT = "slot"
VICTIM = "victim"
POCKET = "pocket"
BELOW = "below"
CLASH = "clash"
HIT = "hit"
REUSE = "reuse"
PAGE = "page"


@dataclass(frozen=True)
class ChoiceKind:
    name: str
    recorded: bool  # a manager makes it too, and an event log's `choices` may name its pick
    open: bool  # the safety spec accepts any legal pick (a policy, not a safety rule)
    defaulted: bool  # a log may leave it out: the first option, what managers did before
    doc: str


CHOICES: dict[str, ChoiceKind] = {c.name: c for c in (
    ChoiceKind(SLOT, True, True, False, "which free slot a new or moved page takes"),
    ChoiceKind(VICTIM, True, True, False, "which queued page eviction moves or drops"),
    ChoiceKind(POCKET, True, True, False, "which parked page a new block pops"),
    ChoiceKind(BELOW, False, True, False,
               "whether room is made one level down for a victim (else it is dropped, or "
               "the call fails)"),
    ChoiceKind(CLASH, True, True, True,
               "what commit does with a block whose key is committed: stop, or cache again"),
    ChoiceKind(HIT, True, True, False, "which cached copy of a block a prefix match reuses"),
    ChoiceKind(REUSE, True, True, True, "how many prompt tokens `create` reuses from the cache"),
    ChoiceKind(PAGE, False, False, False,
               "which dead page record a new page reuses (the model's own bookkeeping)"),
)}

RECORDED = tuple(k for k, c in CHOICES.items() if c.recorded)
OPEN = tuple(k for k, c in CHOICES.items() if c.open)
DEFAULTED = tuple(k for k, c in CHOICES.items() if c.defaulted)
