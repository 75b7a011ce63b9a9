"""Operation counters, per sequence and in total.

Counters are plain ints so that a snapshot is JSON-ready. An operation
accumulates into a `CounterDelta` and merges it only on success, so a
rolled-back operation leaves the counters untouched too.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, fields

COUNTER_NAMES = (
    "alloc_calls",  # slots taken from an allocator
    "releases",  # slots returned to an allocator
    "events_recorded",
    "cross_stream_waits",
    "pocket_parks",
    "pocket_pops",
    "pocket_refusals",
    "migrations",
    "drops",
    "evictions",
)


@dataclass
class Counters:
    alloc_calls: int = 0
    releases: int = 0
    events_recorded: int = 0
    cross_stream_waits: int = 0
    pocket_parks: int = 0
    pocket_pops: int = 0
    pocket_refusals: int = 0
    migrations: int = 0
    drops: int = 0
    evictions: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)) for f in fields(self)}

    def copy(self) -> Counters:
        return Counters(**self.as_dict())


@dataclass
class CounterDelta:
    """Pending increments of one operation: (counter name, seq id or None) -> n."""

    items: defaultdict[tuple[str, int | None], int] = field(
        default_factory=lambda: defaultdict(int)
    )

    def add(self, name: str, seq: int | None, n: int = 1) -> None:
        self.items[(name, seq)] += n


class CounterBook:
    """Totals plus one `Counters` per sequence (attributed work only)."""

    def __init__(self) -> None:
        self.total = Counters()
        self.per_seq: dict[int, Counters] = {}

    def merge(self, delta: CounterDelta) -> None:
        for (name, seq), n in delta.items.items():
            setattr(self.total, name, getattr(self.total, name) + n)
            if seq is not None:
                c = self.per_seq.get(seq)
                if c is None:
                    c = self.per_seq[seq] = Counters()
                setattr(c, name, getattr(c, name) + n)

    def of(self, seq: int | None = None) -> Counters:
        if seq is None:
            return self.total.copy()
        return self.per_seq.get(seq, Counters()).copy()
