"""The Z3 interpretation of the model vocabulary (`kvpocket.model.logic.Ops`).

Guards, effects and invariants of the model are evaluated with `Z3Ops` to
build Z3 terms: there is no second copy of the transitions. Terms fold as
they are built: operands that are Python values (or Z3 literals) are
evaluated at once, so a concrete array index takes the tuple element
directly, a guard condition on concrete parameters becomes a Python bool,
and an untouched array element stays the very same term (the identity lets
`merge` and equality constraints skip unchanged state).

Integer terms may also carry a *value set*: every value the term can take in
any model of the constraints that define it (BMC tags the variables of each
unrolled step with the values the previous step can give them; see `tag`).
Comparisons decided by value sets fold like literals, a lookup or store with
a tagged index only touches the positions it can name, and a variable whose
set has one value is that literal. Terms without a set behave as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import z3

from kvpocket.model.logic import Array, Term

Z3Term = Any  # z3.ExprRef; z3 is untyped

_int_width: int | None = None  # None: unbounded Ints; else signed bit-vectors this wide


@contextmanager
def bitvectors(width: int) -> Iterator[None]:
    """Inside the block, integer terms are signed bit-vectors of `width` bits.

    Induction proofs use unbounded Ints (general); BMC runs a bounded number of steps
    from a concrete state, where every value is small, and there bit-vectors make each
    query propositional for Z3's incremental SAT solver (several times faster).
    """
    global _int_width
    saved, _int_width = _int_width, width
    try:
        yield
    finally:
        _int_width = saved


def int_var(name: str) -> Z3Term:
    return z3.Int(name) if _int_width is None else z3.BitVec(name, _int_width)


def int_val(x: int) -> Z3Term:
    return z3.IntVal(x) if _int_width is None else z3.BitVecVal(x, _int_width)


def py_int(value: Z3Term) -> int:
    """The Python int of an evaluated integer term (bit-vectors are signed)."""
    if z3.is_bv_value(value):
        return int(value.as_signed_long())
    return int(value.as_long())


def lit(x: Term) -> int | bool | None:
    """The Python value of x if it is a constant, else None.

    Z3Ops never builds Z3 literals except as leaves of `If` terms it records (see
    `_ITE`), so a Z3 expression is never treated as a constant (fast: no FFI call).
    """
    if isinstance(x, bool | int):
        return x
    return getattr(x, "_kv_lit", None)


def to_z3(x: Term) -> Z3Term:
    """A Z3 expression for x (Python bools and ints become literals)."""
    if isinstance(x, bool):
        e = z3.BoolVal(x)
    elif isinstance(x, int):
        e = int_val(x)
    else:
        return x
    e._kv_lit = x
    return e


MAX_VALUES = 64  # larger value sets are dropped (the term is then unconstrained)


def values(x: Term) -> frozenset[int] | None:
    """The values an integer term can take, when known (None: any)."""
    v = lit(x)
    if v is not None:
        return None if isinstance(v, bool) else frozenset((v,))
    found: frozenset[int] | None = getattr(x, "_kv_vals", None)
    return found


def tag(term: Z3Term, vals: frozenset[int] | set[int] | None) -> Term:
    """Attach a value set to a Z3 integer term; a single value becomes that literal.

    The caller guarantees the term never takes a value outside `vals`.
    """
    if vals is None or len(vals) > MAX_VALUES or lit(term) is not None:
        return term
    if len(vals) == 1:
        return next(iter(vals))
    term._kv_vals = frozenset(vals)
    return term


def _join(*sets: frozenset[int] | None) -> frozenset[int] | None:
    out: frozenset[int] = frozenset()
    for v in sets:
        if v is None:
            return None
        out |= v
    return out


def same(a: Term, b: Term) -> bool:
    """a and b are the same term (cheap; False means 'do not know')."""
    if a is b:
        return True
    la, lb = lit(a), lit(b)
    return la is not None and lb is not None and type(la) is type(lb) and la == lb


class Z3Ops:
    """Builds Z3 terms, folding constants as it goes."""

    symbolic = True

    def const(self, value: int | bool) -> Term:
        return value

    def and_(self, *xs: Term) -> Term:
        keep: list[Z3Term] = []
        for x in xs:
            v = lit(x)
            if v is None:
                keep.append(x)
            elif not v:
                return False
        if not keep:
            return True
        return keep[0] if len(keep) == 1 else z3.And(*keep)

    def all_over(self, arr: Array, body: Callable[[Term], Term]) -> Term:
        return self.and_(*(body(x) for x in arr))

    def any_over(self, arr: Array, body: Callable[[Term], Term]) -> Term:
        return self.or_(*(body(x) for x in arr))

    def or_(self, *xs: Term) -> Term:
        keep: list[Z3Term] = []
        for x in xs:
            v = lit(x)
            if v is None:
                keep.append(x)
            elif v:
                return True
        if not keep:
            return False
        return keep[0] if len(keep) == 1 else z3.Or(*keep)

    def not_(self, x: Term) -> Term:
        v = lit(x)
        if v is not None:
            return not v
        inner = getattr(x, "_kv_not", None)
        if inner is not None:
            return inner
        e = z3.Not(x)
        e._kv_not = x
        return e

    def implies(self, a: Term, b: Term) -> Term:
        va, vb = lit(a), lit(b)
        if va is not None:
            return b if va else True
        if vb is not None:
            return True if vb else self.not_(a)
        return z3.Implies(a, b)

    def ite(self, c: Term, a: Term, b: Term) -> Term:
        vc = lit(c)
        if vc is not None:
            return a if vc else b
        if same(a, b):
            return a
        va, vb = lit(a), lit(b)
        if isinstance(va, bool) and isinstance(vb, bool):
            return c if va else self.not_(c)
        e = z3.If(c, to_z3(a), to_z3(b))
        e._kv_ite = (c, a, b)
        return tag(e, _join(values(a), values(b)))

    def eq(self, a: Term, b: Term) -> Term:
        va, vb = lit(a), lit(b)
        if va is not None and vb is not None:
            return bool(va == vb)
        if same(a, b):
            return True
        if isinstance(vb, bool):
            return a if vb else self.not_(a)
        if isinstance(va, bool):
            return b if va else self.not_(b)
        sa, sb = values(a), values(b)
        if sa is not None and sb is not None and sa.isdisjoint(sb):
            return False
        if va is not None and hasattr(b, "_kv_ite"):
            return self._push_ite_cmp(b, va)
        if vb is not None and hasattr(a, "_kv_ite"):
            return self._push_ite_cmp(a, vb)
        return to_z3(a) == to_z3(b)

    def _push_ite_cmp(self, t: Z3Term, v: int) -> Term:
        """(If(c, x, y) == v) with literal leaves becomes a Boolean combination (smaller)."""
        c, x, y = t._kv_ite
        return self.ite(c, self.eq(x, v), self.eq(y, v))

    def ne(self, a: Term, b: Term) -> Term:
        return self.not_(self.eq(a, b))

    def lt(self, a: Term, b: Term) -> Term:
        va, vb = lit(a), lit(b)
        if va is not None and vb is not None:
            return bool(va < vb)
        if same(a, b):
            return False
        sa, sb = values(a), values(b)
        if sa is not None and sb is not None:
            if max(sa) < min(sb):
                return True
            if min(sa) >= max(sb):
                return False
        return to_z3(a) < to_z3(b)

    def le(self, a: Term, b: Term) -> Term:
        va, vb = lit(a), lit(b)
        if va is not None and vb is not None:
            return bool(va <= vb)
        if same(a, b):
            return True
        sa, sb = values(a), values(b)
        if sa is not None and sb is not None:
            if max(sa) <= min(sb):
                return True
            if min(sa) > max(sb):
                return False
        return to_z3(a) <= to_z3(b)

    def add(self, a: Term, b: Term) -> Term:
        va, vb = lit(a), lit(b)
        if va is not None and vb is not None:
            return int(va) + int(vb)
        if vb == 0:
            return a
        if va == 0:
            return b
        return tag(to_z3(a) + to_z3(b), _combine(values(a), values(b), 1))

    def sub(self, a: Term, b: Term) -> Term:
        va, vb = lit(a), lit(b)
        if va is not None and vb is not None:
            return int(va) - int(vb)
        if vb == 0:
            return a
        return tag(to_z3(a) - to_z3(b), _combine(values(a), values(b), -1))

    def scale(self, a: Term, k: int) -> Term:
        va = lit(a)
        if va is not None:
            return int(va) * k
        if k == 1:
            return a
        sa = values(a)
        return tag(to_z3(a) * k, None if sa is None else frozenset(x * k for x in sa))

    def lookup(self, arr: Sequence[Term], idx: Term, default: Term = -1) -> Term:
        i = lit(idx)
        if i is not None:
            return arr[int(i)] if 0 <= i < len(arr) else default
        known = values(idx)
        if known is None:
            result = default
            for j in reversed(range(len(arr))):
                result = self.ite(self.eq(idx, j), arr[j], result)
            return result
        # Only the positions the index can name; the last one needs no test.
        js = sorted(j for j in known if 0 <= j < len(arr))
        if len(js) < len(known):
            result, tests = default, js
        elif js:
            result, tests = arr[js[-1]], js[:-1]
        else:
            return default
        for j in reversed(tests):
            result = self.ite(self.eq(idx, j), arr[j], result)
        return result

    def store(self, arr: Array, idx: Term, value: Term) -> Array:
        i = lit(idx)
        if i is not None:
            if not 0 <= i < len(arr):
                return arr
            return (*arr[: int(i)], value, *arr[int(i) + 1 :])
        return tuple(self.ite(self.eq(idx, j), value, x) for j, x in enumerate(arr))

    def count(self, conds: Sequence[Term]) -> Term:
        n = 0
        terms: list[Z3Term] = []
        for c in conds:
            v = lit(c)
            if v is None:
                terms.append(z3.If(c, int_val(1), int_val(0)))
            elif v:
                n += 1
        if not terms:
            return n
        total = terms[0] if len(terms) == 1 else z3.Sum(*terms)
        total = total + n if n else total
        return tag(total, frozenset(range(n, n + len(terms) + 1)))


def _combine(sa: frozenset[int] | None, sb: frozenset[int] | None, sign: int
             ) -> frozenset[int] | None:
    if sa is None or sb is None or len(sa) * len(sb) > 4 * MAX_VALUES:
        return None
    return frozenset(x + sign * y for x in sa for y in sb)


Z3OPS = Z3Ops()
