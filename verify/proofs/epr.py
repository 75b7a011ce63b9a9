"""A third interpretation of the model vocabulary: states over unbounded sorts.

`model/logic.py: CONCRETE` runs the model on tuples, `z3ops.Z3OPS` encodes it for one
bounded configuration. `EprOps` + `EprLayout` read the very same action table
(`model/pages.py: PAGE_ACTIONS`) over a state whose arrays are functions on
uninterpreted sorts, so one Z3 query covers every number of pages, slots, sequences
and blocks:

* **Sorts.** Pages, slots and sequences (streams too) are uninterpreted sorts, each with
  a distinguished `nil` element for the model's -1 sentinels (NONE, NO_SLOT, IDLE, BAD);
  the copy stream is one more distinguished sequence element. Block ordinals, counts,
  keys, stamps and token lengths are mathematical integers, unbounded.
* **Enumerated dimensions.** Levels, pool groups, life cycles and pocket positions stay
  small integer constants of the configuration's *shape* (at most three levels; the
  life cycles and the pocket capacity are part of what a deployment configures, not
  of its size). The proof is per shape and for every size.
* **Arrays** become `Field`s: a function from index tuples to values; `store` builds
  the post-state function (an if-then-else over the pre-state one), `lookup` applies it
  under the index's validity (the `Layout` index functions return a `Key`: the index
  tuple and when it is in range, e.g. a slot exists at a level iff the rigid predicate
  `slot_exists(level, slot)` holds, so every choice of slot counts is covered).
* **Loops over an array** iterate a *generic element*: a bound variable per unbounded
  dimension. A loop written `ops.any_over`/`ops.all_over` is quantified there (exists /
  for all) over its own iteration's variables; `or_`/`and_` never quantify (a two-term
  junction in a loop's body is not told from the loop by its term count). A tuple built
  from the iteration (the comprehension in `complete`) is a new function; a loop written
  as a plain junction leaves its variable free and is refused.

What does not fit is abstracted soundly and reported:

* Loops over all page records or all blocks (`range(lay.pages)`, `range(lay.blocks)`:
  the LRU queue head, the commit key clash, `set_status`'s block scan) cannot be read
  over an unbounded sort. The layout records that a guard read them, the guard is
  evaluated twice (with no records, and with one havoc record) and every condition whose
  term changes must have an entry in `ABSTRACTIONS`: a weaker condition that the
  concrete one implies (a weaker guard allows more transitions: an over-approximation).
  Effects may not read them at all (checked).
* Any other operation outside the fragment (an order comparison on a sort, an integer
  that should be an element) yields a fresh unconstrained value: the concrete value is
  one of its values, so the transition relation only grows.

`tests/proofs/test_parametric.py` checks the over-approximation on sampled reachable
states: the abstraction of every concrete successor is a successor of the abstraction.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from kvpocket.model.config import GPU_LEVEL, CommitState, KVConfig, SeqStatus
from kvpocket.model.logic import CONCRETE, Array, Term
from kvpocket.model.pages import PAGE_ACTIONS, PageAction, Params, pocket_size_all
from kvpocket.model.state import SCHEMA, SCHEMA_BY_NAME, Layout, State
from kvpocket.verify.proofs.solver import limited

NIL = -1
# Resource units (`solver.py`) for one agreement query over a finite universe.
EPR_RLIMIT = 100_000_000
# Comparing an element with its sort's size is a membership test: `lay.seqs` is this.
SIZE = 1 << 62

Dim = str | int  # "page" | "slot" | "seq" | "ord" (an unbounded integer) | n (0..n-1)
SORT_KINDS = ("page", "slot", "seq")


class NotInFragment(Exception):
    """The action table uses something this interpretation cannot read soundly."""


# ---- the universe: sorts, distinguished elements, rigid symbols ---------------------------

@dataclass(frozen=True)
class FiniteSizes:
    """Element counts for a finite instance (the abstraction of one concrete state)."""

    pages: int
    seqs: int
    slots_per_level: tuple[int, ...]
    max_blocks: int
    max_capacity: int


class Universe:
    """Sorts and rigid symbols: uninterpreted (the proof) or finite (one concrete state)."""

    def __init__(self, cfg: KVConfig, finite: FiniteSizes | None = None) -> None:
        self.cfg = cfg
        self.finite = finite
        self.levels = cfg.num_levels
        self.groups = cfg.num_pool_groups
        self.lcs = cfg.num_life_cycles
        self.cap = cfg.pocket.capacity
        self.elements: dict[str, list[Any]] = {}
        if finite is None:
            self.sorts = {k: z3.DeclareSort(k.capitalize()) for k in SORT_KINDS}
            self.nil = {k: z3.Const(f"nil_{k}", s) for k, s in self.sorts.items()}
            self.copy = z3.Const("copy_stream", self.sorts["seq"])
            self._slot_exists = z3.Function("slot_exists", z3.IntSort(), self.sorts["slot"],
                                            z3.BoolSort())
            self.max_capacity: Any = z3.Int("max_capacity")
        else:
            sizes = {"page": finite.pages, "slot": max(finite.slots_per_level),
                     "seq": finite.seqs}
            self.sorts, self.nil = {}, {}
            for k in SORT_KINDS:
                n = next(_COUNTER)  # Z3 names enumeration sorts and values once per context
                names = [f"nil_{k}"] + [f"{k}{i}" for i in range(sizes[k])]
                names += ["copy_stream"] if k == "seq" else []
                srt, consts = z3.EnumSort(f"{k.capitalize()}{n}", [f"{x}#{n}" for x in names])
                self.sorts[k], self.nil[k] = srt, consts[0]
                self.elements[k] = list(consts[1 : 1 + sizes[k]])
                if k == "seq":
                    self.copy = consts[-1]
            self.max_capacity = z3.IntVal(finite.max_capacity)

    def axioms(self) -> list[Any]:
        if self.finite is not None:
            return []
        return [self.copy != self.nil["seq"], self.max_capacity >= 0]

    def slot_exists(self, level: Any, slot: Any) -> Any:
        if self.finite is None:
            return self._slot_exists(level, slot)
        opts = [z3.And(level == lv, slot == self.elements["slot"][i])
                for lv, n in enumerate(self.finite.slots_per_level) for i in range(n)]
        return z3.Or(*opts) if opts else z3.BoolVal(False)

    def numbered(self, kind: str, n: int) -> Any:
        """The element a literal record number denotes (a default like `lookup(..., 0)`):
        some fixed element, unknown in the proof; element n in a finite instance."""
        if self.finite is None:
            return z3.Const(f"{kind}#{n}", self.sorts[kind])
        elems = self.elements[kind]
        return elems[n] if n < len(elems) else self.nil[kind]

    def is_seq(self, x: Any) -> Any:
        """x is a sequence (not nil, not the copy stream)."""
        return z3.And(x != self.nil["seq"], x != self.copy)

    def sort_of(self, kind: str) -> Any:
        if kind in self.sorts:
            return self.sorts[kind]
        return z3.BoolSort() if kind == "bool" else z3.IntSort()

    def dim_sort(self, d: Dim) -> Any:
        return z3.IntSort() if isinstance(d, int) or d == "ord" else self.sorts[d]

    def nil_of(self, kind: str) -> Any:
        if kind in self.nil:
            return self.nil[kind]
        return z3.BoolVal(False) if kind == "bool" else z3.IntVal(NIL)

    def kind_of(self, t: Any) -> str:
        """The value kind of a Z3 term: a sort name, 'int' or 'bool'."""
        srt = t.sort()
        for k, s in self.sorts.items():
            if srt == s:
                return k
        return "bool" if srt == z3.BoolSort() else "int"

    def valid(self, d: Dim, x: Any) -> Any:
        """x is an index of dimension d."""
        if isinstance(d, int):
            if isinstance(x, int):
                return z3.BoolVal(0 <= x < d)
            return z3.And(x >= 0, x < d)
        if d == "ord":
            return z3.BoolVal(x >= 0) if isinstance(x, int) else x >= 0
        if d == "seq":
            return self.is_seq(x)
        return x != self.nil[d]


# ---- arrays as functions ------------------------------------------------------------------

@dataclass(frozen=True)
class Key:
    """An index tuple and the condition that it is in range (the model's -1 otherwise)."""

    parts: tuple[Any, ...]
    valid: Any


def _part_eq(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return z3.BoolVal(a == b)
    return a == b


def _as_bool(x: Any) -> Any:
    return z3.BoolVal(x) if isinstance(x, bool) else x


@dataclass
class Iteration:
    variables: tuple[Any, ...]
    combos: list[tuple[int, ...]]  # values of the enumerated dimensions, in iteration order
    dims: tuple[Dim, ...]


_ITERATIONS: dict[str, Iteration] = {}
_COUNTER = itertools.count()


class Field:
    """A state array as a function of its index tuple."""

    def __init__(self, name: str, dims: tuple[Dim, ...], kind: str,
                 get: Callable[[tuple[Any, ...]], Any], uni: Universe,
                 changed: tuple[Key, ...] | None = (), base: Field | None = None) -> None:
        self.name, self.dims, self.kind, self.get, self.uni = name, dims, kind, get, uni
        self.changed = changed  # keys where it may differ from `base` (None: anywhere)
        self.base = base if base is not None else self

    def __call__(self, *parts: Any) -> Any:
        return self.get(tuple(parts))

    def key(self, idx: Any) -> Key:
        if isinstance(idx, Key):
            return idx
        if len(self.dims) != 1:
            raise NotInFragment(f"{self.name}: a flat index into a {len(self.dims)}-d array")
        return Key((idx,), self.uni.valid(self.dims[0], idx))

    def store(self, key: Key, value: Any) -> Field:
        old = self.get

        def get(ix: tuple[Any, ...]) -> Any:
            hit = z3.And(key.valid, *(_part_eq(a, b) for a, b in zip(ix, key.parts, strict=True)))
            return z3.If(hit, value, old(ix))

        changed = None if self.changed is None else (*self.changed, key)
        return Field(self.name, self.dims, self.kind, get, self.uni, changed, self.base)

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, int):
            # A concrete record number: some element, unknown which (probe layouts only).
            return _fresh(self.uni, self.kind, f"{self.name}[{idx}]")
        return self.get(self.key(idx).parts)

    def __iter__(self) -> Iterator[Any]:
        yield from self.iteration()[1]

    def iteration(self) -> tuple[Iteration, list[Any]]:
        """Fresh iteration variables for the unbounded dimensions and one element term per
        combination of the enumerated ones."""
        n = next(_COUNTER)
        unb = [(i, d) for i, d in enumerate(self.dims) if not isinstance(d, int)]
        variables = tuple(z3.Const(f"it{n}_{self.name}_{i}", self.uni.dim_sort(d)) for i, d in unb)
        enum = [range(d) if isinstance(d, int) else range(1) for d in self.dims]
        combos = list(itertools.product(*enum))
        it = Iteration(variables, combos, self.dims)
        for v in variables:
            _ITERATIONS[str(v)] = it
        elems = []
        for combo in combos:
            parts: list[Any] = list(combo)
            for (i, _), v in zip(unb, variables, strict=True):
                parts[i] = v
            valid = z3.And(*(self.uni.valid(d, v) for (_, d), v in zip(unb, variables, strict=True)))
            # Outside the valid indices an array element is its default: nil.
            elems.append(z3.If(valid, self.get(tuple(parts)), self.uni.nil_of(self.kind)))
        return it, elems

    def __len__(self) -> int:
        raise NotInFragment(f"len() of the unbounded array {self.name}")


def _fresh(uni: Universe, kind: str, why: str) -> Any:
    return z3.Const(f"havoc{next(_COUNTER)}!{why}", uni.sort_of(kind))


def iteration_vars(t: Any) -> set[str]:
    """Names of generic-iteration variables occurring in a term."""
    if not z3.is_expr(t):
        return set()
    out: set[str] = set()
    seen: set[int] = set()
    todo = [t]
    while todo:
        x = todo.pop()
        if x.get_id() in seen:
            continue
        seen.add(x.get_id())
        if z3.is_const(x) and str(x) in _ITERATIONS:
            out.add(str(x))
        todo.extend(x.children())
    return out


def comprehension(uni: Universe, name: str, dims: tuple[Dim, ...], kind: str,
                  elems: Sequence[Any]) -> Field:
    """A tuple built by iterating an array (one term per enumerated combination)."""
    names = set().union(*(iteration_vars(e) for e in elems))
    its = {id(_ITERATIONS[n]): _ITERATIONS[n] for n in names}
    if len(its) != 1:
        raise NotInFragment(f"{name}: a tuple that is not one comprehension over an array")
    it = next(iter(its.values()))
    if it.dims != dims or len(elems) != len(it.combos):
        raise NotInFragment(f"{name}: a comprehension over a different array shape")
    unb = [i for i, d in enumerate(dims) if not isinstance(d, int)]

    def get(ix: tuple[Any, ...]) -> Any:
        result = uni.nil_of(kind)
        for combo, elem in zip(it.combos, elems, strict=True):
            body = z3.substitute(elem, *zip(it.variables, [ix[i] for i in unb], strict=True))
            hit = z3.And(*(_part_eq(ix[i], combo[i]) for i, d in enumerate(dims)
                           if isinstance(d, int)))
            result = z3.If(hit, body, result)
        return result

    return Field(name, dims, kind, get, uni, None)


# ---- the vocabulary -------------------------------------------------------------------

class EprOps:
    """The `Ops` vocabulary over `Field`s, `Key`s and Z3 terms of the universe's sorts."""

    symbolic = True

    def __init__(self, uni: Universe) -> None:
        self.uni = uni
        self.havocs: list[str] = []

    def _havoc(self, kind: str, why: str) -> Any:
        self.havocs.append(why)
        return _fresh(self.uni, kind, why)

    def _coerce(self, x: Any, kind: str) -> Any:
        """A Python literal as a term of the given kind."""
        if z3.is_expr(x):
            return x
        if kind == "bool":
            return z3.BoolVal(bool(x))
        if kind == "int":
            return z3.IntVal(int(x))
        if x == NIL:
            return self.uni.nil[kind]
        return self.uni.numbered(kind, int(x))

    def _pair(self, a: Any, b: Any) -> tuple[Any, Any]:
        if z3.is_expr(a):
            return a, self._coerce(b, self.uni.kind_of(a))
        if z3.is_expr(b):
            return self._coerce(a, self.uni.kind_of(b)), b
        return a, b

    def const(self, value: int | bool) -> Term:
        return value

    def _junction(self, xs: tuple[Term, ...], conj: bool) -> Term:
        terms = []
        for x in xs:
            if isinstance(x, bool | int) and not z3.is_expr(x):
                if bool(x) != conj:
                    return not conj
                continue
            terms.append(x)
        if not terms:
            return conj
        return z3.And(*terms) if conj else z3.Or(*terms)

    def _over(self, arr: Array, body: Callable[[Term], Term], conj: bool) -> Term:
        """A loop over an array: over a `Field`, quantified over exactly the variables of
        its own iteration (a junction inside the body stays a junction)."""
        if not isinstance(arr, Field):
            return self._junction(tuple(body(x) for x in arr), conj)
        it, elems = arr.iteration()
        expansion = self._junction(tuple(body(x) for x in elems), conj)
        bound = [v for v in it.variables if str(v) in iteration_vars(expansion)]
        if not bound:
            return expansion
        return z3.ForAll(bound, expansion) if conj else z3.Exists(bound, expansion)

    def all_over(self, arr: Array, body: Callable[[Term], Term]) -> Term:
        return self._over(arr, body, True)

    def any_over(self, arr: Array, body: Callable[[Term], Term]) -> Term:
        return self._over(arr, body, False)

    def and_(self, *xs: Term) -> Term:
        return self._junction(xs, True)

    def or_(self, *xs: Term) -> Term:
        return self._junction(xs, False)

    def not_(self, x: Term) -> Term:
        return (not x) if not z3.is_expr(x) else z3.Not(x)

    def implies(self, a: Term, b: Term) -> Term:
        return self.or_(self.not_(a), b)

    def ite(self, c: Term, a: Term, b: Term) -> Term:
        if not z3.is_expr(c):
            return a if c else b
        a, b = self._pair(a, b)
        if not z3.is_expr(a):
            a, b = z3.IntVal(a) if not isinstance(a, bool) else z3.BoolVal(a), b
            a, b = self._pair(a, b)
        return z3.If(c, a, b)

    def eq(self, a: Term, b: Term) -> Term:
        if isinstance(a, Key) or isinstance(b, Key):
            key, other = (a, b) if isinstance(a, Key) else (b, a)
            if isinstance(other, int) and other == NIL:
                return z3.Not(key.valid)
            raise NotInFragment("an index compared with something other than -1")
        a, b = self._pair(a, b)
        if not z3.is_expr(a):
            return bool(a == b)
        return a == b

    def ne(self, a: Term, b: Term) -> Term:
        return self.not_(self.eq(a, b))

    def _order(self, a: Term, b: Term, strict: bool) -> Term:
        kinds = {self.uni.kind_of(x) for x in (a, b) if z3.is_expr(x)}
        if not kinds:
            return bool(a < b) if strict else bool(a <= b)
        if kinds <= {"int"}:
            return a < b if strict else a <= b
        # An element against 0 or against its sort's size: membership of the sort.
        if len(kinds) == 1:
            kind = next(iter(kinds))
            if not strict and isinstance(a, int) and a == 0 and z3.is_expr(b):
                return b != self.uni.nil[kind]
            if strict and isinstance(b, int) and b == SIZE and z3.is_expr(a):
                return self.uni.is_seq(a) if kind == "seq" else a != self.uni.nil[kind]
        return self._havoc("bool", "an order comparison on an uninterpreted sort")

    def lt(self, a: Term, b: Term) -> Term:
        return self._order(a, b, True)

    def le(self, a: Term, b: Term) -> Term:
        return self._order(a, b, False)

    def _arith(self, a: Term, b: Term, f: Callable[[Any, Any], Any]) -> Term:
        for x in (a, b):
            if z3.is_expr(x) and self.uni.kind_of(x) != "int":
                return self._havoc("int", "arithmetic on an uninterpreted sort")
        return f(a, b)

    def add(self, a: Term, b: Term) -> Term:
        return self._arith(a, b, lambda x, y: x + y)

    def sub(self, a: Term, b: Term) -> Term:
        return self._arith(a, b, lambda x, y: x - y)

    def scale(self, a: Term, k: int) -> Term:
        return self._arith(a, k, lambda x, y: x * y)

    def lookup(self, arr: Sequence[Term], idx: Term, default: Term = -1) -> Term:
        if isinstance(arr, Field):
            key = arr.key(idx)
            return z3.If(key.valid, arr.get(key.parts), self._coerce(default, arr.kind))
        # A table of the configuration (pool group or priority of a life cycle, ...).
        if not z3.is_expr(idx):
            return arr[idx] if 0 <= idx < len(arr) else default
        result = default
        for i in reversed(range(len(arr))):
            result = self.ite(idx == i, arr[i], result)
        return result

    def store(self, arr: Array, idx: Term, value: Term) -> Array:
        if not isinstance(arr, Field):
            raise NotInFragment("store into a plain tuple")
        out: Any = arr.store(arr.key(idx), self._coerce(value, arr.kind))
        return out  # type: ignore[no-any-return]

    def count(self, conds: Sequence[Term]) -> Term:
        terms = [c for c in conds if z3.is_expr(c)]
        base = sum(1 for c in conds if not z3.is_expr(c) and c)
        if any(iteration_vars(t) for t in terms):
            return self._havoc("int", "a count over an unbounded array")
        return z3.Sum(z3.IntVal(base), *(z3.If(t, 1, 0) for t in terms)) if terms else base


# ---- the layout ------------------------------------------------------------------------

class _ParamCfg:
    """The configuration with its size-dependent bound (max capacity) symbolic."""

    def __init__(self, cfg: KVConfig, uni: Universe) -> None:
        self._cfg = cfg
        self.max_capacity = uni.max_capacity

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cfg, name)


