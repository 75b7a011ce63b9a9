"""Pocket safety for every size: universally quantified inductive invariants, decided by Z3.

The transition relation is read from the action table by the parametric interpretation
(`verify/proofs/epr.py`): pages, slots and sequences are uninterpreted sorts, block
ordinals and counts unbounded integers. The invariants below are the model's catalogue
(`model/invariants.py`), each under the name of the invariant it states: derived from the
model's definition where it is written for one page record (quantified over the page
sort) or loops over nothing, else restated with quantifiers instead of loops over records,
for the reason in `RESTATED` (a test checks that each agrees with the model's definition
on sampled reachable states). Obligations, per pocket policy:

* `init`: the model's Init (read off `Layout.initial_state`, where every array is
  uniform) satisfies every invariant;
* `consecution:<action>`: Inv and the guard of every instance of the action imply Inv
  after its effect. One query per instance of the enumerated parameters (life cycle,
  pocket position, status); pages, slots, sequences and ordinals stay symbolic. A model
  of the negation is a counterexample to induction, printed as a small instance.

Safety is immediate: the pocket-safety invariants are conjuncts of Inv.

Reference counts (`locks`, `holds`) are integers the effects add to and subtract from.
Their link to the block entries and pocket positions that name a page is a cardinality,
outside first-order logic; it is kept by *count terms* `n_lock(p)`, `n_hold(p)`,
`n_pocket(p)` with only facts true of every finite structure: a count is non-negative,
a page with a reference has a positive count, and after an action the count changes by
the references gained minus those lost at the (finitely many, symbolic) positions the
action stored to, each counted once. The uncommitted pages' counts are also stated
exactly without counting (such a page has at most one block entry, its owner's, and at
most one pocket position), which is what pocket safety needs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import z3

from kvpocket.model.config import KVConfig, SeqStatus
from kvpocket.model.invariants import INVARIANTS_BY_NAME
from kvpocket.model.pages import PAGE_ACTIONS, pool_group
from kvpocket.model.state import Layout, State, status
from kvpocket.verify.exits import EXIT_FOUND, EXIT_INCOMPLETE, EXIT_OK
from kvpocket.verify.interrupts import quiet_worker
from kvpocket.verify.proofs.epr import (
    SCALARS,
    ActionInstance,
    Alpha,
    EprLayout,
    EprOps,
    Field,
    Key,
    NotInFragment,
    Universe,
    as_fields,
    derive,
    finite_universe,
    instances,
    iteration_vars,
    symbolic_state,
    uniform_state,
)
from kvpocket.verify.proofs.solver import limited

PROVED, VIOLATED, UNKNOWN = "proved", "violated", "unknown"
# Resource units per query (`solver.py`): no proved query of the default shapes spends more
# than about 90,000 (docs/performance.md), so the first try has 50x that, and a query
# that needs more (a counterexample search, say) gets the full limit.
DEFAULT_RLIMIT = 50_000_000
FIRST_TRY_RLIMIT = 5_000_000


# ---- a state with its reference counts -------------------------------------------------

Count = Callable[[Any], Any]


@dataclass
class View:
    """A state in the parametric interpretation, with its reference-count terms."""

    uni: Universe
    s: State
    f: dict[str, Field]
    counts: dict[str, Count]

    def __getattr__(self, name: str) -> Any:
        if name in ("uni", "s", "f", "counts"):
            raise AttributeError(name)
        f = self.__dict__["f"]
        if name in f:
            return f[name]
        return getattr(self.__dict__["s"], name)


def entry_keys(uni: Universe, s: Any, o: Any) -> list[tuple[Any, ...]]:
    return [(s, lc, o) for lc in range(uni.lcs)]


def pocket_keys(uni: Universe, s: Any) -> list[tuple[Any, ...]]:
    return [(s, lc, k) for lc in range(uni.lcs) for k in range(uni.cap)]


def _entry_valid(uni: Universe, ix: tuple[Any, ...]) -> Any:
    return z3.And(uni.is_seq(ix[0]), uni.valid(uni.lcs, ix[1]), uni.valid("ord", ix[2]))


def _pocket_valid(uni: Universe, ix: tuple[Any, ...]) -> Any:
    return z3.And(uni.is_seq(ix[0]), uni.valid(uni.lcs, ix[1]), uni.valid(uni.cap, ix[2]))


def refs(v: View, kind: str, ix: tuple[Any, ...], p: Any) -> Any:
    """Does position ix (a block entry, or a pocket position for kind 'pocket') name p?"""
    uni = v.uni
    if kind == "pocket":
        return z3.And(_pocket_valid(uni, ix), v.f["pocket"](*ix) == p, p != uni.nil["page"])
    named = z3.And(_entry_valid(uni, ix), v.f["entry"](*ix) == p, p != uni.nil["page"])
    locked = v.f["entry_locked"](*ix)
    return z3.And(named, locked if kind == "lock" else z3.Not(locked))


COUNT_KINDS = {"lock": ("entry", "entry_locked"), "hold": ("entry", "entry_locked"),
               "pocket": ("pocket",)}


def _count_fn(fn: Any) -> Count:
    return lambda p: fn(p)


def pre_view(uni: Universe, s: State, prefix: str) -> View:
    counts: dict[str, Count] = {}
    for kind in COUNT_KINDS:
        fn = z3.Function(f"{prefix}n_{kind}", uni.sorts["page"], z3.IntSort())
        counts[kind] = _count_fn(fn)
    return View(uni, s, as_fields(uni, s), counts)


def post_view(pre: View, post: State) -> View:
    """The post-state, its counts defined from the pre-state's by the stored positions."""
    fields = as_fields(pre.uni, post)
    changes: dict[str, Any] = dict(fields)
    v = View(pre.uni, replace(post, **changes), fields, {})
    for kind, names in COUNT_KINDS.items():
        keys: list[Key] = []
        for name in names:
            fch = fields[name]
            if fch.base is not pre.f[name].base or fch.changed is None:
                raise NotInFragment(f"{name} changed at positions that are not listed")
            keys.extend(fch.changed)
        v.counts[kind] = _delta_count(pre, v, kind, keys)
    return v


