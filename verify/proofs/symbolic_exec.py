"""Symbolic states and the symbolic executor for API programs.

A symbolic `State` has one Z3 constant per array element (Bool for the
boolean fields, Int otherwise); `tokens`/`block_keys` stay concrete (page
actions never touch them). `SymbolicExecutor` implements the `Executor`
protocol of `model/executor.py`, so an API program from `model/api.py` is
unrolled from its single definition:

* `when(c)` runs the body once under the path condition c (not at all when c
  folds to False, unconditionally when it folds to True);
* `do` applies guard + effect as ite(pc, effect, state) and records "guard
  false under pc" as a guard error;
* `choose` returns a fresh integer constrained to a legal candidate, or NONE if
  none is legal (the constraint goes to `constraints`);
* `fail` marks OutOfPages under pc: later operations run under "not failed",
  and the step's post-state is the pre-state, less the injected fault the
  failure consumed (`fail(..., consumed=...)`);
* `require(c)` conjoins "pc implies c" into the step's enabling condition.

A `UsageError` raised by Python code inside a `when` body (e.g. `close` on a
FREE sequence) cannot be run symbolically; `run_api` re-runs the program with
that `when` skipped and its condition negated into the enabling condition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import z3

from kvpocket.model.config import NONE
from kvpocket.model.errors import UsageError
from kvpocket.model.logic import Term
from kvpocket.model.pages import PAGE_ACTIONS, Params
from kvpocket.model.state import ARRAY_FIELDS, SCALAR_FIELDS, Layout, State
from kvpocket.verify.proofs.bounded import Instance
from kvpocket.verify.proofs.z3ops import Z3OPS, Z3Ops, Z3Term, int_var, lit, py_int, same, tag, to_z3, values

Slot = tuple[str, int | None]  # (field, index) of one state variable; None for scalars


def state_slots(lay: Layout) -> list[tuple[Slot, bool]]:
    """Every state variable of a configuration, with whether it is Boolean."""
    init = lay.initial_state()
    out: list[tuple[Slot, bool]] = []
    for name in ARRAY_FIELDS:
        for i, v in enumerate(getattr(init, name)):
            out.append(((name, i), isinstance(v, bool)))
    for name in SCALAR_FIELDS:
        out.append(((name, None), isinstance(getattr(init, name), bool)))
    return out


def slot_name(slot: Slot) -> str:
    name, i = slot
    return name if i is None else f"{name}[{i}]"


@dataclass
class SymState:
    """A State whose elements are Z3 constants, and the list of those constants."""

    state: State
    vars: list[tuple[Slot, Z3Term]]


def symbolic_state(lay: Layout, prefix: str) -> SymState:
    init = lay.initial_state()
    values: dict[str, Any] = {}
    arrays: dict[str, list[Z3Term]] = {n: [] for n in ARRAY_FIELDS}
    out: list[tuple[Slot, Z3Term]] = []
    for slot, is_bool in state_slots(lay):
        name = f"{prefix}.{slot_name(slot)}"
        v = z3.Bool(name) if is_bool else int_var(name)
        out.append((slot, v))
        if slot[1] is None:
            values[slot[0]] = v
        else:
            arrays[slot[0]].append(v)
    for n, xs in arrays.items():
        values[n] = tuple(xs)
    state = replace(init, **values)
    return SymState(state, out)


def get_slot(s: State, slot: Slot) -> Term:
    name, i = slot
    v = getattr(s, name)
    return v if i is None else v[i]


def equal_states(lay: Layout, a: State, b: State) -> list[Z3Term]:
    """Constraints a == b, element by element (identical terms are skipped)."""
    out: list[Z3Term] = []
    for slot, _ in state_slots(lay):
        x, y = get_slot(a, slot), get_slot(b, slot)
        if same(x, y):
            continue
        c = Z3OPS.eq(x, y)
        v = lit(c)
        if v is None:
            out.append(c)
        elif not v:
            out.append(z3.BoolVal(False))
    return out


def merge(ops: Z3Ops, c: Term, a: State, b: State) -> State:
    """ite(c, a, b) field by field; untouched elements keep their identity."""
    v = lit(c)
    if v is not None:
        return a if v else b
    changes: dict[str, Any] = {}
    for name in ARRAY_FIELDS:
        xa, xb = getattr(a, name), getattr(b, name)
        if xa is xb:
            continue
        changes[name] = tuple(x if x is y else ops.ite(c, x, y) for x, y in zip(xa, xb, strict=True))
    for name in SCALAR_FIELDS:
        xa, xb = getattr(a, name), getattr(b, name)
        if xa is not xb:
            changes[name] = ops.ite(c, xa, xb)
    return replace(b, **changes)


def concrete_state(lay: Layout, model: Any, sym: SymState) -> State:
    """The concrete State a Z3 model assigns to a symbolic state's variables."""
    init = lay.initial_state()
    values: dict[str, Any] = {}
    arrays: dict[str, list[Any]] = {n: [] for n in ARRAY_FIELDS}
    for (name, i), v in sym.vars:
        val = model.eval(v, model_completion=True)
        py: Any = bool(z3.is_true(val)) if z3.is_bool(v) else py_int(val)
        if i is None:
            values[name] = py
        else:
            arrays[name].append(py)
    for n, xs in arrays.items():
        values[n] = tuple(xs)
    return replace(init, **values)