class EprLayout(Layout):
    """`Layout` whose index functions return `Key`s over the universe's sorts.

    `records` is the number of page records and blocks loops see: 0 (none; the proof) or
    1 (one havoc record: the probe that finds the conditions that read every record).
    """

    uni: Universe
    records: int
    read_records: list[str]

    def __init__(self, cfg: KVConfig, uni: Universe, records: int = 0) -> None:
        super().__init__(cfg)
        object.__setattr__(self, "uni", uni)
        object.__setattr__(self, "records", records)
        object.__setattr__(self, "read_records", [])
        object.__setattr__(self, "copy_stream", uni.copy)
        object.__setattr__(self, "seqs", SIZE)
        object.__setattr__(self, "cfg", _ParamCfg(cfg, uni))

    def __getattribute__(self, name: str) -> Any:
        if name in ("pages", "blocks"):
            object.__getattribute__(self, "read_records").append(name)
            return object.__getattribute__(self, "records")
        return object.__getattribute__(self, name)

    def slot_ix(self, ops: Any, level: Term, pg: Term, slot: Term) -> Term:
        uni = self.uni
        slot = ops._coerce(slot, "slot")
        valid = z3.And(uni.valid(uni.levels, level), uni.valid(uni.groups, pg),
                       slot != uni.nil["slot"], uni.slot_exists(level, slot))
        return Key((level, pg, slot), valid)

    def entry_ix(self, ops: Any, seq: Term, lc: Term, ordinal: Term) -> Term:
        uni = self.uni
        seq = ops._coerce(seq, "seq")
        valid = z3.And(uni.is_seq(seq), uni.valid(uni.lcs, lc), uni.valid("ord", ordinal))
        return Key((seq, lc, ordinal), valid)

    def pocket_ix(self, ops: Any, seq: Term, lc: Term, k: Term) -> Term:
        uni = self.uni
        seq = ops._coerce(seq, "seq")
        valid = z3.And(uni.is_seq(seq), uni.valid(uni.lcs, lc), uni.valid(uni.cap, k))
        return Key((seq, lc, k), valid)