def _delta_count(pre: View, post: View, kind: str, keys: list[Key]) -> Count:
    def n(p: Any) -> Any:
        total = pre.counts[kind](p)
        for i, k in enumerate(keys):
            first = z3.And(k.valid, *(z3.Not(z3.And(keys[j].valid, *(
                a == b if not (isinstance(a, int) and isinstance(b, int)) else z3.BoolVal(a == b)
                for a, b in zip(k.parts, keys[j].parts, strict=True)))) for j in range(i)))
            gained = z3.If(refs(post, kind, k.parts, p), 1, 0)
            lost = z3.If(refs(pre, kind, k.parts, p), 1, 0)
            total = total + z3.If(first, gained - lost, 0)
        return total
    return n


def count_facts(v: View) -> list[Any]:
    """What every finite structure satisfies: counts are >= 0, >= 1 with a reference."""
    uni = v.uni
    p = z3.Const("cp", uni.sorts["page"])
    s = z3.Const("cs", uni.sorts["seq"])
    o = z3.Int("co")
    facts = []
    for kind in COUNT_KINDS:
        facts.append(z3.ForAll([p], v.counts[kind](p) >= 0))
        keys = pocket_keys(uni, s) if kind == "pocket" else entry_keys(uni, s, o)
        bound = [s, p] if kind == "pocket" else [s, o, p]
        for ix in keys:
            facts.append(z3.ForAll(bound, z3.Implies(refs(v, kind, ix, p),
                                                     v.counts[kind](p) >= 1)))
    return facts


def init_view(uni: Universe, lay: Layout) -> View:
    s = uniform_state(uni, lay)
    zero: Count = lambda p: z3.IntVal(0)  # noqa: E731
    return View(uni, s, as_fields(uni, s), {k: zero for k in COUNT_KINDS})


# ---- the invariants --------------------------------------------------------------------

@dataclass(frozen=True)
class PInvariant:
    name: str  # the model invariant it states (INVARIANTS_BY_NAME), or a lemma of its own
    build: Callable[[View], Any]
    safety: bool = False  # one of the pocket-safety invariants
    exact: bool = True  # agrees with the model's definition on every concrete state


def _vars(uni: Universe) -> tuple[Any, Any, Any, Any, Any]:
    pg = uni.sorts["page"]
    return (z3.Const("p", pg), z3.Const("q", pg), z3.Const("x", uni.sorts["slot"]),
            z3.Const("s", uni.sorts["seq"]), z3.Int("o"))


def _ops(v: View) -> tuple[EprOps, EprLayout]:
    return EprOps(v.uni), EprLayout(v.uni.cfg, v.uni)


