"""Bounded model checking from Init, over API actions or over page actions.

The transition relation of one step is built once as a template over state
variables x (pre) and y (post), with one Boolean indicator per action
instance; step i is the template with x, y, indicators and choice variables
renamed to step i's copies (`z3.substitute`). The solver grows one step at a
time and asks, with an assumption literal, whether an invariant can be
broken (or a page-action guard violated inside an API program) after step k.

API layer: every API action of `model/api.py` except `commit` (it reads token
content), with concrete arguments: `create(seq, prompt=())`, `resume`,
`stop_committing`, `suspend`, `close` per sequence, `resize(seq, c, h)` for
0 <= h <= c <= max capacity, `pressure(level, pool_group, n)` for 1 <= n <=
slots at level, `advance(stream)`, plus the fault injections `fail_allocation`
/ `fail_copy` (they set the flag `Model.fail_*` sets).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import z3

from kvpocket.model import api
from kvpocket.model.config import NONE, KVConfig
from kvpocket.model.invariants import INVARIANTS, Invariant
from kvpocket.model.state import Layout

from .solver import check, is_true
from .symbolic import (
    SymbolicExecutor,
    effect_state,
    equal_states,
    fix_state,
    guard_term,
    page_instances,
    run_api,
    symbolic_state,
)
from .z3ops import Z3OPS, Z3Term, lit, to_z3


def _fail_allocation(ex: SymbolicExecutor) -> None:
    ex.s = replace(ex.s, fault_alloc=True)


def _fail_copy(ex: SymbolicExecutor) -> None:
    ex.s = replace(ex.s, fault_copy=True)


def api_instances(cfg: KVConfig) -> list[tuple[str, dict[str, Any], Callable[..., None]]]:
    """(name, arguments, program) for every API action instance BMC explores."""
    out: list[tuple[str, dict[str, Any], Callable[..., None]]] = []
    for q in range(cfg.num_sequences):
        out.append(("create", {"seq": q, "prompt": ()}, api.create))
        out.append(("resume", {"seq": q}, api.resume))
        for c in range(cfg.max_capacity + 1):
            for h in range(c + 1):
                out.append(("resize", {"seq": q, "capacity": c, "history": h}, api.resize))
        out.append(("stop_committing", {"seq": q}, api.stop_committing))
        out.append(("suspend", {"seq": q}, api.suspend))
        out.append(("close", {"seq": q}, api.close))
    for lv, n in enumerate(cfg.slots_per_level):
        for pg in range(cfg.num_pool_groups):
            for k in range(1, n + 1):
                out.append(("pressure", {"level": lv, "pool_group": pg, "slots": k},
                            api.pressure))
    for stream in range(cfg.num_sequences + 1):
        out.append(("advance", {"stream": stream}, api.advance))
    out.append(("fail_allocation", {}, _fail_allocation))
    out.append(("fail_copy", {}, _fail_copy))
    return out


@dataclass
class Choice:
    kind: str
    value: Any
    pc: Any


@dataclass
class TemplateAction:
    name: str
    params: dict[str, Any]
    indicator: Z3Term
    choices: list[Choice] = field(default_factory=list)


@dataclass
class Template:
    layer: str  # "api" or "page"
    x: Any
    y: Any
    actions: list[TemplateAction]
    relation: Z3Term
    guard_error: Z3Term
    fresh: list[Z3Term]  # choice variables to rename per step
    seconds: float = 0.0


def build_template(lay: Layout, layer: str) -> Template:
    t0 = time.perf_counter()
    x, y = symbolic_state(lay, "x"), symbolic_state(lay, "y")
    acts: list[TemplateAction] = []
    parts: list[Z3Term] = []
    errors: list[Z3Term] = []
    fresh: list[Z3Term] = []
    if layer == "api":
        for j, (name, args, program) in enumerate(api_instances(lay.cfg)):
            st = run_api(lay, x.state, program, name, args, prefix=f"c{j}")
            if st is None:
                continue
            ind = z3.Bool(f"ind{j}.{name}")
            ta = TemplateAction(name, {k: list(v) if isinstance(v, tuple) else v
                                       for k, v in args.items()}, ind)
            ta.choices = [Choice(ch.kind, ch.value, ch.pc) for ch in st.choices]
            fresh.extend(st.fresh)
            body = Z3OPS.and_(st.enabled, *st.constraints, *equal_states(lay, y.state, st.post))
            parts.append(z3.Implies(ind, to_z3(body)))
            err = Z3OPS.or_(*(e for _, e in st.guard_errors))
            if lit(err) is not False:
                errors.append(z3.And(ind, to_z3(err)))
            acts.append(ta)
    else:
        for j, inst in enumerate(page_instances(lay)):
            g = guard_term(lay, x.state, inst)
            if lit(g) is False:
                continue
            ind = z3.Bool(f"ind{j}.{inst.action}")
            post = effect_state(lay, x.state, inst)
            parts.append(z3.Implies(ind, to_z3(Z3OPS.and_(g, *equal_states(lay, y.state, post)))))
            acts.append(TemplateAction(inst.action, inst.param_dict, ind))
    inds = [a.indicator for a in acts]
    relation = z3.And(z3.Or(*inds), z3.AtMost(*inds, 1), *parts)
    guard_error = z3.Or(*errors) if errors else z3.BoolVal(False)
    return Template(layer, x, y, acts, relation, guard_error, fresh, time.perf_counter() - t0)


@dataclass
class TraceStep:
    action: str
    params: dict[str, Any]
    layer: str
    choices: list[tuple[str, int]]


@dataclass
class BmcResult:
    layer: str
    policy: str
    status: str  # "violated" (a trace found), "proved" (none up to depth), "unknown"
    depth: int  # steps of the trace found, or the depth explored
    steps: list[TraceStep]
    broken: list[str]
    seconds: float
    build_seconds: float
    detail: str = ""


def properties(layer: str) -> list[Invariant]:
    """What BMC looks for: a safety invariant (not an aux lemma) broken after a step.

    Aux lemmas and the API-scope invariants are left to the induction proof and to the
    concrete replay (which checks every invariant); keeping the bad-state formula small
    is what makes the unrolling fast.
    """
    return [i for i in INVARIANTS if i.scope == "step" and not i.aux]


def bmc(lay: Layout, layer: str, depth: int, template: Template | None = None,
        timeout_ms: int = 120_000) -> BmcResult:
    """Search for the shortest run from Init (<= depth steps) that breaks an invariant."""
    tpl = template or build_template(lay, layer)
    t0 = time.perf_counter()
    props = properties(layer)
    policy = lay.cfg.pocket.policy.value
    solver = _incremental_solver(timeout_ms)
    states = [symbolic_state(lay, "s0")]
    solver.add(*fix_state(states[0], lay.initial_state()))
    renames: list[list[tuple[Z3Term, Z3Term]]] = []
    errs: list[Z3Term] = []
    for k in range(depth + 1):
        cur = states[k]
        bad = z3.Bool(f"bad{k}")
        broken_now = Z3OPS.not_(Z3OPS.and_(*(i.predicate(Z3OPS, lay, cur.state) for i in props)))
        solver.add(bad == z3.Or(to_z3(broken_now), errs[-1] if errs else z3.BoolVal(False)))
        r = check(solver, bad)
        if r.status == "sat":
            steps = _decode(tpl, r.model, renames)
            final = [i.name for i in props if is_true(r.model, Z3OPS.not_(
                i.predicate(Z3OPS, lay, cur.state)))]
            if errs and is_true(r.model, errs[-1]):
                final.append("page-action guard violated inside an API action")
            return BmcResult(layer, policy, "violated", k, steps, final,
                             time.perf_counter() - t0, tpl.seconds)
        if r.status != "unsat":
            return BmcResult(layer, policy, "unknown", k, [], [], time.perf_counter() - t0,
                             tpl.seconds, r.reason)
        solver.add(z3.Not(bad))
        if k == depth:
            break
        nxt = symbolic_state(lay, f"s{k + 1}")
        pairs: list[tuple[Z3Term, Z3Term]] = []
        pairs += [(v, w) for (_, v), (_, w) in zip(tpl.x.vars, cur.vars, strict=True)]
        pairs += [(v, w) for (_, v), (_, w) in zip(tpl.y.vars, nxt.vars, strict=True)]
        pairs += [(a.indicator, z3.Bool(f"s{k}.{a.indicator}")) for a in tpl.actions]
        pairs += [(v, z3.Const(f"s{k}.{v}", v.sort())) for v in tpl.fresh]
        solver.add(z3.substitute(tpl.relation, *pairs))
        errs.append(z3.substitute(tpl.guard_error, *pairs))
        renames.append(pairs)
        states.append(nxt)
    return BmcResult(layer, policy, "proved", depth, [], [], time.perf_counter() - t0,
                     tpl.seconds)


def _incremental_solver(timeout_ms: int) -> Any:
    import os
    kind = os.environ.get("KV_BMC_SOLVER", "default")
    if kind == "tactic":
        s = z3.Then("simplify", "propagate-values", "solve-eqs", "smt").solver()
    elif kind == "lia":
        s = z3.SolverFor("QF_LIA")
    else:
        s = z3.Solver()
    s.set("timeout", timeout_ms)
    return s


def _decode(tpl: Template, model: Any, renames: list[list[tuple[Z3Term, Z3Term]]]
            ) -> list[TraceStep]:
    steps: list[TraceStep] = []
    for pairs in renames:

        def sub(t: Any, p: list[tuple[Z3Term, Z3Term]] = pairs) -> Any:
            return z3.substitute(to_z3(t), *p)

        act = next(a for a in tpl.actions if is_true(model, sub(a.indicator)))
        choices: list[tuple[str, int]] = []
        for ch in act.choices:
            if not is_true(model, sub(ch.pc)):
                continue
            v = ch.value if isinstance(ch.value, int) else int(
                model.eval(sub(ch.value), model_completion=True).as_long())
            if v != NONE:
                choices.append((ch.kind, v))
        steps.append(TraceStep(act.name, dict(act.params), tpl.layer, choices))
    return steps
