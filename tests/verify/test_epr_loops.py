"""The parametric (EPR) interpretation quantifies a loop over an array where the loop is,
never at a conjunction or disjunction inside its body that merely has as many terms as the
loop has concrete index combinations (a pocket of two positions: one life cycle, capacity
two)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import z3

from kvpocket.model.config import NONE
from kvpocket.model.invariants import INVARIANTS_BY_NAME
from kvpocket.model.logic import Ops
from kvpocket.model.state import State
from kvpocket.verify.proofs.epr import EprLayout, EprOps, Universe, as_fields, symbolic_state
from kvpocket.verify.proofs.parametric import pocket_keys
from kvpocket.verify.proofs.prove import PROVE_CONFIGS


def _two_position_pocket() -> Universe:
    cfg = PROVE_CONFIGS["gpu-host"].config.with_pocket(True, "revalidate")
    uni = Universe(cfg)
    assert uni.lcs * uni.cap == 2  # the shape where a two-term body looks like the loop
    return uni


def _equivalent(a: Any, b: Any, axioms: list[Any]) -> bool:
    solver = z3.Solver()
    solver.set("timeout", 20000)
    solver.add(*axioms, a != b)
    return bool(solver.check() == z3.unsat)


def _read(uni: Universe, define: Any) -> tuple[Any, dict[str, Any]]:
    s = symbolic_state(uni, "")
    fields: dict[str, Any] = dict(as_fields(uni, s))
    term = define(EprOps(uni), replace(s, **fields))
    return term, fields


def _expected(uni: Universe, fields: dict[str, Any],
              body: Any) -> Any:
    """For every valid pocket position x (nil outside), body(x)."""
    seq = z3.Const("s", uni.sorts["seq"])
    pocket = fields["pocket"]
    nil = uni.nil["page"]
    return z3.And(*[z3.ForAll([seq], z3.Implies(
        z3.And(uni.is_seq(seq), pocket(*ix) != nil), body(pocket(*ix))))
        for ix in pocket_keys(uni, seq)])


@pytest.mark.xfail(strict=True, reason="EprOps._junction takes a two-term body for a loop over a "
                   "two-position pocket and quantifies it there (an Exists: weaker)")
def test_a_two_term_body_is_not_taken_for_a_two_position_loop() -> None:
    uni = _two_position_pocket()

    def define(ops: Ops, s: State) -> Any:  # committed_never_parked's shape, inlined
        return ops.and_(*(ops.implies(ops.ne(x, NONE), ops.not_(ops.lookup(s.committed, x, True)))
                          for x in s.pocket))
    term, fields = _read(uni, define)
    expected = _expected(uni, fields, lambda p: z3.Not(fields["committed"](p)))
    # The misread form is weaker than the definition: proving it would prove too little.
    assert _equivalent(term, expected, uni.axioms())


@pytest.mark.xfail(strict=True, reason="EprOps._junction takes a two-term body for a loop over a "
                   "two-position pocket and quantifies it there (an Exists: weaker)")
def test_committed_never_parked_reads_as_defined_on_two_positions() -> None:
    uni = _two_position_pocket()
    inv = INVARIANTS_BY_NAME["committed_never_parked"]
    term, fields = _read(uni, lambda ops, s: inv.predicate(ops, EprLayout(uni.cfg, uni), s))
    expected = _expected(uni, fields, lambda p: z3.Not(fields["committed"](p)))
    assert _equivalent(term, expected, uni.axioms())