def _pg(v: View, p: Any) -> Any:
    ops, lay = _ops(v)
    return pool_group(ops, lay, v.lc(p))


def _in_range(t: Any, n: int) -> Any:
    return z3.And(t >= 0, t < n)


def inv_values(v: View) -> Any:
    """The part of values_in_range the proof needs (a lemma: the model's also bounds ids)."""
    uni = v.uni
    p, _, x, s, o = _vars(uni)
    nil = uni.nil
    page = z3.ForAll([p], z3.And(
        v.locks(p) >= 0, v.holds(p) >= 0,
        z3.Implies(v.alive(p), z3.And(
            _in_range(v.lc(p), uni.lcs), _in_range(v.level(p), uni.levels),
            v.ordinal(p) >= 0,
            z3.Implies(v.slot(p) != nil["slot"], uni.slot_exists(v.level(p), v.slot(p))),
            (v.dst_level(p) == -1) == (v.dst_slot(p) == nil["slot"]),
            z3.Implies(v.dst_level(p) != -1, z3.And(
                _in_range(v.dst_level(p), uni.levels),
                uni.slot_exists(v.dst_level(p), v.dst_slot(p)))),
            z3.Implies(z3.Not(v.committed(p)), uni.is_seq(v.owner(p))))),
    ))
    slots = [z3.ForAll([x], z3.Implies(v.slot_owner(lv, g, x) != nil["page"],
                                       z3.And(x != nil["slot"], uni.slot_exists(lv, x))))
             for lv in range(uni.levels) for g in range(uni.groups)]
    entries = [z3.ForAll([s, o], z3.Implies(v.entry(*ix) != nil["page"], _entry_valid(uni, ix)))
               for ix in entry_keys(uni, s, o)]
    pockets = [z3.ForAll([s], z3.Implies(v.pocket(*ix) != nil["page"], _pocket_valid(uni, ix)))
               for ix in pocket_keys(uni, s)]
    return z3.And(page, *slots, *entries, *pockets)


def _as_z3(t: Any) -> Any:
    return t if z3.is_expr(t) else z3.BoolVal(bool(t))


def inv_slot_owned_once(v: View) -> Any:
    uni = v.uni
    p, q, x, _, _ = _vars(uni)
    nil = uni.nil
    own = z3.ForAll([p], z3.Implies(
        z3.And(v.alive(p), v.slot(p) != nil["slot"]),
        z3.And(_in_range(v.level(p), uni.levels), uni.slot_exists(v.level(p), v.slot(p)),
               _owner_at(v, v.level(p), _pg(v, p), v.slot(p)) == p)))
    owned = []
    for lv in range(uni.levels):
        for g in range(uni.groups):
            o = v.slot_owner(lv, g, x)
            owned.append(z3.ForAll([x, q], z3.Implies(z3.And(o == q, q != nil["page"]), z3.And(
                v.alive(q), _pg(v, q) == g,
                z3.Or(z3.And(v.level(q) == lv, v.slot(q) == x),
                      z3.And(v.dst_level(q) == lv, v.dst_slot(q) == x))))))
    return z3.And(own, *owned)


def _owner_at(v: View, level: Any, g: Any, x: Any) -> Any:
    uni = v.uni
    result = uni.nil["page"]
    for lv in range(uni.levels):
        for gg in range(uni.groups):
            result = z3.If(z3.And(level == lv, g == gg), v.slot_owner(lv, gg, x), result)
    return result


def inv_entries_live(v: View) -> Any:
    uni = v.uni
    p, _, _, s, o = _vars(uni)
    conds = []
    for ix in entry_keys(uni, s, o):
        page = v.entry(*ix)
        conds.append(z3.ForAll([s, o, p], z3.Implies(z3.And(page == p, p != uni.nil["page"]), z3.And(
            v.alive(p), v.lc(p) == ix[1], v.ordinal(p) == o,
            z3.Or(v.committed(p), v.owner(p) == s)))))
        conds.append(z3.ForAll([s, o], z3.Implies(v.entry_locked(*ix), page != uni.nil["page"])))
    return z3.And(*conds)


