"""The parametric (EPR) interpretation quantifies a loop over an array where the loop is,
never at a conjunction or disjunction inside its body that merely has as many terms as the
loop has concrete index combinations (a pocket of two positions: one life cycle, capacity
two)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import z3

from kvpocket.model.config import NONE
from kvpocket.model.invariants import INVARIANTS_BY_NAME
from kvpocket.model.logic import Ops
from kvpocket.model.state import State
from kvpocket.verify.proofs.epr import (
    EprLayout,
    EprOps,
    Universe,
    as_fields,
    iteration_vars,
    symbolic_state,
)
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



def test_a_two_term_body_is_not_taken_for_a_two_position_loop() -> None:
    uni = _two_position_pocket()

    def define(ops: Ops, s: State) -> Any:  # two conjuncts in the body, two positions
        return ops.all_over(s.pocket, lambda x: ops.implies(ops.ne(x, NONE), ops.and_(
            ops.not_(ops.lookup(s.committed, x, True)), ops.not_(ops.lookup(s.queued, x, True)))))
    term, fields = _read(uni, define)
    expected = _expected(uni, fields, lambda p: z3.And(z3.Not(fields["committed"](p)),
                                                       z3.Not(fields["queued"](p))))
    # Read by term count, the body's implication became an Exists per position: weaker than
    # the definition, so proving it would have proved too little.
    assert _equivalent(term, expected, uni.axioms())


def test_a_plain_junction_over_an_array_is_never_quantified() -> None:
    """Only a loop marked `all_over`/`any_over` binds its variable: an expansion written
    with `and_` keeps it free (and `as_defined` refuses such a definition)."""
    uni = _two_position_pocket()

    def define(ops: Ops, s: State) -> Any:
        return ops.and_(*(ops.implies(ops.ne(x, NONE), ops.not_(ops.lookup(s.committed, x, True)))
                          for x in s.pocket))
    term, _ = _read(uni, define)
    assert not z3.is_quantifier(term)
    assert iteration_vars(term)


def test_committed_never_parked_reads_as_defined_on_two_positions() -> None:
    uni = _two_position_pocket()
    inv = INVARIANTS_BY_NAME["committed_never_parked"]
    term, fields = _read(uni, lambda ops, s: inv.predicate(ops, EprLayout(uni.cfg, uni), s))
    expected = _expected(uni, fields, lambda p: z3.Not(fields["committed"](p)))
    assert _equivalent(term, expected, uni.axioms())