# ---- the state -----------------------------------------------------------------------

def field_shapes(cfg: KVConfig) -> dict[str, tuple[tuple[Dim, ...], str]]:
    """Index dimensions and value kind of every array of `State` (`state.SCHEMA`)."""
    lcs, cap = cfg.num_life_cycles, cfg.pocket.capacity
    dims: dict[str, tuple[Dim, ...]] = {
        "page": ("page",), "seq": ("seq",), "entry": ("seq", lcs, "ord"),
        "pocket": ("seq", lcs, cap)}
    shapes: dict[str, tuple[tuple[Dim, ...], str]] = {}
    for f in SCHEMA:
        if f.domain == "slot":  # one function per (level, pool group)
            shapes[f.name] = ((cfg.num_levels, cfg.num_pool_groups, "slot"), f.kind)
        elif f.domain in dims:
            shapes[f.name] = (dims[f.domain], f.kind)
    return shapes


SCALARS = {f.name: f.kind for f in SCHEMA if f.domain == "scalar"}


def symbolic_state(uni: Universe, prefix: str) -> State:
    """A state whose arrays are uninterpreted functions."""
    kwargs: dict[str, Any] = {}
    for name, (dims, kind) in field_shapes(uni.cfg).items():
        f = z3.Function(f"{prefix}{name}", *[uni.dim_sort(d) for d in dims], uni.sort_of(kind))
        kwargs[name] = Field(name, dims, kind, _apply(f), uni)
    for name, kind in SCALARS.items():
        kwargs[name] = z3.Const(f"{prefix}{name}", uni.sort_of(kind))
    return State(**kwargs)