def _own_entry(v: View, p: Any) -> tuple[Any, Any]:
    """(p's owner's block entry for it names p, that entry is a lock)."""
    uni = v.uni
    named = uni.nil["page"] != uni.nil["page"]
    locked = named
    for lc in range(uni.lcs):
        ix = (v.owner(p), lc, v.ordinal(p))
        here = z3.And(v.lc(p) == lc, v.entry(*ix) == p)
        named = z3.Or(named, here)
        locked = z3.Or(locked, z3.And(here, v.entry_locked(*ix)))
    return named, locked


def inv_refcounts(v: View) -> Any:
    p = _vars(v.uni)[0]
    c = v.counts
    exact = z3.ForAll([p], z3.And(
        v.locks(p) == c["lock"](p), v.holds(p) == c["hold"](p) + c["pocket"](p)))
    named, locked = _own_entry(v, p)
    parked = z3.Sum(*[z3.If(v.pocket(v.owner(p), lc, k) == p, 1, 0)
                      for lc in range(v.uni.lcs) for k in range(v.uni.cap)])
    uncommitted = z3.ForAll([p], z3.Implies(z3.And(v.alive(p), z3.Not(v.committed(p))), z3.And(
        v.locks(p) == z3.If(locked, 1, 0),
        v.holds(p) == z3.If(z3.And(named, z3.Not(locked)), 1, 0) + parked)))
    return z3.And(exact, uncommitted)


def inv_pocket_orphaned(v: View) -> Any:
    uni = v.uni
    p, _, _, s, o = _vars(uni)
    ops, _ = _ops(v)
    conds = []
    for ix in pocket_keys(uni, s):
        page = v.pocket(*ix)
        t = z3.Const("t", uni.sorts["seq"])
        unreferenced = z3.ForAll([t, o], z3.And(*[
            z3.Implies(_entry_valid(uni, e), v.entry(*e) != p) for e in entry_keys(uni, t, o)]))
        conds.append(z3.ForAll([s, p], z3.Implies(z3.And(page == p, p != uni.nil["page"]), z3.And(
            v.alive(p), z3.Not(v.committed(p)), status(ops, v.s, p) == 1,
            v.owner(p) == s, v.lc(p) == ix[1], unreferenced))))
    return z3.And(*conds)


def inv_two_pockets(v: View) -> Any:
    uni = v.uni
    s = _vars(uni)[3]
    t = z3.Const("t", uni.sorts["seq"])
    conds = []
    for a in pocket_keys(uni, s):
        for b in pocket_keys(uni, t):
            same = s == t if a[1:] == b[1:] else z3.BoolVal(False)
            conds.append(z3.Implies(z3.And(v.pocket(*a) != uni.nil["page"],
                                           v.pocket(*a) == v.pocket(*b)), same))
    return z3.ForAll([s, t], z3.And(*conds))


# ---- derived from the model's definitions -----------------------------------------------
# The model's one-page statements (`invariants.ForEachPage`) are quantified over the page
# sort, its one-sequence statements (`invariants.ForEachSeq`) over the sequence sort; the
# definitions that read only the ghost flags are read as they are. The rest are restated
# above, each for a reason in `RESTATED`.


def for_every_page(name: str) -> Callable[[View], Any]:
    """The model's statement of one page record, for every element of the page sort."""
    form = INVARIANTS_BY_NAME[name].per_page
    if form is None:
        raise ValueError(f"{name} is not written for one page (invariants.ForEachPage)")

    def build(v: View) -> Any:
        p = _vars(v.uni)[0]
        ops, lay = _ops(v)
        return z3.ForAll([p], _as_z3(form.at(ops, lay, v.s, p)))
    return build


def for_every_seq(name: str) -> Callable[[View], Any]:
    """The model's statement of one sequence, for every element of the sequence sort."""
    form = INVARIANTS_BY_NAME[name].per_seq
    if form is None:
        raise ValueError(f"{name} is not written for one sequence (invariants.ForEachSeq)")

    def build(v: View) -> Any:
        q = _vars(v.uni)[3]
        ops, lay = _ops(v)
        return z3.ForAll([q], _as_z3(form.at(ops, lay, v.s, q)))
    return build


def as_defined(name: str) -> Callable[[View], Any]:
    """The model's definition read by the parametric interpretation as it is (it loops
    over nothing, or over an array with `ops.all_over`/`ops.any_over`)."""
    inv = INVARIANTS_BY_NAME[name]

    def build(v: View) -> Any:
        ops, lay = _ops(v)
        term = _as_z3(inv.predicate(ops, lay, v.s))
        if iteration_vars(term):
            raise NotInFragment(f"{name}: a loop not written with all_over/any_over")
        return term
    return build