def fix_state(sym: SymState, s: State) -> list[Z3Term]:
    """Constraints that pin a symbolic state to a concrete one."""
    return [v == to_z3(get_slot(s, slot)) for slot, v in sym.vars]


def guard_term(lay: Layout, s: State, inst: Instance) -> Term:
    a = PAGE_ACTIONS[inst.action]
    params: Params = dict(inst.params)
    return Z3OPS.and_(*(c for _, c in a.guard(Z3OPS, lay, s, params)))


def effect_state(lay: Layout, s: State, inst: Instance) -> State:
    return PAGE_ACTIONS[inst.action].effect(Z3OPS, lay, s, dict(inst.params))


# ---- the symbolic executor -------------------------------------------------------------


@dataclass
class ChoiceRecord:
    kind: str
    value: Term  # a Z3 Int or a Python int (a forced choice)
    pc: Term  # the path condition under which the choice is made


@dataclass
class SymbolicStep:
    action: str
    params: dict[str, Term]
    pc: Term


class SymbolicExecutor:
    def __init__(self, lay: Layout, state: State, prefix: str, reduce_symmetry: bool = False
                 ) -> None:
        self.ops = Z3OPS
        self.reduce_symmetry = reduce_symmetry  # interchangeable candidates: the lowest
        self.lay = lay
        self.s = state
        self.prefix = prefix
        self._pcs: list[Term] = []
        self.failed: Term = False
        self.consumed_alloc: Term = False
        self.consumed_copy: Term = False
        self.requires: list[Term] = []
        self.constraints: list[Z3Term] = []
        self.guard_errors: list[tuple[str, Term]] = []
        self.choices: list[ChoiceRecord] = []
        self.steps: list[SymbolicStep] = []
        self._cuts = 0  # cut-point variables named so far
        self._atoms: dict[int, Z3Term] = {id(v): v for v in _elements(state)}

    def pc(self) -> Term:
        return self.ops.and_(*self._pcs, self.ops.not_(self.failed))

    def do(self, action: str, **params: Term) -> None:
        pc = self.pc()
        if lit(pc) is False:
            return
        a = PAGE_ACTIONS[action]
        for label, ok in a.guard(self.ops, self.lay, self.s, params):
            err = self.ops.and_(pc, self.ops.not_(ok))
            if lit(err) is not False:
                self.guard_errors.append((f"{action}: {label}", err))
        post = a.effect(self.ops, self.lay, self.s, params)
        self.s = self._cut(merge(self.ops, pc, post, self.s))
        self.steps.append(SymbolicStep(action, dict(params), pc))

    def _cut(self, s: State) -> State:
        """Name every new compound element by a fresh variable (keeps terms linear)."""
        changes: dict[str, Any] = {}
        for name in ARRAY_FIELDS:
            xs = getattr(s, name)
            ys = tuple(self._atom(x) for x in xs)
            if any(a is not b for a, b in zip(xs, ys, strict=True)):
                changes[name] = ys
        for name in SCALAR_FIELDS:
            x = getattr(s, name)
            y = self._atom(x)
            if y is not x:
                changes[name] = y
        return replace(s, **changes) if changes else s

    def _atom(self, t: Term) -> Term:
        if lit(t) is not None or id(t) in self._atoms:
            return t
        vals = values(t)
        if vals is not None and len(vals) == 1:
            return next(iter(vals))
        v = (z3.Bool if z3.is_bool(t) else int_var)(f"{self.prefix}.t{self._cuts}")
        self._cuts += 1
        self.constraints.append(v == t)
        self._atoms[id(v)] = v
        return tag(v, vals)

    def when(self, cond: Term) -> Iterable[None]:
        v = lit(cond)
        if v is not None:
            return (None,) if v else ()
        return self._body(cond)

    def _body(self, cond: Term) -> Iterator[None]:
        self._pcs.append(cond)
        try:
            yield None
        finally:
            self._pcs.pop()

    def choose(self, kind: str, domain: range, legal: Callable[[int], Term],
               label: Callable[[int], object] | None = None,
               same: Callable[[int], tuple[Term, ...]] | None = None,
               among: Callable[[], Iterable[int]] | None = None) -> Term:
        # `among` is the concrete model's index of likely candidates: terms need the domain
        pc = self.pc()
        conds = [(x, legal(x)) for x in domain]
        conds = [(x, c) for x, c in conds if lit(c) is not False]
        if not conds:
            return NONE
        if same is not None and self.reduce_symmetry:
            conds = _lowest(self.ops, conds, same)
        if len(conds) == 1 and lit(conds[0][1]) is True:
            self.choices.append(ChoiceRecord(kind, conds[0][0], pc))
            return conds[0][0]
        v = int_var(f"{self.prefix}.choice{len(self.choices)}.{kind}")
        self._atoms[id(v)] = v
        none_legal = self.ops.not_(self.ops.or_(*(c for _, c in conds)))
        tag(v, {x for x, _ in conds} | ({NONE} if lit(none_legal) is not False else set()))
        options = [self.ops.and_(v == x, c) for x, c in conds]
        self.constraints.append(z3.Or(*[to_z3(o) for o in options],
                                      to_z3(self.ops.and_(v == NONE, none_legal))))
        self.choices.append(ChoiceRecord(kind, v, pc))
        return v

    def fail(self, reason: str, consumed: str | None = None) -> None:
        pc = self.pc()
        if consumed == "alloc":
            self.consumed_alloc = self.ops.or_(self.consumed_alloc, pc)
        elif consumed == "copy":
            self.consumed_copy = self.ops.or_(self.consumed_copy, pc)
        self.failed = self.ops.or_(self.failed, pc)

    def require(self, cond: Term, error: UsageError) -> None:
        self.requires.append(self.ops.implies(self.pc(), cond))


