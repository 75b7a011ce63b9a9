"""Bounded model checking from Init (or from the state after an API prefix).

The transition relation of one step is built once as a template over state
variables x (pre) and y (post), with one Boolean indicator per action
instance; step i is the template with x, y, indicators and choice variables
renamed to step i's copies (`z3.substitute`). Each post variable is one
if-then-else over only the actions that change it (`_frame`), so an action
costs what it touches. The solver grows one step at a time (incremental) and
asks, with an assumption literal, whether a safety invariant can be broken (or
a page-action guard violated inside an API program) after step k.

API layer: the alphabet of `api_instances` (resize's capacity and history are
symbolic: one instance for every value). Page layer: every page-action
instance. Guards and effects are the model's own (`model/api.py`,
`model/pages.py`) run by the symbolic executor.
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
from kvpocket.model.logic import Term
from kvpocket.model.machine import Model
from kvpocket.model.state import Layout, State

from .solver import check, is_true
from .symbolic import (
    SymbolicExecutor,
    effect_state,
    fix_state,
    get_slot,
    guard_term,
    page_instances,
    run_api,
    state_slots,
    symbolic_state,
)
from .trace import TraceStep, run_api_step
from .z3ops import Z3OPS, Z3Term, lit, to_z3


def _fail_allocation(ex: SymbolicExecutor) -> None:
    ex.s = replace(ex.s, fault_alloc=True)


def _fail_copy(ex: SymbolicExecutor) -> None:
    ex.s = replace(ex.s, fault_copy=True)


@dataclass
class ApiInstance:
    """One API action of the BMC alphabet: fixed arguments plus symbolic ones.

    `symbolic` names integer arguments left to the solver, with their range: one
    instance stands for every value (resize's capacity and history), so the step
    relation holds one copy of the program instead of one per argument tuple.
    """

    name: str
    args: dict[str, Any]
    program: Callable[..., None]
    symbolic: dict[str, tuple[int, int]] = field(default_factory=dict)


def api_instances(cfg: KVConfig) -> list[ApiInstance]:
    """The API alphabet BMC explores, enumerated from the configuration.

    Per sequence: `create(seq, prompt=())`, `resume`, `resize(seq, c, h)` with c and h
    symbolic (0 <= h <= c <= max capacity; the model's own requires add h >= history),
    `stop_committing`, `suspend`, `close`; then `pressure(level, pool_group, n)` for
    1 <= n <= slots at the level, `advance(stream)` for every stream, and the fault
    injections `fail_allocation` / `fail_copy`. `commit` is left out (it reads token
    content, which stays concrete).
    """
    out: list[ApiInstance] = []
    cap = cfg.max_capacity
    for q in range(cfg.num_sequences):
        out.append(ApiInstance("create", {"seq": q, "prompt": ()}, api.create))
        out.append(ApiInstance("resume", {"seq": q}, api.resume))
        out.append(ApiInstance("resize", {"seq": q}, api.resize,
                               {"capacity": (0, cap), "history": (0, cap)}))
        out.append(ApiInstance("stop_committing", {"seq": q}, api.stop_committing))
        out.append(ApiInstance("suspend", {"seq": q}, api.suspend))
        out.append(ApiInstance("close", {"seq": q}, api.close))
    for lv, n in enumerate(cfg.slots_per_level):
        for pg in range(cfg.num_pool_groups):
            for k in range(1, n + 1):
                out.append(ApiInstance("pressure", {"level": lv, "pool_group": pg, "slots": k},
                                       api.pressure))
    for stream in range(cfg.num_sequences + 1):
        out.append(ApiInstance("advance", {"stream": stream}, api.advance))
    out.append(ApiInstance("fail_allocation", {}, _fail_allocation))
    out.append(ApiInstance("fail_copy", {}, _fail_copy))
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
    posts: list[tuple[Z3Term, State]] = []
    if layer == "api":
        for j, inst in enumerate(api_instances(lay.cfg)):
            name = inst.name
            sym = {k: z3.Int(f"c{j}.arg.{k}") for k in inst.symbolic}
            ranges = [z3.And(lo <= v, v <= inst.symbolic[k][1]) for k, (lo, _) in
                      zip(sym, inst.symbolic.values(), strict=True) for v in (sym[k],)]
            args = {**inst.args, **sym}
            st = run_api(lay, x.state, inst.program, name, args, prefix=f"c{j}")
            if st is None:
                continue
            ind = z3.Bool(f"ind{j}.{name}")
            ta = TemplateAction(name, {k: list(v) if isinstance(v, tuple) else v
                                       for k, v in args.items()}, ind)
            ta.choices = [Choice(ch.kind, ch.value, ch.pc) for ch in st.choices]
            fresh.extend(sym.values())
            fresh.extend(st.fresh)
            body = Z3OPS.and_(st.enabled, *ranges, *st.constraints)
            parts.append(z3.Implies(ind, to_z3(body)))
            posts.append((ind, st.post))
            err = Z3OPS.or_(*(e for _, e in st.guard_errors))
            if lit(err) is not False:
                errors.append(z3.And(ind, to_z3(err)))
            acts.append(ta)
    else:
        for j, pinst in enumerate(page_instances(lay)):
            g = guard_term(lay, x.state, pinst)
            if lit(g) is False:
                continue
            ind = z3.Bool(f"ind{j}.{pinst.action}")
            parts.append(z3.Implies(ind, to_z3(g)))
            posts.append((ind, effect_state(lay, x.state, pinst)))
            acts.append(TemplateAction(pinst.action, pinst.param_dict, ind))
    inds = [a.indicator for a in acts]
    relation = z3.And(z3.Or(*inds), z3.AtMost(*inds, 1), *parts,
                      *_frame(lay, x.state, y.state, posts))
    guard_error = z3.Or(*errors) if errors else z3.BoolVal(False)
    return Template(layer, x, y, acts, relation, guard_error, fresh, time.perf_counter() - t0)


def _frame(lay: Layout, x: State, y: State, posts: list[tuple[Z3Term, State]]
           ) -> list[Z3Term]:
    """y == the post-state of the action taken, one equation per state variable.

    Each variable's next value is an if-then-else over only the actions that change
    it (the others keep it), so an action costs what it touches, not the whole state.
    """
    out: list[Z3Term] = []
    for slot, _ in state_slots(lay):
        xv, yv = get_slot(x, slot), get_slot(y, slot)
        value: Term = xv
        for ind, post in reversed(posts):
            pv = get_slot(post, slot)
            if pv is not xv:
                value = Z3OPS.ite(ind, pv, value)
        out.append(yv == to_z3(value))
    return out


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
        timeout_ms: int = 120_000, prefix: list[TraceStep] | None = None) -> BmcResult:
    """Search for the shortest run (<= depth steps) that breaks an invariant.

    The run starts in Init, or (API layer) in the concrete state after `prefix`, a list
    of API steps replayed on the model; a trace found then starts with the prefix.
    """
    tpl = template or build_template(lay, layer)
    head = _record_prefix(lay, prefix) if prefix else []
    init = start_state(lay, head) if head else lay.initial_state()
    t0 = time.perf_counter()
    props = properties(layer)
    policy = lay.cfg.pocket.policy.value
    solver = _incremental_solver(timeout_ms)
    states = [symbolic_state(lay, "s0")]
    solver.add(*fix_state(states[0], init))
    renames: list[list[tuple[Z3Term, Z3Term]]] = []
    errs: list[Z3Term] = []
    for k in range(depth + 1):
        cur = states[k]
        bad = z3.Bool(f"bad{k}")
        broken_now = Z3OPS.not_(Z3OPS.and_(*(i.predicate(Z3OPS, lay, cur.state) for i in props)))
        solver.add(bad == z3.Or(to_z3(broken_now), errs[-1] if errs else z3.BoolVal(False)))
        r = check(solver, bad)
        if r.status == "sat":
            steps = head + _decode(tpl, r.model, renames)
            final = [i.name for i in props if is_true(r.model, Z3OPS.not_(
                i.predicate(Z3OPS, lay, cur.state)))]
            if errs and is_true(r.model, errs[-1]):
                final.append("page-action guard violated inside an API action")
            return BmcResult(layer, policy, "violated", len(steps), steps, final,
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
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    return s


def start_state(lay: Layout, prefix: list[TraceStep]) -> State:
    """The concrete state after an API-level prefix (its recorded choices are replayed)."""
    m = Model(lay.cfg)
    for i, step in enumerate(prefix):
        run_api_step(m, step)
        bad = m.violations("step")
        if bad:
            raise ValueError(f"BMC prefix step {i} ({step.action}) already breaks "
                             + ", ".join(b.name for b in bad))
    return m.state


def _record_prefix(lay: Layout, prefix: list[TraceStep]) -> list[TraceStep]:
    """The prefix with the model's choices filled in (the lowest legal ones when absent)."""
    m = Model(lay.cfg)
    out: list[TraceStep] = []
    for step in prefix:
        run_api_step(m, step)
        out.append(TraceStep(step.action, dict(step.params), "api",
                             [c for c in m.last_choices if c[1] != NONE]))
    return out


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
        params = {k: v if isinstance(v, int | list) else int(
            model.eval(sub(v), model_completion=True).as_long()) for k, v in act.params.items()}
        steps.append(TraceStep(act.name, params, tpl.layer, choices))
    return steps