def inv_dead_blank(v: View) -> Any:
    # The parametric sorts have a nil page where the model has none (a lookup at NONE reads
    # the default): that it is a dead record is a lemma of this engine alone.
    return z3.And(z3.Not(v.alive(v.uni.nil["page"])), for_every_page("dead_pages_are_blank")(v))


PARAMETRIC_INVARIANTS: tuple[PInvariant, ...] = (
    PInvariant("popped_slots_valid", as_defined("popped_slots_valid"), safety=True),
    PInvariant("no_unsynced_reuse", as_defined("no_unsynced_reuse"), safety=True),
    PInvariant("pocket_entries_orphaned", inv_pocket_orphaned, safety=True),
    PInvariant("committed_never_parked", as_defined("committed_never_parked"), safety=True),
    PInvariant("pocket_packed_and_bounded", for_every_seq("pocket_packed_and_bounded"),
               safety=True),
    PInvariant("inactive_pockets_empty", for_every_seq("inactive_pockets_empty"), safety=True),
    PInvariant("slot_owned_once", inv_slot_owned_once, safety=True),
    PInvariant("pinned_pockets_stay", as_defined("pinned_pockets_stay"), safety=True),
    PInvariant("locked_at_gpu", for_every_page("locked_at_gpu")),
    PInvariant("queued_are_evictable", for_every_page("queued_are_evictable")),
    PInvariant("dead_pages_are_blank", inv_dead_blank),
    PInvariant("live_pages_have_slots", for_every_page("live_pages_have_slots")),
    PInvariant("migrations_reserved", for_every_page("migrations_reserved")),
    PInvariant("entries_are_live", inv_entries_live),
    PInvariant("no_page_in_two_pockets", inv_two_pockets),
    PInvariant("refcounts_match", inv_refcounts, exact=False),
    PInvariant("dropped_pockets_stay_at_gpu", as_defined("dropped_pockets_stay_at_gpu")),
    PInvariant("values_in_range", inv_values, exact=False),
)

# Why each invariant above that is not derived is restated with quantifiers (its agreement
# with the model's definition is checked by `tests/proofs/test_parametric.py`).
RESTATED: dict[str, str] = {
    "slot_owned_once": "loops over every page record and every slot (flat index) of each "
                       "level: the slot table is a function per (level, pool group) here",
    "entries_are_live": "loops over sequences, life cycles and ordinals with range(): an "
                        "ordinal is an unbounded integer here",
    "pocket_entries_orphaned": "loops over every pocket position and asks that no block "
                               "entry names the page: a quantifier over sequences and "
                               "ordinals here",
    "no_page_in_two_pockets": "compares every pair of flat pocket positions: two sequence "
                              "variables here",
    "refcounts_match": "a count of references is a cardinality, outside first-order logic: "
                       "stated with count terms and the uncommitted pages' exact counts (a "
                       "lemma, not the definition)",
    "values_in_range": "bounds ids by the array sizes, which are unbounded here: only the "
                       "part the proof needs (a lemma, not the definition)",
}


# ---- obligations -----------------------------------------------------------------------

@dataclass
class PCti:
    """A counterexample to induction over the unbounded sorts, as the model Z3 found."""

    action: str
    broken: list[str]
    text: str


@dataclass
class ParamOutcome:
    obligation: str
    status: str
    seconds: float
    instances: int = 0
    queries: int = 0  # (instance, invariant) pairs sent to Z3
    skipped: int = 0  # pairs where the invariant's term is unchanged by the action
    abstracted: list[str] = field(default_factory=list)
    havocs: list[str] = field(default_factory=list)
    cti: PCti | None = None
    detail: str = ""


def _solver(rlimit: int) -> Any:
    return limited(z3.Solver(), rlimit)


def check_init(cfg: KVConfig, rlimit: int = DEFAULT_RLIMIT) -> ParamOutcome:
    t0 = time.perf_counter()
    uni = Universe(cfg)
    v = init_view(uni, Layout(cfg))
    solver = _solver(rlimit)
    solver.add(*uni.axioms())
    solver.add(z3.Not(z3.And(*[i.build(v) for i in PARAMETRIC_INVARIANTS])))
    r = solver.check()
    status_ = PROVED if r == z3.unsat else VIOLATED if r == z3.sat else UNKNOWN
    return ParamOutcome("init", status_, time.perf_counter() - t0,
                        detail="" if r != z3.unknown else solver.reason_unknown())


