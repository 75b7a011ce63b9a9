"""The small vocabulary every model definition is written in.

Guards, effects and invariants use only these operations, never Python `if`
on state values. `ConcreteOps` evaluates them on plain ints and bools, so the
model runs; the Z3 interpretation (`kvpocket.verify.proofs.z3ops`) builds terms from
the very same definitions, so there is no second copy of the transitions.

Arrays are tuples; an index may be a plain int (fast path) or a term.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

# A value of the model: a Python int/bool under ConcreteOps, a Z3 expression symbolically.
Term = Any


class Ops(Protocol):
    """One interpretation of the model vocabulary."""

    symbolic: bool

    def const(self, value: int | bool) -> Term: ...
    def and_(self, *xs: Term) -> Term: ...
    def or_(self, *xs: Term) -> Term: ...
    def not_(self, x: Term) -> Term: ...
    def implies(self, a: Term, b: Term) -> Term: ...
    def ite(self, c: Term, a: Term, b: Term) -> Term: ...
    def eq(self, a: Term, b: Term) -> Term: ...
    def ne(self, a: Term, b: Term) -> Term: ...
    def lt(self, a: Term, b: Term) -> Term: ...
    def le(self, a: Term, b: Term) -> Term: ...
    def add(self, a: Term, b: Term) -> Term: ...
    def sub(self, a: Term, b: Term) -> Term: ...
    def scale(self, a: Term, k: int) -> Term: ...
    def lookup(self, arr: Sequence[Term], idx: Term, default: Term = -1) -> Term: ...
    def store(self, arr: tuple[Term, ...], idx: Term, value: Term) -> tuple[Term, ...]: ...
    def count(self, conds: Sequence[Term]) -> Term: ...


class ConcreteOps:
    """Evaluates the vocabulary on plain Python values: the executable model."""

    symbolic = False

    def const(self, value: int | bool) -> Term:
        return value

    def and_(self, *xs: Term) -> Term:
        return all(xs)

    def or_(self, *xs: Term) -> Term:
        return any(xs)

    def not_(self, x: Term) -> Term:
        return not x

    def implies(self, a: Term, b: Term) -> Term:
        return (not a) or bool(b)

    def ite(self, c: Term, a: Term, b: Term) -> Term:
        return a if c else b

    def eq(self, a: Term, b: Term) -> Term:
        return bool(a == b)

    def ne(self, a: Term, b: Term) -> Term:
        return bool(a != b)

    def lt(self, a: Term, b: Term) -> Term:
        return bool(a < b)

    def le(self, a: Term, b: Term) -> Term:
        return bool(a <= b)

    def add(self, a: Term, b: Term) -> Term:
        return a + b

    def sub(self, a: Term, b: Term) -> Term:
        return a - b

    def scale(self, a: Term, k: int) -> Term:
        return a * k

    def lookup(self, arr: Sequence[Term], idx: Term, default: Term = -1) -> Term:
        return arr[idx] if 0 <= idx < len(arr) else default

    def store(self, arr: tuple[Term, ...], idx: Term, value: Term) -> tuple[Term, ...]:
        if not 0 <= idx < len(arr):
            return arr
        return (*arr[:idx], value, *arr[idx + 1 :])

    def count(self, conds: Sequence[Term]) -> Term:
        return sum(1 for c in conds if c)


CONCRETE = ConcreteOps()
