"""Value sets, bit-vectors and symmetry reduction: the folding BMC relies on is exact."""

from __future__ import annotations

from typing import Any

import z3

from kvpocket.verify.proofs.symbolic_exec import _lowest
from kvpocket.verify.proofs.z3ops import Z3OPS, bitvectors, int_var, lit, py_int, tag, to_z3, values


def test_tags_fold_comparisons_lookups_and_singletons() -> None:
    x = tag(z3.Int("x"), {1, 2})
    assert values(x) == frozenset({1, 2})
    assert Z3OPS.eq(x, 3) is False and Z3OPS.lt(x, 3) is True and Z3OPS.le(3, x) is False
    assert lit(Z3OPS.eq(x, 1)) is None  # undecided: stays a term
    arr = (10, 11, 12, 13)
    got = Z3OPS.lookup(arr, x)
    assert values(got) == frozenset({11, 12})  # only positions 1 and 2, no default
    for value in (1, 2):  # and it means the same as the Python lookup
        s = z3.Solver()
        s.add(z3.Int("x") == value)
        assert s.check() == z3.sat and s.model().eval(to_z3(got)).as_long() == arr[value]
    stored = Z3OPS.store(arr, x, 0)
    assert stored[0] == 10 and stored[3] == 13  # positions x cannot name are untouched
    assert tag(z3.Int("y"), {5}) == 5  # a single value is the literal
    assert values(Z3OPS.add(x, 1)) == frozenset({2, 3})


def test_symmetry_keeps_the_lowest_of_each_interchangeable_class() -> None:
    a, b, c = z3.Bools("a b c")
    conds: list[tuple[int, Any]] = [(0, a), (1, b), (2, c)]
    keys = {0: 7, 1: 7, 2: 9}
    kept = _lowest(Z3OPS, conds, lambda i: (keys[i],))
    s = z3.Solver()
    # Candidate 1 is only allowed when 0 is not legal (same key); 2 has its own key.
    s.add(a, b, c)
    assert [x for x, cond in kept if s.check(to_z3(cond)) == z3.sat] == [0, 2]


def test_bitvector_integers_are_signed() -> None:
    with bitvectors(12):
        v = int_var("v")
        s = z3.Solver()
        s.add(v == to_z3(-1))
        assert s.check() == z3.sat and py_int(s.model().eval(v)) == -1
        assert z3.is_bv(to_z3(3)) and lit(Z3OPS.lt(-1, v)) is None
