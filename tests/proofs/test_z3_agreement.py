"""The Z3 transition of every page action agrees with the Python model on reachable states."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import z3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpocket.model.config import KVConfig, full_life_cycle, swa_life_cycle
from kvpocket.model.errors import ModelError
from kvpocket.model.logic import CONCRETE
from kvpocket.model.machine import Model
from kvpocket.model.pages import PAGE_ACTIONS, PageAction
from kvpocket.model.state import Layout, State
from kvpocket.verify.proofs.bounded import Instance, page_instances
from kvpocket.verify.proofs.symbolic_exec import (
    equal_states,
    fix_state,
    get_slot,
    state_slots,
    symbolic_state,
)
from kvpocket.verify.proofs.z3ops import Z3OPS, bitvectors, py_int, tag, to_z3

CFG = KVConfig(tokens_per_block=2, life_cycles=(swa_life_cycle(window=3), full_life_cycle()),
               slots_per_level=(3, 2), num_sequences=2, max_blocks=3).with_pocket(True, "revalidate")
LAY = Layout(CFG)
INSTANCES = page_instances(LAY)

Effect = Callable[..., State]


def agreement(pre: State, inst: Instance, z3_action: PageAction | None = None,
              py_action: PageAction | None = None, lay: Layout = LAY) -> str | None:
    """None if the Z3 transition (pre fixed) agrees with Python; else what differs."""
    za = z3_action or PAGE_ACTIONS[inst.action]
    pa = py_action or PAGE_ACTIONS[inst.action]
    params = inst.param_dict
    py_enabled = all(ok for _, ok in pa.guard(CONCRETE, lay, pre, dict(params)))
    x, y = symbolic_state(lay, "x"), symbolic_state(lay, "y")
    guard = Z3OPS.and_(*(c for _, c in za.guard(Z3OPS, lay, x.state, dict(params))))
    relation = z3.And(to_z3(guard), *equal_states(lay, y.state, za.effect(Z3OPS, lay, x.state,
                                                                             dict(params))))
    s = z3.Solver()
    s.add(*fix_state(x, pre))
    z_enabled = s.check(to_z3(guard)) == z3.sat
    if z_enabled != py_enabled:
        return f"enabledness: z3={z_enabled} python={py_enabled}"
    if not py_enabled:
        return None
    post = pa.effect(CONCRETE, lay, pre, dict(params))
    s.add(relation)
    if s.check(*fix_state(y, post)) != z3.sat:
        return "the Python post-state does not satisfy the Z3 transition"
    differs = z3.Or(*[z3.Not(c) for c in fix_state(y, post)])
    if s.check(differs) != z3.unsat:
        return "the Z3 transition allows another post-state"
    return None


API_STEP = st.one_of(
    st.tuples(st.just("create"), st.integers(0, 1), st.lists(st.integers(0, 2), max_size=4)),
    st.tuples(st.just("resume"), st.integers(0, 1)),
    st.tuples(st.just("resize"), st.integers(0, 1), st.integers(0, 6), st.integers(0, 6)),
    st.tuples(st.just("commit"), st.integers(0, 1), st.lists(st.integers(0, 2), max_size=3)),
    st.tuples(st.just("stop_committing"), st.integers(0, 1)),
    st.tuples(st.just("suspend"), st.integers(0, 1)),
    st.tuples(st.just("close"), st.integers(0, 1)),
    st.tuples(st.just("pressure"), st.integers(0, 1), st.just(0), st.integers(1, 2)),
    st.tuples(st.just("advance"), st.integers(0, 2)),
)


def reachable(steps: list[tuple[object, ...]]) -> State:
    m = Model(CFG)
    for step in steps:
        name, *args = step
        try:
            if name == "resize":
                seq, cap, h = (int(str(a)) for a in args)
                m.resize(seq, max(cap, h), min(cap, h))
            else:
                getattr(m, str(name))(*args)
        except ModelError:
            pass
    return m.state


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(API_STEP, max_size=12), pick=st.integers(0, 10**9),
       enabled_only=st.booleans())
def test_z3_transition_agrees_with_python(steps: list[tuple[object, ...]], pick: int,
                                          enabled_only: bool) -> None:
    pre = reachable(steps)
    pool = INSTANCES
    if enabled_only:
        pool = [i for i in INSTANCES if all(
            ok for _, ok in PAGE_ACTIONS[i.action].guard(CONCRETE, LAY, pre, i.param_dict))]
    inst = pool[pick % len(pool)]
    assert agreement(pre, inst) is None, inst


CFG1 = KVConfig(tokens_per_block=2, life_cycles=(swa_life_cycle(window=3),),
                slots_per_level=(2, 2), num_sequences=1, max_blocks=3).with_pocket(True, "unsafe")
LAY1 = Layout(CFG1)


def _reachable_with_pocket() -> State:
    m = Model(CFG1)
    m.create(0)
    assert m.resume(0)
    m.stop_committing(0)
    assert m.resize(0, 4, 2)
    assert m.resize(0, 4, 4)
    return m.state


def _mutate(action: PageAction) -> PageAction:
    """The same action with an effect that forgets to unqueue nothing but sets a flag."""
    def effect(ops: object, lay: Layout, s: State, p: dict[str, object]) -> State:
        post = action.effect(ops, lay, s, p)  # type: ignore[arg-type]
        return replace(post, clock=ops.add(post.clock, 1))  # type: ignore[attr-defined]
    return replace(action, effect=effect)


def _weaken(action: PageAction) -> PageAction:
    """The same action with its last guard condition dropped."""
    return replace(action, conditions=lambda ops, lay, s, p: action.conditions(ops, lay, s, p)[:-1])


def test_agreement_check_detects_a_one_sided_change() -> None:
    pre = _reachable_with_pocket()
    assert any(x != -1 for x in pre.pocket), "the scenario parks a page"
    insts = page_instances(LAY1)

    def enabled(a: PageAction, i: Instance) -> bool:
        return all(ok for _, ok in a.guard(CONCRETE, LAY1, pre, i.param_dict))

    inst = next(i for i in insts if i.action == "drain" and enabled(PAGE_ACTIONS[i.action], i))
    assert agreement(pre, inst, lay=LAY1) is None
    changed = _mutate(PAGE_ACTIONS[inst.action])
    assert agreement(pre, inst, z3_action=changed, lay=LAY1) is not None
    assert agreement(pre, inst, py_action=changed, lay=LAY1) is not None
    # enabledness: an instance disabled only by its last guard condition
    disabled = next(i for i in insts if not enabled(PAGE_ACTIONS[i.action], i)
                    and enabled(_weaken(PAGE_ACTIONS[i.action]), i))
    weak = _weaken(PAGE_ACTIONS[disabled.action])
    assert agreement(pre, disabled, lay=LAY1) is None
    assert agreement(pre, disabled, z3_action=weak, lay=LAY1) is not None
    assert agreement(pre, disabled, py_action=weak, lay=LAY1) is not None


# ---- the same, over variables tagged with value sets (how BMC folds) ----------------


def _tagged_state(pre: State, rng: random.Random) -> tuple[State, list[Any]]:
    """`pre` as fresh variables, each tagged with its value and some others."""
    sym = symbolic_state(LAY, "t")
    fixes: list[Any] = []
    values_of: dict[str, Any] = {}
    for (slot, var) in sym.vars:
        v = get_slot(pre, slot)
        if not isinstance(v, bool):
            var = tag(var, {v, *rng.sample(range(0, 4), rng.randint(1, 2))})
        fixes.append(to_z3(var) == to_z3(v))
        name, i = slot
        if i is None:
            values_of[name] = var
        else:
            values_of.setdefault(name, []).append(var)
    changes = {k: tuple(v) if isinstance(v, list) else v for k, v in values_of.items()}
    return replace(pre, **changes), fixes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(API_STEP, max_size=10), pick=st.integers(0, 10**9),
       seed=st.integers(0, 2**16), bits=st.sampled_from([None, 12]))
def test_guard_and_effect_over_tagged_variables_match_python(
        steps: list[tuple[object, ...]], pick: int, seed: int, bits: int | None) -> None:
    pre = reachable(steps)
    inst = INSTANCES[pick % len(INSTANCES)]
    a, params = PAGE_ACTIONS[inst.action], inst.param_dict
    py_ok = all(ok for _, ok in a.guard(CONCRETE, LAY, pre, dict(params)))

    def check() -> None:
        sym, fixes = _tagged_state(pre, random.Random(seed))
        guard = Z3OPS.and_(*(c for _, c in a.guard(Z3OPS, LAY, sym, dict(params))))
        s = z3.Solver()
        s.add(*fixes)
        assert s.check() == z3.sat
        m = s.model()
        assert z3.is_true(m.eval(to_z3(guard), model_completion=True)) == py_ok, inst
        if not py_ok:
            return
        post = a.effect(CONCRETE, LAY, pre, dict(params))
        zpost = a.effect(Z3OPS, LAY, sym, dict(params))
        for slot, is_bool in state_slots(LAY):
            got = m.eval(to_z3(get_slot(zpost, slot)), model_completion=True)
            value = z3.is_true(got) if is_bool else py_int(got)
            assert value == get_slot(post, slot), (inst, slot)

    if bits is None:
        check()
    else:
        with bitvectors(bits):
            check()
