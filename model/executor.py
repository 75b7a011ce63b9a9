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

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, NoReturn, Protocol, overload

from .choices import RECORDED
from .errors import ChoiceRejected, GuardViolation, MissingChoice, OutOfPages, UsageError
from .logic import CONCRETE, Ops, Term
from .pages import PAGE_ACTIONS
from .state import Layout, State


class Chooser(Protocol):
    """Picks among the legal candidates of a choice (all candidates satisfy the guard).

    `labels[i]` names `candidates[i]` in terms both sides share (a slot id, or the
    (level, pool group, slot) a page sits in), so recorded choices can be replayed.
    """

    def choose(self, kind: str, candidates: Sequence[int], labels: Sequence[object]) -> int: ...


class LowestChooser:
    """The default: deterministic, the first legal candidate (lowest id, FIFO position)."""

    def choose(self, kind: str, candidates: Sequence[int], labels: Sequence[object]) -> int:
        return candidates[0]


class Candidates(Sequence[int]):
    """The legal candidates of one concrete choice, found as far as they are read.

    A domain can be as large as the declared geometry (every slot of a level); a chooser
    usually reads the first candidate, or looks one label up (`find`), so the domain is
    scanned lazily, and `among` (a superset of the legal candidates, ascending) can
    replace it. Reading the length or every candidate scans everything.
    """

    def __init__(self, domain: range, legal: Callable[[int], Term],
                 label: Callable[[int], object] | None = None,
                 among: Iterable[int] | Callable[[], Iterable[int]] | None = None) -> None:
        """`among`: the superset, or a function that lists it (called at the first scan: a
        label looked up needs no list of every queued page)."""
        self._source: Iterator[int] = self._scan(domain, legal, among)
        self._found: list[int] = []
        self._done = False
        self._legal = legal
        self._domain = domain
        self._label = label

    @staticmethod
    def _scan(domain: range, legal: Callable[[int], Term],
              among: Iterable[int] | Callable[[], Iterable[int]] | None) -> Iterator[int]:
        listed = domain if among is None else among() if callable(among) else among
        for x in listed:
            if x in domain and legal(x):
                yield x

    def _upto(self, n: int) -> bool:
        """Find candidates until there are more than n; False when there are not."""
        while len(self._found) <= n and not self._done:
            nxt = next(self._source, None)
            if nxt is None:
                self._done = True
            else:
                self._found.append(nxt)
        return len(self._found) > n

    def __len__(self) -> int:
        self._upto(1 << 62)
        return len(self._found)

    def empty(self) -> bool:
        return not self._upto(0)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...

    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        if isinstance(i, slice) or i < 0:
            return list(self)[i]
        if not self._upto(i):
            raise IndexError(i)
        return self._found[i]

    def __iter__(self) -> Iterator[int]:
        k = 0
        while self._upto(k):
            yield self._found[k]
            k += 1

    def find(self, want: object, by_label: bool = True) -> int | None:
        """The candidate whose label (or, not `by_label`, whose id) is `want`, or None. An
        id is looked up directly; a label is searched for among the candidates."""
        if not by_label:
            return self._legal_id(want)
        named = self.looked_up(want)
        label = self._label
        if named is not None or label is None:
            return named  # labels name one candidate each: the search would find it
        for c in self:
            if _norm(label(c)) == want:
                return c
        return None

    def looked_up(self, want: object) -> int | None:
        """The legal candidate label `want` names, found without a scan: an id, or what a
        `LookupLabel` names (None when the label function cannot look labels up, or the
        label names no legal candidate)."""
        label = self._label
        if label is None:  # a candidate's label is its id
            return self._legal_id(want)
        if isinstance(label, LookupLabel):
            named = label.named(want)
            if named is not None and named in self._domain and self._legal(named) \
                    and _norm(label(named)) == want:
                return named
        return None

    def _legal_id(self, want: object) -> int | None:
        """`want` when it is a legal candidate's id."""
        ok = isinstance(want, int) and want in self._domain and bool(self._legal(want))
        return want if ok else None  # type: ignore[return-value]

    def labels(self) -> Sequence[object]:
        """Every candidate's label (reads every candidate)."""
        return [self._label(c) if self._label else c for c in self]


