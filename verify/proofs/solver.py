"""Solver plumbing: one place for timeouts, result names and model extraction."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import z3

from kvpocket.verify.proofs.z3ops import Z3Term, py_int, to_z3

DEFAULT_TIMEOUT_MS = 60_000


def new_solver(timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Any:
    s = z3.Then("simplify", "propagate-values", "solve-eqs", "smt").solver()
    s.set("timeout", timeout_ms)
    return s


@dataclass
class SolverAnswer:
    status: str  # "sat", "unsat" or "unknown"
    seconds: float
    model: Any = None  # a z3 ModelRef when sat
    reason: str = ""  # why unknown (timeout, ...)


def check(solver: Any, *assumptions: Z3Term) -> SolverAnswer:
    t0 = time.perf_counter()
    r = solver.check(*[to_z3(a) for a in assumptions])
    dt = time.perf_counter() - t0
    if r == z3.sat:
        return SolverAnswer("sat", dt, solver.model())
    if r == z3.unsat:
        return SolverAnswer("unsat", dt)
    return SolverAnswer("unknown", dt, reason=str(solver.reason_unknown()))


def is_true(model: Any, term: Z3Term) -> bool:
    return bool(z3.is_true(model.eval(to_z3(term), model_completion=True)))


def int_value(model: Any, term: Any) -> int:
    if isinstance(term, int):
        return term
    return py_int(model.eval(term, model_completion=True))
