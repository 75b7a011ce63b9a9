"""Invariant checking that re-evaluates only what a step could have changed.

Invariant definitions never branch in Python on state values (`logic.py`: Z3 reads
them too), so the `State` fields a definition reads depend on the layout alone. They
are recorded once per layout by evaluating each definition on a state that notes every
field access. A `State` is immutable and an action replaces only the fields it writes,
so when every field an invariant read is the very same object as at its last check,
and it held then, it holds now: it is skipped. A violated invariant is re-checked at
every call, so it is reported as long as it stays violated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

from .config import KVConfig
from .fastcheck import FAST, LOCAL, Delta, EntryRefs, ReadRecorder
from .invariants import INVARIANTS, Invariant, Scope, in_scope
from .logic import CONCRETE
from .state import STATE_FIELDS, Layout, State

_FIELDS_READ: dict[KVConfig, dict[str, tuple[str, ...]]] = {}
MINIATURE = 2  # every count a miniature keeps (at most): each loop of a definition runs


def miniature(cfg: KVConfig) -> KVConfig:
    """The configuration with every count cut to MINIATURE (slots, sequences, blocks,
    pages), all else kept. A definition reads the same fields under both: its loops run
    over these counts, reading the same fields in every round, and its Python branches
    look at the life cycles, the pocket and positions within a round, which are kept
    (`tests/model/test_incremental.py` checks this on every preset and larger ones)."""
    return replace(
        cfg, slots_per_level=tuple(min(n, MINIATURE) for n in cfg.slots_per_level),
        num_sequences=min(cfg.num_sequences, MINIATURE),
        max_blocks=min(cfg.max_blocks, MINIATURE),
        max_pages=0 if cfg.pages_derived else min(cfg.max_pages, MINIATURE))


def fields_read(lay: Layout) -> dict[str, tuple[str, ...]]:
    """Per invariant, the `State` fields its definition reads under this layout (computed
    once per configuration: a campaign builds a model per example). They are read off the
    definitions evaluated on the initial state of the configuration's miniature, so the
    cost does not grow with the declared geometry."""
    known = _FIELDS_READ.get(lay.cfg)
    if known is not None:
        return known
    out = fields_read_by_evaluation(Layout(miniature(lay.cfg)))
    _FIELDS_READ[lay.cfg] = out
    return out


def fields_read_by_evaluation(lay: Layout) -> dict[str, tuple[str, ...]]:
    """Per invariant, the fields its definition reads when evaluated on Init of `lay`."""
    out: dict[str, tuple[str, ...]] = {}
    for inv in INVARIANTS:
        rec = ReadRecorder(lay.initial_state())
        inv.predicate(CONCRETE, lay, rec)  # type: ignore[arg-type]
        out[inv.name] = tuple(sorted(rec.read))
    return out


class IncrementalChecker:
    """`violated(...)` for a run of states, skipping invariants whose inputs are unchanged.

    Each call compares the new state with the one checked last, field by field (by
    identity), once; an invariant that held last time and reads none of the changed
    fields holds still. (If it was skipped last time, it held the time before and its
    fields did not change since: by induction it held last time too.)
    """

    def __init__(self, lay: Layout) -> None:
        self.lay = lay
        self.reads = {name: frozenset(fields) for name, fields in fields_read(lay).items()}
        # Each invariant's check on plain values: its one-pass companion where there is one
        # (`fastcheck.py`, tested to agree exactly), else its definition.
        self._checks: dict[str, Callable[[State], object]] = {
            inv.name: (partial(FAST[inv.name], lay) if inv.name in FAST
                       else partial(inv.predicate, CONCRETE, lay)) for inv in INVARIANTS}
        self._last: State | None = None
        self._held: set[str] = set()  # invariants that held in `_last`
        self.skipped = 0
        self.evaluated = 0  # full checks
        self.local = 0  # checks of what changed only
        # Speed (the checker runs after every event): the invariants of each scope, and the
        # ones each set of changed fields may affect, are worked out once and remembered.
        self._in_scope: dict[Scope | None, tuple[Invariant, ...]] = {}
        self._affected: dict[frozenset[str], frozenset[str]] = {}
        self._refs = EntryRefs()  # which entries reference each page, kept up to date

    # read-only views of what the checker remembers (`speedcheck.incremental_held`)
    @property
    def last(self) -> State | None:
        """The state checked last."""
        return self._last

    @property
    def held(self) -> frozenset[str]:
        """The invariants the checker takes to hold in `last` (skipped while their fields
        stay the same objects)."""
        return frozenset(self._held)

    @property
    def refs(self) -> EntryRefs:
        """Which block entries reference each page, for the `entry` array it follows."""
        return self._refs

    def _scoped(self, scope: Scope | None) -> tuple[Invariant, ...]:
        found = self._in_scope.get(scope)
        if found is None:
            found = self._in_scope[scope] = tuple(i for i in INVARIANTS if in_scope(i, scope))
        return found

    def _affected_by(self, changed: frozenset[str]) -> frozenset[str]:
        found = self._affected.get(changed)
        if found is None:
            found = self._affected[changed] = frozenset(
                n for n, reads in self.reads.items() if reads & changed)
        return found

    def violated(self, s: State, scope: Scope | None = None) -> list[Invariant]:
        last = self._last
        if last is None:
            changed = frozenset(STATE_FIELDS)
            held: set[str] = set()
        else:
            old, new = last.__dict__, s.__dict__
            changed = frozenset(f for f in STATE_FIELDS if new[f] is not old[f])
            held = self._held - self._affected_by(changed)
        # invariants that held in `last` and whose inputs changed: on sparse states, only
        # what changed is looked at (`fastcheck.LOCAL`) where a check of that kind exists
        delta = None if last is None else Delta(last, s, changed, self._refs)
        bad: list[Invariant] = []
        scoped = self._scoped(scope)
        todo = [inv for inv in scoped if inv.name not in held]
        self.skipped += len(scoped) - len(todo)
        was_held = self._held
        for inv in todo:
            name = inv.name
            ok: bool | None = None
            local = LOCAL.get(name)
            if delta is not None and local is not None and name in was_held:
                ok = local(self.lay, s, delta)
                if ok is not None:
                    self.local += 1
            if ok is None:
                self.evaluated += 1
                ok = bool(self._checks[name](s))
            if not ok:
                bad.append(inv)
            else:
                held.add(name)
        self._last, self._held = s, held
        return bad