@dataclass(frozen=True)
class LookupLabel:
    """A choice's label function that can also name the candidate a label belongs to, so a
    recorded label is looked up (`Candidates.find`) instead of searched for among every
    candidate (a victim among every queued page). Labels must name one candidate each."""

    label: Callable[[int], object]
    named: Callable[[object], int | None]

    def __call__(self, candidate: int) -> object:
        return self.label(candidate)


class _LazyLabels(Sequence[object]):
    """The labels of `Candidates`, each computed when read."""

    def __init__(self, candidates: Candidates, label: Callable[[int], object] | None) -> None:
        self._c, self._label = candidates, label

    def __len__(self) -> int:
        return len(self._c)

    @overload
    def __getitem__(self, i: int) -> object: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[object]: ...

    def __getitem__(self, i: int | slice) -> object | Sequence[object]:
        if isinstance(i, slice):
            return self._c.labels()[i]
        c = self._c[i]
        return self._label(c) if self._label else c


# The choices an implementation makes too (and records): `choices.CHOICES` is the table.
CHOICE_KINDS = RECORDED
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

    def choose(self, kind: str, candidates: Sequence[int], labels: Sequence[object]) -> int:
        if self.script is None or (self.by == "label" and kind not in CHOICE_KINDS):
            return candidates[0]
        queue = self.script.get(kind)
        if not queue:
            if self.on_missing == "raise":
                raise MissingChoice(kind, list(labels))
            if self.on_missing == "note":
                self.unmatched.append(f"the model chose a {kind} the record does not have")
            return candidates[0]
        want = _norm(queue.pop(0))
        if isinstance(candidates, Candidates):
            found = candidates.find(want, by_label=self.by == "label")
            if found is not None:
                return found
        keys = [_norm(x) for x in (labels if self.by == "label" else candidates)]
        for c, key in zip(candidates, keys, strict=True):
            if key == want:
                return c
        raise ChoiceRejected(kind, want, keys)

    def next_label(self, kind: str) -> object | None:
        """The recorded label `choose` takes next for `kind` (matched by label), if any."""
        if self.script is None or self.by != "label" or kind not in CHOICE_KINDS:
            return None
        queue = self.script.get(kind)
        return _norm(queue[0]) if queue else None

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
               same: Callable[[int], tuple[Term, ...]] | None = None,
               among: Callable[[], Iterable[int]] | None = None) -> Term: ...
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
               same: Callable[[int], tuple[Term, ...]] | None = None,
               among: Callable[[], Iterable[int]] | None = None) -> Term:
        """`among`, when given, lists (ascending) a superset of the legal candidates: the
        model's own indexes (the live pages), so that a choice costs what is in use, not
        what is declared. It changes no outcome: `legal` still decides."""
        found = Candidates(domain, legal, label, among)
        if not self._recorded_is_legal(kind, found) and found.empty():
            return -1
        candidates: Sequence[int] = found
        labels: Sequence[object] = _LazyLabels(found, label)
        if same is not None and self.reduce_symmetry:
            every = list(found)
            keys = [tuple(int(k) for k in same(x)) for x in every]
            candidates = [x for i, x in enumerate(every) if keys[i] not in keys[:i]]
            labels = [label(c) if label else c for c in candidates]
        pick = self.chooser.choose(kind, candidates, labels)
        self.choices.append((kind, pick))
        return pick

    def _recorded_is_legal(self, kind: str, found: Candidates) -> bool:
        """The next recorded label of this kind names a legal candidate, looked up (so there
        is one, and the candidates need no scan: a recorded slot of a full pool of 10^5, or
        a recorded victim among 10^5 cached pages, costs a lookup, not a scan of them)."""
        want = self.chooser.next_label(kind) if isinstance(self.chooser, RecordedChooser) \
            else None
        return want is not None and found.looked_up(want) is not None

    def fail(self, reason: str, consumed: str | None = None) -> NoReturn:
        raise OutOfPages(reason, consumed)

    def require(self, cond: Term, error: UsageError) -> None:
        if not cond:
            raise error
