"""How API programs run: the executor interface and its concrete interpretation.

API actions (`model/api.py`) are programs over page actions. They never branch
with Python `if` on state; they use `ex.when(cond)` (a loop that runs its body
zero or one time), `ex.choose(...)` for every nondeterministic pick, and
`ex.fail(...)` for OutOfPages. `ConcreteExecutor` runs them on plain values;
a symbolic executor (`kvpocket.verify`) unrolls the same programs for Z3.
A choice may say which legal candidates are interchangeable (`same`: equal
keys lead to states equal up to renaming); the concrete executor offers them
all, a symbolic search may try only the lowest of each kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from .errors import ChoiceRejected, GuardViolation, OutOfPages, UsageError
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


@dataclass
class ScriptedChooser:
    """Replays recorded choices, by kind, in order; kinds without a script pick the lowest.

    A recorded choice that is not legal raises `ChoiceRejected`: the recording
    side (the implementation, a trace) did something the model forbids.
    """

    script: dict[str, list[int]] = field(default_factory=dict)
    used: list[tuple[str, int]] = field(default_factory=list)

    def choose(self, kind: str, candidates: list[int], labels: list[object]) -> int:
        queue = self.script.get(kind)
        if not queue:
            pick = candidates[0]
        else:
            pick = queue.pop(0)
            if pick not in candidates:
                raise ChoiceRejected(kind, pick, list(candidates))
        self.used.append((kind, pick))
        return pick


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

    def __init__(self, lay: Layout, state: State, chooser: Chooser) -> None:
        self.lay = lay
        self.s = state
        self.chooser = chooser
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
        labels = [label(c) if label else c for c in candidates]
        pick = self.chooser.choose(kind, candidates, labels)
        self.choices.append((kind, pick))
        return pick

    def fail(self, reason: str, consumed: str | None = None) -> NoReturn:
        raise OutOfPages(reason, consumed)

    def require(self, cond: Term, error: UsageError) -> None:
        if not cond:
            raise error