def check_action(cfg: KVConfig, action: str, rlimit: int = DEFAULT_RLIMIT
                 ) -> ParamOutcome:
    """Inv and the action's guard imply Inv after its effect, for every size."""
    t0 = time.perf_counter()
    uni = Universe(cfg)
    pre = symbolic_state(uni, "")
    v = pre_view(uni, pre, "")
    pre_terms = {i.name: i.build(v) for i in PARAMETRIC_INVARIANTS}
    base = [*uni.axioms(), *count_facts(v), *pre_terms.values()]
    out = ParamOutcome(f"consecution:{action}", PROVED, 0.0)
    for inst in instances(uni, PAGE_ACTIONS[action]):
        d = derive(uni, inst, pre)
        out.instances += 1
        out.abstracted += [a for a in d.abstracted if a not in out.abstracted]
        out.havocs += [h for h in d.havocs if h not in out.havocs]
        post = post_view(v, _scalars(uni, d.post))
        step = [*inst.constraints, *(g for _, g in d.guard), *count_facts(post)]
        # One fresh query per invariant: small non-incremental quantified queries are
        # where Z3's model-based instantiation is fast (incremental mode is not).
        for inv in PARAMETRIC_INVARIANTS:
            goal = inv.build(post)
            if goal.eq(pre_terms[inv.name]):
                out.skipped += 1  # the action changes nothing the invariant reads
                continue
            out.queries += 1
            query = [*base, *step, z3.Not(goal)]
            solver = _solver(min(rlimit, FIRST_TRY_RLIMIT))
            solver.add(*query)
            r = solver.check()
            if r == z3.unsat:
                continue
            # Sat, or no answer yet: look for a small finite model (a counterexample to
            # induction, and the readable one), then give the unbounded query its time.
            model = small_model(uni, query, rlimit)
            if model is None and r == z3.unknown:
                solver = _solver(rlimit)
                solver.add(*query)
                r = solver.check()
                if r == z3.unsat:
                    continue
            if model is None and r == z3.sat:
                model = solver.model()
            if model is not None:
                text = render_cti(uni, model, inst, d.guard, v, post, [inv.name])
                out.status, out.cti = VIOLATED, PCti(inst.label(), [inv.name], text)
                break
            if out.status == PROVED:
                out.status = UNKNOWN
                out.detail = f"{inst.label()} / {inv.name}: {solver.reason_unknown()}"
        if out.cti is not None:
            break
    out.seconds = time.perf_counter() - t0
    return out


SMALL_SIZES = (1, 2, 3, 4)  # real elements per sort tried for a readable counterexample


def small_model(uni: Universe, query: list[Any], rlimit: int) -> Any:
    """A model of the query with at most n elements per sort besides the distinguished
    ones (domain-closure axioms), for the smallest n that has one; None if none."""
    for n in SMALL_SIZES:
        solver = _solver(rlimit)
        solver.add(*query)
        for kind, srt in uni.sorts.items():
            elems = [z3.Const(f"elem_{kind}{i}", srt) for i in range(n)]
            x = z3.Const(f"any_{kind}", srt)
            named = [uni.nil[kind], *( [uni.copy] if kind == "seq" else []), *elems]
            solver.add(z3.ForAll([x], z3.Or(*[x == e for e in named])))
        if solver.check() == z3.sat:
            return solver.model()
    return None


def _scalars(uni: Universe, s: State) -> State:
    changes: dict[str, Any] = {}
    for name, kind in SCALARS.items():
        x = getattr(s, name)
        if not z3.is_expr(x):
            changes[name] = z3.BoolVal(bool(x)) if kind == "bool" else z3.IntVal(int(x))
    return replace(s, **changes) if changes else s


def prove_parametric(cfg: KVConfig, actions: Iterable[str] | None = None,
                     rlimit: int = DEFAULT_RLIMIT) -> list[ParamOutcome]:
    """Init and consecution of every action, for the configuration's shape at every size."""
    names = list(actions) if actions is not None else list(PAGE_ACTIONS)
    return [check_init(cfg, rlimit), *(check_action(cfg, a, rlimit) for a in names)]


# ---- counterexamples --------------------------------------------------------------------