def _apply(f: Any) -> Callable[[tuple[Any, ...]], Any]:
    return lambda ix: f(*ix)


def _constant(v: Any) -> Callable[[tuple[Any, ...]], Any]:
    return lambda ix: v


def uniform_state(uni: Universe, lay: Layout) -> State:
    """The model's Init read off a concrete layout: every array is uniform there."""
    init = lay.initial_state()
    kwargs: dict[str, Any] = {}
    for name, (dims, kind) in field_shapes(uni.cfg).items():
        values = set(getattr(init, name))
        if len(values) != 1:
            raise NotInFragment(f"Init of {name} is not uniform: {values}")
        v = _lit(uni, next(iter(values)), kind)
        kwargs[name] = Field(name, dims, kind, _constant(v), uni)
    for name, kind in SCALARS.items():
        kwargs[name] = _lit(uni, getattr(init, name), kind)
    return State(**kwargs)


def _lit(uni: Universe, v: Any, kind: str) -> Any:
    if kind == "bool":
        return z3.BoolVal(bool(v))
    if kind == "int":
        return z3.IntVal(int(v))
    if v == NIL:
        return uni.nil[kind]
    raise NotInFragment(f"the element {v} in a uniform state")


def as_fields(uni: Universe, s: State) -> dict[str, Field]:
    """The post-state's arrays as `Field`s (comprehension tuples become functions)."""
    out: dict[str, Field] = {}
    for name, (dims, kind) in field_shapes(uni.cfg).items():
        v = getattr(s, name)
        out[name] = v if isinstance(v, Field) else comprehension(uni, name, dims, kind, v)
    return out


