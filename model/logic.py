"""The small vocabulary every model definition is written in.

Guards, effects and invariants use only these operations, never Python `if`
on state values. `ConcreteOps` evaluates them on plain ints and bools, so the
model runs; the Z3 interpretation (`kvpocket.verify.proofs.z3ops`) builds terms from
the very same definitions, so there is no second copy of the transitions.

Arrays are tuples (Z3) or `SparseArray`s (the executable model: only positions in use
are stored); an index may be a plain int (fast path) or a term. The helpers at the end
(`count_equal`, `any_equal`, `replace_equal`) are whole-array operations written once:
on a sparse array they visit only the stored positions, on a tuple every position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .sparse import _MISSING, SparseArray

# A value of the model: a Python int/bool under ConcreteOps, a Z3 expression symbolically.
Term = Any
# An array of the model's state: a tuple, or a `SparseArray` in the executable model.
Array = Sequence[Term]


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
    def store(self, arr: Array, idx: Term, value: Term) -> Array: ...
    def count(self, conds: Sequence[Term]) -> Term: ...
    # A loop over every element of an array: an interpretation over unbounded arrays states
    # it as one quantifier (the expansion's terms alone cannot tell a loop from its body).
    def all_over(self, arr: Array, body: Callable[[Term], Term]) -> Term: ...
    def any_over(self, arr: Array, body: Callable[[Term], Term]) -> Term: ...


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
        if idx < 0:
            return default
        if type(arr) is SparseArray:  # the model's hottest read: `SparseArray[idx]`, inlined
            v = arr._overlay.get(idx, _MISSING)
            if v is _MISSING:
                v = arr._base.get(idx, _MISSING)
                if v is _MISSING:  # past the end (or not an int index) reads `default`
                    return arr.default if type(idx) is int and idx < arr.length else default
            return v
        try:  # past the end reads the default (no `len` call)
            return arr[idx]
        except IndexError:
            return default

    def store(self, arr: Array, idx: Term, value: Term) -> Array:
        if type(arr) is SparseArray:
            return arr.set(idx, value) if 0 <= idx < arr.length else arr
        if not 0 <= idx < len(arr):
            return arr
        return (*arr[:idx], value, *arr[idx + 1 :])

    def count(self, conds: Sequence[Term]) -> Term:
        return sum(1 for c in conds if c)

    def all_over(self, arr: Array, body: Callable[[Term], Term]) -> Term:
        if type(arr) is SparseArray:  # `body` reads the element: the default is read once
            return all(body(v) for _, v in arr.items()) and (
                not _holds_default(arr) or bool(body(arr.default)))
        return self.and_(*(body(x) for x in arr))

    def any_over(self, arr: Array, body: Callable[[Term], Term]) -> Term:
        if type(arr) is SparseArray:
            return any(body(v) for _, v in arr.items()) or (
                _holds_default(arr) and bool(body(arr.default)))
        return self.or_(*(body(x) for x in arr))


CONCRETE = ConcreteOps()


def _holds_default(arr: SparseArray) -> bool:
    """Some position of `arr` holds its default value."""
    return arr.count_used_in(range(len(arr))) < len(arr)


# ---- whole-array operations ------------------------------------------------------------------


def count_equal(ops: Ops, arr: Array, positions: range, value: int) -> Term:
    """How many positions of `positions` hold `value`."""
    if not ops.symbolic and isinstance(arr, SparseArray):
        if value == arr.default:
            return len(positions) - arr.count_used_in(positions)
        lo, hi = positions.start, positions.stop
        return sum(1 for i, v in arr.items() if lo <= i < hi and v == value)
    return ops.count([ops.eq(arr[i], value) for i in positions])


def any_equal(ops: Ops, arr: Array, value: int) -> Term:
    """Some position holds `value`."""
    if not ops.symbolic and isinstance(arr, SparseArray):
        return (value == arr.default and len(arr.used()) < len(arr)) or any(
            v == value for _, v in arr.items())
    if not ops.symbolic and type(arr) is tuple:  # plain values: the same loop, in C
        return value in arr
    return ops.any_over(arr, lambda x: ops.eq(x, value))


def replace_equal(ops: Ops, arr: Array, old: Term, new: int) -> Array:
    """Every position holding `old` holds `new` instead."""
    if not ops.symbolic and isinstance(arr, SparseArray) and old != arr.default:
        out = arr
        for i, v in list(arr.items()):
            if v == old:
                out = out.set(i, new)
        return out
    return tuple(ops.ite(ops.eq(x, old), new, x) for x in arr)
