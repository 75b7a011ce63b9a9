"""How API programs run: the executor interface and its concrete interpretation.

API actions (`model/api.py`) are programs over page actions. They never branch
with Python `if` on state; they use `ex.when(cond)` (a loop that runs its body
zero or one time), `ex.choose(...)` for every nondeterministic pick, and
`ex.fail(...)` for OutOfPages. `ConcreteExecutor` runs them on plain values;
a symbolic executor (`kvpocket.verify`) unrolls the same programs for Z3.
A choice may say which legal candidates are interchangeable (`same`: equal
keys lead to states equal up to renaming); the concrete executor offers them
all unless told to reduce symmetry, and the bounded searches (symbolic and
explicit) try only the lowest of each kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, NoReturn, Protocol

from .errors import ChoiceRejected, GuardViolation, MissingChoice, OutOfPages, UsageError
from .logic import CONCRETE, Ops, Term
from .pages import PAGE_ACTIONS
from .state import Layout, State


class Chooser(Protocol):
    """Picks among the legal candidates of a choice (all candidates satisfy the guard).

    `labels[i]` names `candidates[i]` in terms both sides share (a slot id, or the
    (level, pool group, slot) a page sits in), so recorded choices can be replayed.
    """

    def choose(self, kind: str, candidates: list[int], labels: list[object]) -> int: ...


class LowestChooser:
    """The default: deterministic, the first legal candidate (lowest id, FIFO position)."""

    def choose(self, kind: str, candidates: list[int], labels: list[object]) -> int:
        return candidates[0]


# The choices an implementation makes too (and records); "page" (which dead page record a
# new page reuses) is the model's own bookkeeping.
CHOICE_KINDS = ("slot", "victim", "pocket")
OnMissing = Literal["lowest", "note", "raise"]


@dataclass
class RecordedChooser:
    """Replays recorded choices, by kind, in order: the one chooser every engine uses.

    `by="label"` matches a recorded label (a slot id, or the (level, pool group, slot) a
    page sits in) against the candidates' labels, for the kinds in `CHOICE_KINDS` (a
    lockstep step, an event log); `by="candidate"` matches candidate ids, for every kind
    (a model trace). `script=None` records nothing: the lowest candidate everywhere.
    When the model makes a scripted kind of choice the record has no more of,
    `on_missing` says what happens: "lowest" takes the first candidate, "note" takes it and
    notes the mismatch in `unmatched`, "raise" raises `MissingChoice`. A recorded choice
    that is not legal raises `ChoiceRejected`.
    """

    script: dict[str, list[object]] | None = None
    by: Literal["label", "candidate"] = "label"
    on_missing: OnMissing = "lowest"
    unmatched: list[str] = field(default_factory=list)

    def choose(self, kind: str, candidates: list[int], labels: list[object]) -> int:
        if self.script is None or (self.by == "label" and kind not in CHOICE_KINDS):
            return candidates[0]
        queue = self.script.get(kind)
        if not queue:
            if self.on_missing == "raise":
                raise MissingChoice(kind, labels)
            if self.on_missing == "note":
                self.unmatched.append(f"the model chose a {kind} the record does not have")
            return candidates[0]
        want = _norm(queue.pop(0))
        keys = [_norm(x) for x in (labels if self.by == "label" else candidates)]
        for c, key in zip(candidates, keys, strict=True):
            if key == want:
                return c
        raise ChoiceRejected(kind, want, keys)

    def left(self) -> dict[str, list[object]]:
        """Recorded choices the model did not make."""
        return {k: v for k, v in (self.script or {}).items() if v}


def _norm(label: object) -> object:
    if isinstance(label, (tuple, list)):
        return tuple(int(x) for x in label)
    return int(label) if isinstance(label, int) else label


class Executor(Protocol):
    ops: Ops
    lay: Layout
    s: State

    def do(self, action: str, **params: Term) -> None: ...
    def when(self, cond: Term) -> Iterable[None]: ...
    def choose(self, kind: str, domain: range, legal: Callable[[int], Term],
               label: Callable[[int], object] | None = None,
               same: Callable[[int], tuple[Term, ...]] | None = None) -> Term: ...
    def fail(self, reason: str, consumed: str | None = None) -> None: ...
    def require(self, cond: Term, error: UsageError) -> None: ...


@dataclass
class Step:
    """One page action as it ran: the trace of an API action is a list of these."""

    action: str
    params: dict[str, int]


class ConcreteExecutor:
    ops: Ops = CONCRETE

    def __init__(self, lay: Layout, state: State, chooser: Chooser,
                 reduce_symmetry: bool = False) -> None:
        self.lay = lay
        self.s = state
        self.chooser = chooser
        # interchangeable candidates (equal `same` keys): offer only the lowest of each,
        # as the symbolic search does; an exhaustive search then skips renamed twins
        self.reduce_symmetry = reduce_symmetry
        self.steps: list[Step] = []
        self.choices: list[tuple[str, int]] = []

    def do(self, action: str, **params: Term) -> None:
        a = PAGE_ACTIONS[action]
        for label, ok in a.guard(self.ops, self.lay, self.s, params):
            if not ok:
                raise GuardViolation(action, label, dict(params))
        self.s = a.effect(self.ops, self.lay, self.s, params)
        self.steps.append(Step(action, {k: int(v) for k, v in params.items()}))

    def when(self, cond: Term) -> Iterable[None]:
        return (None,) if cond else ()

    def choose(self, kind: str, domain: range, legal: Callable[[int], Term],
               label: Callable[[int], object] | None = None,
               same: Callable[[int], tuple[Term, ...]] | None = None) -> Term:
        candidates = [x for x in domain if legal(x)]
        if not candidates:
            return -1
        if same is not None and self.reduce_symmetry:
            keys = [tuple(int(k) for k in same(x)) for x in candidates]
            candidates = [x for i, x in enumerate(candidates) if keys[i] not in keys[:i]]
        labels = [label(c) if label else c for c in candidates]
        pick = self.chooser.choose(kind, candidates, labels)
        self.choices.append((kind, pick))
        return pick

    def fail(self, reason: str, consumed: str | None = None) -> NoReturn:
        raise OutOfPages(reason, consumed)

    def require(self, cond: Term, error: UsageError) -> None:
        if not cond:
            raise error