# ---- parameters ----------------------------------------------------------------------

# How each parameter of the action table is read: an element of a sort, an unbounded
# integer, or an enumerated value of the configuration's shape.
def param_kind(name: str) -> str:
    return {"page": "page", "seq": "seq", "slot": "slot", "dst_slot": "slot",
            "stream": "seq", "ordinal": "int", "key": "int", "capacity": "int",
            "history": "int", "committed": "int"}.get(name, "enum")


def enum_domain(cfg: KVConfig, name: str) -> range:
    return {"lc": range(cfg.num_life_cycles), "k": range(cfg.pocket.capacity),
            "status": range(len(SeqStatus)), "commit_state": range(len(CommitState))}[name]


@dataclass
class ActionInstance:
    """One action with its enumerated parameters fixed and the others symbolic."""

    action: str
    params: dict[str, Any]
    constraints: list[Any]  # what the concrete parameter domains guarantee

    def label(self) -> str:
        fixed = [f"{k}={v}" for k, v in self.params.items() if isinstance(v, int)]
        return self.action + (f"({', '.join(fixed)})" if fixed else "")


def instances(uni: Universe, action: PageAction, prefix: str = "") -> list[ActionInstance]:
    cfg = uni.cfg
    sym: dict[str, Any] = {}
    cons: list[Any] = []
    enums: list[tuple[str, range]] = []
    for p in action.params:
        kind = param_kind(p.name)
        if kind == "enum":
            enums.append((p.name, enum_domain(cfg, p.name)))
            continue
        v = z3.Const(f"{prefix}{action.name}.{p.name}", uni.sort_of(kind))
        sym[p.name] = v
        if p.name == "stream":
            cons.append(z3.Or(uni.is_seq(v), v == uni.copy))
        elif kind == "seq":
            cons.append(uni.is_seq(v))
        elif kind == "int":
            cons.append(v >= 0)
            if p.name in ("capacity", "history", "committed"):
                cons.append(v <= uni.max_capacity)
        else:
            cons.append(v != uni.nil[kind])
        if p.name == "slot":  # a GPU slot chosen by the allocator: it exists at GPU
            cons.append(uni.slot_exists(GPU_LEVEL, v))
    out = []
    for combo in itertools.product(*(d for _, d in enums)):
        params = dict(sym)
        params.update({n: c for (n, _), c in zip(enums, combo, strict=True)})
        out.append(ActionInstance(action.name, params, list(cons)))
    return out