def render_cti(uni: Universe, model: Any, inst: ActionInstance, guard: list[tuple[str, Any]],
               pre: View, post: View, broken: list[str]) -> str:
    """The pre-state's pages, slots, blocks and pockets in Z3's (finite) model, and the step."""
    def ev(t: Any) -> Any:
        return model.eval(t, model_completion=True)

    pages = model.get_universe(uni.sorts["page"]) or []
    seqs = model.get_universe(uni.sorts["seq"]) or []
    slots = model.get_universe(uni.sorts["slot"]) or []
    names: dict[str, str] = {}

    def nm(t: Any, kind: str) -> str:
        val = ev(t)
        if val.eq(ev(uni.nil[kind])):
            return "-"
        if kind == "seq" and val.eq(ev(uni.copy)):
            return "copy"
        key = f"{kind}:{val}"
        if key not in names:
            letter = {"page": "p", "slot": "x", "seq": "s"}[kind]
            names[key] = f"{letter}{sum(k.startswith(kind) for k in names)}"
        return names[key]

    params = ", ".join(f"{k}={nm(v, uni.kind_of(v)) if uni.kind_of(v) in uni.sorts else ev(v)}"
                       if z3.is_expr(v) else f"{k}={v}" for k, v in inst.params.items())
    lines = [f"counterexample to induction: {inst.action}({params}) breaks {', '.join(broken)}",
             f"  (an instance with {len(pages) - 1} page(s), {len(slots) - 1} slot id(s) and "
             f"{len(seqs) - 2} sequence(s) besides nil and the copy stream; it is one for "
             "every larger size too)"]

    def page_line(v: View, p: Any) -> str:
        if not z3.is_true(ev(v.alive(p))):
            return f"page {nm(p, 'page')}: dead"
        bits = [f"lc={ev(v.lc(p))}", f"level={ev(v.level(p))}", f"slot={nm(v.slot(p), 'slot')}",
                f"locks={ev(v.locks(p))}", f"holds={ev(v.holds(p))}",
                f"owner={nm(v.owner(p), 'seq')}", f"ordinal={ev(v.ordinal(p))}"]
        bits += [name for name in ("committed", "queued") if z3.is_true(ev(getattr(v, name)(p)))]
        if not ev(v.dst_level(p)).eq(z3.IntVal(-1)):
            bits.append(f"migrating to level {ev(v.dst_level(p))} slot "
                        f"{nm(v.dst_slot(p), 'slot')}")
        return f"page {nm(p, 'page')}: " + " ".join(bits)

    for label, v in (("before", pre), ("after", post)):
        lines.append(f"  {label}:")
        for p in pages:
            if p.eq(ev(uni.nil["page"])):
                continue
            line = page_line(v, p)
            if not line.endswith("dead"):
                lines.append("    " + line)
        for lv in range(uni.levels):
            for g in range(uni.groups):
                for x in slots:
                    if x.eq(ev(uni.nil["slot"])):
                        continue
                    own, busy = v.slot_owner(lv, g, x), v.slot_busy(lv, g, x)
                    if nm(own, "page") == "-" and nm(busy, "seq") == "-":
                        continue
                    lines.append(f"    slot (level {lv}, group {g}, {nm(x, 'slot')}): owner "
                                 f"{nm(own, 'page')}, busy {nm(busy, 'seq')}")
        for s in seqs:
            if not z3.is_true(ev(uni.is_seq(s))):
                continue
            st = ev(v.seq_status(s)).as_long()
            pocket = {(lc, k): nm(v.pocket(s, lc, k), "page") for lc in range(uni.lcs)
                      for k in range(uni.cap)}
            shown = [f"lc{lc}[{k}]={x}" for (lc, k), x in pocket.items() if x != "-"]
            lines.append(f"    seq {nm(s, 'seq')}: {SeqStatus(st).name if 0 <= st < 4 else st}"
                         + (" pocket " + " ".join(shown) if shown else ""))
    lines.append(f"  guard: {'; '.join(label for label, _ in guard)}")
    return "\n".join(lines)


# ---- `kvpocket prove --parametric` ------------------------------------------------------

def shape_key(cfg: KVConfig) -> tuple[object, ...]:
    """What a parametric proof depends on: everything but the sizes."""
    return (cfg.num_levels, cfg.life_cycles, cfg.tokens_per_block, cfg.pocket)


def _prove_cell(job: tuple[str, KVConfig]) -> tuple[str, list[ParamOutcome]]:
    label, cfg = job
    return label, prove_parametric(cfg)