def _lowest(ops: Z3Ops, conds: list[tuple[int, Term]],
            same: Callable[[int], tuple[Term, ...]]) -> list[tuple[int, Term]]:
    """Each legal candidate only when no lower legal one is interchangeable with it."""
    out: list[tuple[int, Term]] = []
    for i, (x, c) in enumerate(conds):
        key = same(x)
        shadow = ops.or_(*(
            ops.and_(cy, *(ops.eq(a, b) for a, b in zip(same(y), key, strict=True)))
            for y, cy in conds[:i] if len(same(y)) == len(key)))
        cx = ops.and_(c, ops.not_(shadow))
        if lit(cx) is not False:
            out.append((x, cx))
    return out


def _elements(s: State) -> list[Term]:
    out: list[Term] = []
    for name in ARRAY_FIELDS:
        out.extend(getattr(s, name))
    out.extend(getattr(s, name) for name in SCALAR_FIELDS)
    return out


@dataclass
class ApiStep:
    """One API action instance unrolled symbolically from a pre-state."""

    action: str
    args: dict[str, Any]
    enabled: Term
    post: State
    failed: Term
    guard_errors: list[tuple[str, Term]]
    choices: list[ChoiceRecord]
    constraints: list[Z3Term]
    steps: list[SymbolicStep] = field(default_factory=list)


def run_api(lay: Layout, pre: State, program: Callable[..., None], action: str,
            args: dict[str, Any], prefix: str, reduce_symmetry: bool = False
            ) -> ApiStep | None:
    """Unroll `program(ex, **args)` from `pre`; None if it can never be enabled. Usage
    errors are `ex.require`s (a conjunct of `enabled`); one raised outright is an argument
    check that rejects these arguments in every state."""
    ex = SymbolicExecutor(lay, pre, prefix, reduce_symmetry)
    try:
        program(ex, **args)
    except UsageError:
        return None
    ops = ex.ops
    enabled = ops.and_(*ex.requires)
    if lit(enabled) is False:
        return None
    # Exact rollback; an injected fault is consumed by the failure it caused.
    rolled_back = replace(
        pre, fault_alloc=ops.and_(pre.fault_alloc, ops.not_(ex.consumed_alloc)),
        fault_copy=ops.and_(pre.fault_copy, ops.not_(ex.consumed_copy)))
    post = merge(ops, ex.failed, rolled_back, ex.s)
    return ApiStep(action, args, enabled, post, ex.failed, ex.guard_errors, ex.choices,
                   ex.constraints, ex.steps)