# ---- guards and their abstraction ---------------------------------------------------------

@dataclass(frozen=True)
class Abstraction:
    weaker: Callable[[EprOps, Layout, State, Params], Term]
    why: str


def _queued(ops: EprOps, lay: Layout, s: State, p: Params) -> Term:
    return ops.lookup(s.queued, p["page"], False)


def _true(ops: EprOps, lay: Layout, s: State, p: Params) -> Term:
    return True


def _pocket_empty_if_inactive(ops: EprOps, lay: Layout, s: State, p: Params) -> Term:
    return ops.implies(ops.ne(p["status"], int(SeqStatus.ACTIVE)),
                       ops.eq(pocket_size_all(ops, lay, s, p["seq"]), 0))


ABSTRACTIONS: dict[str, Abstraction] = {
    "page is the head of its level's eviction queue": Abstraction(
        _queued, "queue_head(p) = queued(p) and no queued page of the same level and pool "
        "group comes before p in LRU order; the order is dropped: any queued page may go"),
    "no committed page of that life cycle has the key": Abstraction(
        _true, "key uniqueness among committed pages is dropped: any key may be committed"),
    "an inactive sequence has an empty pocket and no locks": Abstraction(
        _pocket_empty_if_inactive, "the scan of every block for locks is dropped; the "
        "pocket part (enumerated positions) is kept"),
    "a free or closed sequence has no blocks": Abstraction(
        _true, "the scan of every block is dropped"),
}