def run_parametric(configs: list[tuple[str, KVConfig]], json_path: str | None = None,
                   workers: int = 1) -> int:
    """Prove each (configuration shape, policy) cell for every size and print the
    obligations; 0 if all are proved, 1 otherwise (a counterexample, or no answer)."""
    t0 = time.perf_counter()
    seen: dict[tuple[object, ...], str] = {}
    jobs: list[tuple[str, KVConfig]] = []
    for label, cfg in configs:
        key = shape_key(cfg)
        if key in seen:
            print(f"{label}: same shape as {seen[key]} (only sizes differ): covered by it")
            continue
        seen[key] = label
        jobs.append((label, cfg))
    if workers > 1 and len(jobs) > 1:
        # Ctrl-C is the parent's, and a worker ends itself if the parent dies (`interrupts`)
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)),
                                 initializer=quiet_worker) as pool:
            results = list(pool.map(_prove_cell, jobs))
    else:
        results = [_prove_cell(job) for job in jobs]
    rows: list[dict[str, object]] = []
    ctis: list[str] = []
    print(f"{'cell':28} {'obligation':30} {'status':8} {'queries':>7} {'seconds':>8}")
    for label, outcomes in results:
        for o in outcomes:
            print(f"{label:28} {o.obligation:30} {o.status:8} {o.queries:7d} {o.seconds:8.2f}")
            rows.append({"cell": label, "obligation": o.obligation, "status": o.status,
                         "seconds": round(o.seconds, 3), "instances": o.instances,
                         "queries": o.queries, "skipped": o.skipped,
                         "abstracted": o.abstracted, "havocs": o.havocs, "detail": o.detail,
                         "cti": o.cti.text if o.cti else None})
            if o.detail:
                print(f"  {o.detail}")
            if o.cti is not None:
                ctis.append(f"{label}:\n{o.cti.text}")
    abstracted = sorted({a for r in rows for a in r["abstracted"]})  # type: ignore[attr-defined]
    if abstracted:
        print("guard conditions over every record, read through a weaker condition "
              "(epr.ABSTRACTIONS): " + "; ".join(abstracted))
    for text in ctis:
        print(text)
    total = time.perf_counter() - t0
    counts = {s: sum(r["status"] == s for r in rows) for s in (PROVED, VIOLATED, UNKNOWN)}
    print(f"parametric: {len(jobs)} cell(s), every size; {counts[PROVED]} proved, "
          f"{counts[VIOLATED]} violated, {counts[UNKNOWN]} unknown; {total:.1f} s")
    if json_path:
        Path(json_path).write_text(json.dumps({"parametric": rows, "seconds": round(total, 3)},
                                              indent=2) + "\n")
    if counts[PROVED] == len(rows):
        return EXIT_OK
    return EXIT_FOUND if counts[VIOLATED] else EXIT_INCOMPLETE


# ---- the invariants on concrete states (agreement with the model's catalogue) ------------

def concrete_view(lay: Layout, s: State) -> View:
    """alpha(s) in a finite universe, with its true reference counts."""
    uni = finite_universe(lay)
    alpha = Alpha(uni, lay)
    st = alpha.state(s)
    counts: dict[str, Count] = {}
    for kind in COUNT_KINDS:
        table = [0] * lay.pages
        if kind == "pocket":
            for x in s.pocket:
                if x >= 0:
                    table[x] += 1
        else:
            for page, locked in zip(s.entry, s.entry_locked, strict=True):
                if page >= 0 and bool(locked) == (kind == "lock"):
                    table[page] += 1

        def n(p: Any, table: list[int] = table) -> Any:
            result: Any = z3.IntVal(0)
            for i, c in enumerate(table):
                result = z3.If(p == uni.elements["page"][i], c, result)
            return result

        counts[kind] = n
    return View(uni, st, as_fields(uni, st), counts)


def holds_concretely(lay: Layout, s: State, inv: PInvariant) -> bool:
    """Does the parametric statement hold in alpha(s)? (Z3 over the finite universe.)"""
    v = concrete_view(lay, s)
    solver = _solver(DEFAULT_RLIMIT)
    solver.add(z3.Not(inv.build(v)))
    r = solver.check()
    if r == z3.unknown:
        raise RuntimeError(f"{inv.name}: no answer on a finite instance")
    return bool(r == z3.unsat)
