"""Bounded model checking from Init (or from the state after an API prefix): the
symbolic engine, the explicit one's independent cross-check (`explicit_bmc.py`; what the two
share is in `bounded.py`).

The run is unrolled one step at a time from its concrete start state, with
one Boolean indicator per enabled action instance and step. Every action
runs from its single definition (API programs through the symbolic executor,
page actions through their guard and effect) on the state the steps before
can reach: each variable of step k is a literal, or a fresh variable tagged
with the values step k-1 can give it (`z3ops.tag`), so guards, lookups and
stores fold on everything the run cannot have changed yet, and actions that
cannot be enabled are left out. The solver is incremental; after each step it
asks, with an assumption literal, whether a safety invariant can be broken
(or a page-action guard violated inside an API action).

API layer: the alphabet of `api_instances` (resize's capacity and history are
symbolic: one instance for every value). Page layer: every page-action
instance. A satisfying assignment decodes into the shared trace format, with
the choices the API programs made.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import z3

from kvpocket.model.config import NONE
from kvpocket.model.logic import Term
from kvpocket.model.state import Layout, State
from kvpocket.verify.proofs.bounded import (
    BmcResult,
    api_instances,
    page_instances,
    properties,
    record_prefix,
    start_state,
)
from kvpocket.verify.proofs.solver import check, int_value, is_true, limited
from kvpocket.verify.proofs.symbolic_exec import (
    ChoiceRecord,
    effect_state,
    get_slot,
    guard_term,
    run_api,
    slot_name,
    state_slots,
)
from kvpocket.verify.proofs.z3ops import Z3OPS, Z3Term, bitvectors, int_var, lit, tag, to_z3, values
from kvpocket.verify.traces.trace import TraceStep


@dataclass
class StepAction:
    """One action instance enabled at one step: its indicator and what decodes it."""

    name: str
    params: dict[str, Any]  # concrete values, or Z3 terms for symbolic arguments
    indicator: Z3Term
    choices: list[ChoiceRecord] = field(default_factory=list)


@dataclass
class Step:
    """Step k of the unrolling: the actions that may run and the state they lead to."""

    actions: list[StepAction]
    constraints: list[Z3Term]  # exactly one indicator; definitions of the step's variables
    post: State
    changed: Z3Term  # the post-state differs from the pre-state
    guard_error: Z3Term  # a page-action guard fails inside the API action taken
    page_actions: int  # the most page actions one of the step's actions runs
    seconds: float


def unroll_step(lay: Layout, layer: str, pre: State, k: int) -> Step:
    """The actions of step k from `pre` (a state of literals and tagged variables).

    Each action instance runs from `pre` (API programs through the symbolic executor,
    page actions through their guard and effect); the ones that fold to disabled are
    left out. The post-state is one fresh variable per changed element, tagged with
    the values the enabled actions can give it, so the next step folds whatever
    this one cannot change.
    """
    t0 = time.perf_counter()
    acts: list[StepAction] = []
    parts: list[Z3Term] = []
    errors: list[Z3Term] = []
    posts: list[tuple[Z3Term, State]] = []
    longest = 1
    if layer == "api":
        for j, inst in enumerate(api_instances(lay.cfg)):
            args: dict[str, Any] = dict(inst.args)
            ranges: list[Z3Term] = []
            for name, (lo, hi) in inst.symbolic.items():
                v = int_var(f"s{k}.c{j}.arg.{name}")
                ranges.append(z3.And(lo <= v, v <= hi))  # global: the tag holds in every model
                args[name] = tag(v, frozenset(range(lo, hi + 1)))
            st = run_api(lay, pre, inst.program, inst.name, args, prefix=f"s{k}.c{j}",
                         reduce_symmetry=True)
            if st is None:
                continue
            ind = z3.Bool(f"s{k}.ind{j}.{inst.name}")
            parts.append(z3.Implies(ind, to_z3(st.enabled)))
            parts.extend(ranges)
            parts.extend(st.constraints)
            posts.append((ind, st.post))
            err = Z3OPS.or_(*(e for _, e in st.guard_errors))
            if lit(err) is not False:
                errors.append(z3.And(ind, to_z3(err)))
            acts.append(StepAction(inst.name, args, ind, list(st.choices)))
            longest = max(longest, len(st.steps))
    else:
        for j, pinst in enumerate(page_instances(lay)):
            g = guard_term(lay, pre, pinst)
            if lit(g) is False:
                continue
            ind = z3.Bool(f"s{k}.ind{j}.{pinst.action}")
            parts.append(z3.Implies(ind, to_z3(g)))
            posts.append((ind, effect_state(lay, pre, pinst)))
            acts.append(StepAction(pinst.action, pinst.param_dict, ind))
    inds = [a.indicator for a in acts]
    parts += [z3.Or(*inds), z3.AtMost(*inds, 1)] if inds else [z3.BoolVal(False)]
    post = _next_state(lay, pre, posts, f"s{k + 1}", parts)
    changed = Z3OPS.or_(*(Z3OPS.ne(get_slot(post, sl), get_slot(pre, sl))
                          for sl, _ in state_slots(lay) if get_slot(post, sl) is not get_slot(pre, sl)))
    guard_error = z3.Or(*errors) if errors else z3.BoolVal(False)
    return Step(acts, parts, post, to_z3(changed), guard_error, longest,
                time.perf_counter() - t0)


def _next_state(lay: Layout, pre: State, posts: list[tuple[Z3Term, State]], prefix: str,
                out: list[Z3Term]) -> State:
    """The state after the action taken: per element, an if-then-else over the actions that
    change it, named by a fresh variable tagged with its possible values (a literal when
    all actions agree)."""
    changes: dict[str, Any] = {}
    for slot, is_bool in state_slots(lay):
        old = get_slot(pre, slot)
        value: Term = old
        for ind, post in reversed(posts):
            new = get_slot(post, slot)
            if new is not old:
                value = Z3OPS.ite(ind, new, value)
        if value is old:
            continue
        if lit(value) is None:
            var = (z3.Bool if is_bool else int_var)(f"{prefix}.{slot_name(slot)}")
            out.append(var == value)
            value = tag(var, values(value))
        name, i = slot
        if i is None:
            changes[name] = value
        else:
            changes.setdefault(name, list(getattr(pre, name)))[i] = value
    return replace(pre, **{n: tuple(v) if isinstance(v, list) else v
                           for n, v in changes.items()})


# Resource units per depth's check (`solver.py`): 10x what the hardest default run spends
# (306 M, the unsafe policy's depth-7 check on gpu-host; docs/performance.md), so
# "unknown" means a search too big, never a slow machine.
BMC_RLIMIT = 3_000_000_000
INT_BITS = 12  # integers are signed 12-bit vectors in BMC; `_width_problem` keeps it exact


def bmc(lay: Layout, layer: str, depth: int, rlimit: int = BMC_RLIMIT,
        prefix: list[TraceStep] | None = None,
        on_depth: Callable[[int], None] | None = None) -> BmcResult:
    """Search for the shortest run (<= depth steps) that breaks an invariant.

    The run starts in Init, or (API layer) in the concrete state after `prefix`, a list
    of API steps replayed on the model; a trace found then starts with the prefix.
    Steps are unrolled one at a time from the start state, so each step only encodes
    what the steps before it can reach. Two reductions keep the search small without
    losing a shortest counterexample: every step must change the state (a step that
    does not could be cut out), and interchangeable choices (dead page records, free
    slots with the same outstanding work) take the lowest candidate. `on_depth(k)` is
    called as the search at depth k starts (a progress line: one depth can take minutes).
    """
    head = record_prefix(lay, prefix) if prefix else []
    state = start_state(lay, head) if head else lay.initial_state()
    props = properties(layer)
    policy = lay.cfg.pocket.policy.value
    solver = limited(z3.SolverFor("QF_BV"), rlimit)
    steps: list[Step] = []
    solve = build = 0.0
    clock_bound = int(state.clock)
    with bitvectors(INT_BITS):
        for k in range(depth + 1):
            if on_depth is not None:
                on_depth(k)
            bad = z3.Bool(f"bad{k}")
            broken_now = Z3OPS.not_(Z3OPS.and_(*(i.predicate(Z3OPS, lay, state) for i in props)))
            err = steps[-1].guard_error if steps else z3.BoolVal(False)
            solver.add(bad == z3.Or(to_z3(broken_now), err))
            r = check(solver, bad)
            solve += r.seconds
            if r.status == "sat":
                trace = head + _decode(layer, r.model, steps)
                final = [i.name for i in props if is_true(r.model, Z3OPS.not_(
                    i.predicate(Z3OPS, lay, state)))]
                if steps and is_true(r.model, err):
                    final.append("page-action guard violated inside an API action")
                return BmcResult(layer, policy, "violated", len(trace), trace, final, solve,
                                 build)
            if r.status != "unsat":
                return BmcResult(layer, policy, "unknown", k, [], [], solve, build, r.reason)
            solver.add(z3.Not(bad))
            if k == depth:
                break
            step = unroll_step(lay, layer, state, k)
            clock_bound += step.page_actions  # each page action ticks the LRU clock once at most
            build += step.seconds
            too_wide = _width_problem(lay, clock_bound)
            if too_wide:
                return BmcResult(layer, policy, "unknown", k, [], [], solve, build, too_wide)
            solver.add(*step.constraints)
            solver.add(z3.Or(step.changed, step.guard_error))
            steps.append(step)
            state = step.post
    return BmcResult(layer, policy, "proved", depth, [], [], solve, build)


def _width_problem(lay: Layout, clock_bound: int) -> str:
    """Why some value BMC can meet might not fit INT_BITS ("" if all fit, so bit-vector
    arithmetic never wraps); the search then stops as unknown rather than go unsound."""
    cfg = lay.cfg
    largest = max(clock_bound, cfg.max_capacity, lay.pages, lay.total_slots, lay.seqs + 1,
                  len(lay.initial_state().entry))
    if largest >= 1 << (INT_BITS - 2):  # margin: sums and differences of two values
        return (f"values up to {largest} do not fit {INT_BITS}-bit integers; use a smaller "
                "--depth or configuration")
    return ""


def _decode(layer: str, model: Any, steps: list[Step]) -> list[TraceStep]:
    out: list[TraceStep] = []
    for step in steps:
        act = next(a for a in step.actions if is_true(model, a.indicator))
        choices: list[tuple[str, int]] = []
        for ch in act.choices:
            if is_true(model, ch.pc):
                v = int_value(model, ch.value)
                if v != NONE:
                    choices.append((ch.kind, v))
        params = {k: list(v) if isinstance(v, tuple) else
                  v if isinstance(v, int | list) else int_value(model, v)
                  for k, v in act.params.items()}
        out.append(TraceStep(act.name, params, layer, choices))
    return out