@dataclass
class Derived:
    """An action instance read in the parametric interpretation."""

    guard: list[tuple[str, Any]]
    post: State
    abstracted: list[str] = field(default_factory=list)
    havocs: list[str] = field(default_factory=list)


def derive(uni: Universe, inst: ActionInstance, pre: State) -> Derived:
    """Guard conditions and post-state of one instance, read from PAGE_ACTIONS."""
    action = PAGE_ACTIONS[inst.action]
    ops = EprOps(uni)
    lay = EprLayout(uni.cfg, uni)
    conds = action.guard(ops, lay, pre, dict(inst.params))
    abstracted: list[str] = []
    if lay.read_records:
        probe = EprLayout(uni.cfg, uni, records=1)
        probed = action.guard(EprOps(uni), probe, pre, dict(inst.params))
        out = []
        for (label, term), (_, term1) in zip(conds, probed, strict=True):
            if _same(term, term1):
                out.append((label, term))
                continue
            if label not in ABSTRACTIONS:
                raise NotInFragment(f"{inst.action}: condition {label!r} reads every record "
                                    "and has no abstraction")
            out.append((label, ABSTRACTIONS[label].weaker(ops, lay, pre, dict(inst.params))))
            abstracted.append(label)
        conds = out
    elay = EprLayout(uni.cfg, uni)
    post = action.effect(ops, elay, pre, dict(inst.params))
    if elay.read_records:
        raise NotInFragment(f"{inst.action}: the effect reads every page record or block")
    guard = [(label, _as_bool(term)) for label, term in conds]
    for label, term in guard:
        if iteration_vars(term):
            raise NotInFragment(f"{inst.action}: {label!r} leaves an iteration unbound")
    return Derived(guard, post, abstracted, ops.havocs)


def _same(a: Any, b: Any) -> bool:
    """Equal terms, up to the names of iteration variables and fresh values."""
    if z3.is_expr(a) and z3.is_expr(b):
        return bool(a.eq(b)) or _normal(a) == _normal(b)
    return not z3.is_expr(a) and not z3.is_expr(b) and a == b


def _normal(t: Any) -> str:
    return re.sub(r"(it|havoc)\d+", r"\1", t.sexpr())


# ---- the abstraction of a concrete state (for the over-approximation tests) ---------------

_FINITE: dict[tuple[KVConfig, FiniteSizes], Universe] = {}


def finite_universe(lay: Layout) -> Universe:
    """A universe with exactly the configuration's pages, slot ids and sequences."""
    cfg = lay.cfg
    sizes = FiniteSizes(lay.pages, lay.seqs, tuple(cfg.slots_per_level), lay.blocks,
                        cfg.max_capacity)
    if (cfg, sizes) not in _FINITE:
        _FINITE[cfg, sizes] = Universe(cfg, sizes)
    return _FINITE[cfg, sizes]


