"""Solver plumbing: one place for resource limits, result names and model extraction.

Every limit given to Z3 here is in resource units (Z3's `rlimit`, counted per `check`),
never in seconds: Z3 spends the same units on the same query whatever the machine and
its load, so an obligation's answer, "unknown" included, is the same everywhere. The
units a check spent are kept in its answer (`SolverAnswer.units`): the figures that
chose the limits below are in docs/performance.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import z3

from kvpocket.verify.proofs.z3ops import Z3Term, py_int, to_z3

# The most one induction query of `kvpocket prove` spends is about 23 M units (measured
# over the whole default matrix); 10x that leaves room for a harder configuration (about
# 20 s of Z3 on a quiet 2-core machine).
DEFAULT_RLIMIT = 250_000_000


def limited(solver: Any, rlimit: int) -> Any:
    """`solver` with at most `rlimit` resource units per check (0: no limit)."""
    if isinstance(rlimit, bool) or not isinstance(rlimit, int) or rlimit < 0:
        raise ValueError(f"rlimit: expected a whole number of resource units >= 0, got {rlimit!r}")
    solver.set("rlimit", rlimit)
    return solver


def new_solver(rlimit: int | None = None) -> Any:
    """The induction obligations' solver, `DEFAULT_RLIMIT` units per check unless told."""
    return limited(z3.Then("simplify", "propagate-values", "solve-eqs", "smt").solver(),
                   DEFAULT_RLIMIT if rlimit is None else rlimit)


def units_spent(solver: Any) -> int:
    """Z3's resource counter (it counts for the whole context; `check` takes differences)."""
    try:
        return int(solver.statistics().get_key_value("rlimit count"))
    except z3.Z3Exception:  # no check has run in this context yet
        return 0


@dataclass
class SolverAnswer:
    status: str  # "sat", "unsat" or "unknown"
    seconds: float  # reported only: no verdict reads it
    model: Any = None  # a z3 ModelRef when sat
    reason: str = ""  # why unknown (the resource limit, ...)
    units: int = 0  # resource units the check spent


def check(solver: Any, *assumptions: Z3Term) -> SolverAnswer:
    t0 = time.perf_counter()
    before = units_spent(solver)
    r = solver.check(*[to_z3(a) for a in assumptions])
    dt = time.perf_counter() - t0
    units = units_spent(solver) - before
    if r == z3.sat:
        return SolverAnswer("sat", dt, solver.model(), units=units)
    if r == z3.unsat:
        return SolverAnswer("unsat", dt, units=units)
    reason = str(solver.reason_unknown())
    if reason == "canceled":  # what Z3 says when the resource limit stops it
        reason = f"resource limit reached ({units:,} units)"
    return SolverAnswer("unknown", dt, reason=reason, units=units)


def is_true(model: Any, term: Z3Term) -> bool:
    return bool(z3.is_true(model.eval(to_z3(term), model_completion=True)))


def int_value(model: Any, term: Any) -> int:
    if isinstance(term, int):
        return term
    return py_int(model.eval(term, model_completion=True))
