"""Proof obligations for the page layer: initiation, consecution, safety.

Inv is the conjunction of the `step`-scope invariants (safety properties and
aux strengthening lemmas) of `model/invariants.py`; T is the disjunction of
all page-action instances (action x concrete parameters). Consecution is
checked per action (the disjunction of its instances), which keeps queries
small and CTIs readable; each CTI is re-evaluated on the concrete model.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import z3

from kvpocket.model.invariants import INVARIANTS, Invariant
from kvpocket.model.logic import CONCRETE
from kvpocket.model.pages import PAGE_ACTIONS
from kvpocket.model.state import Layout
from kvpocket.verify.proofs.bounded import Instance, page_instances
from kvpocket.verify.proofs.cti import Cti
from kvpocket.verify.proofs.solver import check, is_true, new_solver
from kvpocket.verify.proofs.symbolic_exec import (
    concrete_state,
    effect_state,
    equal_states,
    fix_state,
    get_slot,
    guard_term,
    slot_name,
    symbolic_state,
)
from kvpocket.verify.proofs.z3ops import Z3OPS, lit, to_z3

PROVED, VIOLATED, UNKNOWN = "proved", "violated", "unknown"


def step_invariants() -> list[Invariant]:
    return [i for i in INVARIANTS if i.scope == "step"]


def safety_invariants() -> list[Invariant]:
    return [i for i in INVARIANTS if i.scope == "step" and not i.aux]


@dataclass
class ProofOutcome:
    obligation: str
    status: str
    seconds: float
    cti: Cti | None = None
    detail: str = ""
    extra: dict[str, object] = field(default_factory=dict)


def _conj(lay: Layout, invs: Iterable[Invariant], s: object) -> object:
    return Z3OPS.and_(*(i.predicate(Z3OPS, lay, s) for i in invs))  # type: ignore[arg-type]


def check_init(lay: Layout, name: str, invs: list[Invariant] | None = None) -> ProofOutcome:
    invs = invs or step_invariants()
    t0 = time.perf_counter()
    x = symbolic_state(lay, "x")
    solver = new_solver()
    solver.add(*fix_state(x, lay.initial_state()))
    solver.add(to_z3(Z3OPS.not_(_conj(lay, invs, x.state))))
    r = check(solver)
    dt = time.perf_counter() - t0
    if r.status == "unsat":
        return ProofOutcome("init", PROVED, dt)
    if r.status == "sat":
        broken = [i.name for i in invs if not i.predicate(CONCRETE, lay, lay.initial_state())]
        return ProofOutcome("init", VIOLATED, dt, detail="Init breaks " + ", ".join(broken))
    return ProofOutcome("init", UNKNOWN, dt, detail=r.reason)


def check_safety(lay: Layout, invs: list[Invariant] | None = None) -> ProofOutcome:
    """Inv implies each safety invariant (immediate here: they are conjuncts of Inv)."""
    invs = invs or step_invariants()
    t0 = time.perf_counter()
    x = symbolic_state(lay, "x")
    solver = new_solver()
    solver.add(to_z3(_conj(lay, invs, x.state)))
    bad = Z3OPS.not_(_conj(lay, safety_invariants(), x.state))
    r = check(solver, bad) if lit(bad) is None else None
    dt = time.perf_counter() - t0
    if r is None:
        return ProofOutcome("safety", PROVED if lit(bad) is False else VIOLATED, dt)
    status = {"unsat": PROVED, "sat": VIOLATED}.get(r.status, UNKNOWN)
    return ProofOutcome("safety", status, dt, detail=r.reason)


def _read_slots(term: object) -> set[str]:
    """Names of the state variables a term mentions (without the state prefix)."""
    if lit(term) is not None:
        return set()
    names: set[str] = set()
    seen: set[int] = set()
    todo = [term]
    while todo:
        t = todo.pop()
        tid = t.get_id()  # type: ignore[attr-defined]
        if tid in seen:
            continue
        seen.add(tid)
        if z3.is_const(t) and t.decl().kind() == z3.Z3_OP_UNINTERPRETED:  # type: ignore[attr-defined]
            names.add(str(t).split(".", 1)[1])
        else:
            todo.extend(t.children())  # type: ignore[attr-defined]
    return names


def check_consecution(lay: Layout, name: str, invs: list[Invariant] | None = None,
                      actions: Iterable[str] | None = None) -> list[ProofOutcome]:
    """Inv and T_action imply Inv', one outcome per page action.

    For speed, each (action, invariant) pair is one query over only the instances that
    change a variable the invariant reads (the others preserve it syntactically).
    """
    invs = invs or step_invariants()
    x = symbolic_state(lay, "x")
    y = symbolic_state(lay, "y")
    solver = new_solver()
    solver.add(to_z3(_conj(lay, invs, x.state)))
    # Inv' split into conjuncts, each with the set of variables it reads.
    post_parts: list[tuple[str, object, set[str]]] = []
    for inv in invs:
        term = inv.predicate(Z3OPS, lay, y.state)
        parts = [term] if lit(term) is not None or not z3.is_and(term) else term.children()
        for part in parts:
            post_parts.append((inv.name, part, _read_slots(part)))
    by_action: dict[str, list[Instance]] = {}
    for inst in page_instances(lay, actions):
        by_action.setdefault(inst.action, []).append(inst)
    out: list[ProofOutcome] = []
    for action, insts in by_action.items():
        t0 = time.perf_counter()
        ob = f"consecution:{action}"
        options: list[tuple[Instance, object, set[str]]] = []
        for inst in insts:
            g = guard_term(lay, x.state, inst)
            if lit(g) is False:
                continue  # pruned: the guard is false for these parameters in every state
            post = effect_state(lay, x.state, inst)
            changed = {slot_name(sl) for sl, v in x.vars if get_slot(post, sl) is not v}
            options.append((inst, Z3OPS.and_(g, *equal_states(lay, y.state, post)), changed))
        changed_any = set().union(*(ch for _, _, ch in options)) if options else set()
        parts = [t for _, t, rd in post_parts if rd & changed_any]
        relevant = [(i, f) for i, f, ch in options
                    if any(ch & rd for _, _, rd in post_parts)]
        outcome = ProofOutcome(ob, PROVED, 0.0, extra={"instances": len(options),
                                                  "conjuncts": len(parts)})
        if relevant and parts:
            solver.push()
            solver.add(z3.Or(*[to_z3(f) for _, f in relevant]))
            solver.add(z3.Not(z3.And(*[to_z3(t) for t in parts])))
            r = check(solver)
            model = r.model
            solver.pop()
            if r.status == "sat":
                inst = next(i for i, f in relevant if is_true(model, f))
                outcome.status = VIOLATED
                outcome.cti = _cti(lay, name, invs, model, x, inst)
            elif r.status != "unsat":
                outcome.status = UNKNOWN
                outcome.detail = r.reason
        outcome.seconds = time.perf_counter() - t0
        out.append(outcome)
    return out


def _cti(lay: Layout, name: str, invs: list[Invariant], model: object, x: object,
         inst: Instance) -> Cti:
    pre = concrete_state(lay, model, x)  # type: ignore[arg-type]
    a = PAGE_ACTIONS[inst.action]
    params = inst.param_dict
    enabled = all(ok for _, ok in a.guard(CONCRETE, lay, pre, dict(params)))
    if not enabled:
        return Cti(name, inst.action, params, pre, None, [], note="Z3 enabled, Python not")
    post = a.effect(CONCRETE, lay, pre, dict(params))
    broken = [i.name for i in invs if not i.predicate(CONCRETE, lay, post)]
    pre_broken = [i.name for i in invs if not i.predicate(CONCRETE, lay, pre)]
    note = f"pre-state already breaks {pre_broken} on the concrete model" if pre_broken else ""
    return Cti(name, inst.action, params, pre, post, broken, note)


def prove_config(lay: Layout, name: str, actions: Iterable[str] | None = None
                 ) -> list[ProofOutcome]:
    """All obligations for one configuration."""
    return [check_init(lay, name), *check_consecution(lay, name, actions=actions),
            check_safety(lay)]