class Alpha:
    """alpha: concrete values to terms of a finite universe (record i is element i)."""

    def __init__(self, uni: Universe, lay: Layout) -> None:
        self.uni, self.lay = uni, lay

    def value(self, kind: str, v: Any) -> Any:
        if kind in ("bool", "int") or v == NIL:
            return _lit(self.uni, v, kind)
        if kind == "seq" and v == self.lay.copy_stream:
            return self.uni.copy
        return self.uni.elements[kind][v]

    def keys(self, dims: tuple[Dim, ...], with_nil: bool = True) -> list[tuple[Any, ...]]:
        """Every index tuple of the finite universe (plus nil and one ordinal past the end)."""
        ranges: list[list[Any]] = []
        for d in dims:
            if isinstance(d, int):
                ranges.append(list(range(d)))
            elif d == "ord":
                ranges.append([z3.IntVal(o) for o in range(self.lay.blocks + 1)])
            else:
                extra = [self.uni.nil[d]] + ([self.uni.copy] if d == "seq" else [])
                ranges.append(list(self.uni.elements[d]) + (extra if with_nil else []))
        return list(itertools.product(*ranges))

    def concrete_keys(self, name: str, dims: tuple[Dim, ...]) -> list[tuple[tuple[Any, ...], int]]:
        """(index tuple of the universe, flat index into the concrete array)."""
        lay = self.lay
        out: list[tuple[tuple[Any, ...], int]] = []
        if dims == ("page",):
            out = [((self.uni.elements["page"][i],), i) for i in range(lay.pages)]
        elif dims == ("seq",):
            out = [((self.uni.elements["seq"][i],), i) for i in range(lay.seqs)]
        elif SCHEMA_BY_NAME[name].domain == "slot":
            for flat in range(lay.total_slots):
                lv, g, x = lay.slot_coords(flat)
                out.append(((lv, g, self.uni.elements["slot"][x]), flat))
        elif SCHEMA_BY_NAME[name].domain == "pocket":
            for q in range(lay.seqs):
                for lc in range(lay.lcs):
                    for k in range(lay.pocket_cap):
                        out.append(((self.uni.elements["seq"][q], lc, k),
                                    lay.pocket_ix(CONCRETE, q, lc, k)))
        else:
            for q in range(lay.seqs):
                for lc in range(lay.lcs):
                    for o in range(lay.blocks):
                        out.append(((self.uni.elements["seq"][q], lc, z3.IntVal(o)),
                                    lay.entry_ix(CONCRETE, q, lc, o)))
        return out

    def state(self, s: State) -> State:
        """alpha(s): arrays as if-then-else tables; outside the table, Init's value."""
        init = uniform_state(self.uni, self.lay)
        kwargs: dict[str, Any] = {}
        for name, (dims, kind) in field_shapes(self.uni.cfg).items():
            arr = getattr(s, name)
            table = [(ix, self.value(kind, arr[flat])) for ix, flat in self.concrete_keys(name, dims)]
            default = getattr(init, name)

            fast = {tuple(_ground(x) for x in key): val for key, val in table}

            def get(ix: tuple[Any, ...], table: list[tuple[tuple[Any, ...], Any]] = table,
                    default: Field = default, fast: dict[tuple[Any, ...], Any] = fast) -> Any:
                ground = tuple(_ground(x) for x in ix)
                if None not in ground:  # a concrete index: read the table
                    return fast.get(ground, default.get(ix))
                result = default.get(ix)
                for key, val in table:
                    result = z3.If(z3.And(*(_part_eq(a, b) for a, b in zip(ix, key, strict=True))),
                                   val, result)
                return result

            kwargs[name] = Field(name, dims, kind, get, self.uni)
        for name, kind in SCALARS.items():
            kwargs[name] = self.value(kind, getattr(s, name))
        return State(**kwargs)

    def instance(self, action: str, params: dict[str, int]) -> ActionInstance:
        out: dict[str, Any] = {}
        for name, v in params.items():
            kind = param_kind(name)
            out[name] = v if kind == "enum" else self.value(kind, v)
        return ActionInstance(action, out, [])


def simulation_failures(lay: Layout, s: State, action: str, params: dict[str, int],
                        post: State | None = None) -> list[str]:
    """Check that alpha(effect(s)) is a successor of alpha(s) in the parametric reading of
    `action` (its guard holds and its post-state agrees with alpha of the concrete one at
    every index, for some value of whatever was abstracted). Empty when it is. `post`
    replaces the concrete successor (tests show a wrong one is caught)."""
    a = PAGE_ACTIONS[action]
    if post is None:
        post = a.effect(CONCRETE, lay, s, dict(params))
    uni = finite_universe(lay)
    alpha = Alpha(uni, lay)
    d = derive(uni, alpha.instance(action, params), alpha.state(s))
    want = alpha.state(post)
    got = as_fields(uni, d.post)
    solver = limited(z3.Solver(), EPR_RLIMIT)
    checks: list[tuple[str, Any]] = [(f"guard: {label}", g) for label, g in d.guard]
    for name, (dims, _) in field_shapes(uni.cfg).items():
        wf: Field = getattr(want, name)
        for ix in alpha.keys(dims):
            checks.append((f"{name}{_show(ix)}", got[name].get(ix) == wf.get(ix)))
    for name in SCALARS:
        checks.append((name, _as_bool_eq(getattr(d.post, name), getattr(want, name))))
    # Most parts are ground (nothing was abstracted in them): evaluate those directly.
    failures, open_ = [], []
    for label, c in checks:
        c = z3.simplify(c)
        if z3.is_false(c):
            failures.append(label)
        elif not z3.is_true(c):
            open_.append((label, c))
    if failures:
        return failures
    solver.add(*(c for _, c in open_))
    if solver.check() == z3.sat:
        return []
    for label, c in open_:  # name the parts that cannot hold
        one = limited(z3.Solver(), EPR_RLIMIT)
        one.add(c)
        if one.check() != z3.sat:
            failures.append(label)
    return failures or ["the parts hold one by one but not together"]


def _as_bool_eq(a: Any, b: Any) -> Any:
    if not z3.is_expr(a):
        a = z3.BoolVal(a) if isinstance(a, bool) else z3.IntVal(int(a))
    return a == b


def _show(ix: tuple[Any, ...]) -> str:
    return "(" + ", ".join(str(x) for x in ix) + ")"


def _ground(x: Any) -> str | None:
    """A concrete index part's name, or None when it is symbolic."""
    if isinstance(x, int):
        return str(x)
    if not (z3.is_int_value(x) or (z3.is_const(x) and x.decl().kind() == z3.Z3_OP_DT_CONSTRUCTOR)):
        x = z3.simplify(x)
    if z3.is_int_value(x) or (z3.is_const(x) and x.decl().kind() == z3.Z3_OP_DT_CONSTRUCTOR):
        return str(x)
    return None
