"""What a bounded search from Init explores and reports, shared by its two engines.

`symbolic_bmc` unrolls the steps for Z3; `explicit_bmc` enumerates them on the
concrete model. Both read the same alphabet (`api_instances`, from the API
table), start from the same state (Init, or the state after a recorded prefix),
look for the same properties and report a `BmcResult` whose trace is in the
shared trace format.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kvpocket.model import api
from kvpocket.model.config import NONE, KVConfig
from kvpocket.model.invariants import INVARIANTS, Invariant
from kvpocket.model.machine import Model
from kvpocket.model.pages import PAGE_ACTIONS
from kvpocket.model.state import Layout, State
from kvpocket.verify.traces.trace import TraceStep, run_api_step


@dataclass(frozen=True)
class Instance:
    """One page action with concrete parameters."""

    action: str
    params: tuple[tuple[str, int], ...]

    @property
    def param_dict(self) -> dict[str, int]:
        return dict(self.params)

    def __str__(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.action}({shown})"


def page_instances(lay: Layout, actions: Iterable[str] | None = None) -> list[Instance]:
    """All instances of the page actions over their parameter domains."""
    out: list[Instance] = []
    for name in actions or PAGE_ACTIONS:
        a = PAGE_ACTIONS[name]
        domains = [list(p.domain(lay.cfg)) for p in a.params]
        for combo in itertools.product(*domains):
            out.append(Instance(name, tuple((p.name, v) for p, v in zip(a.params, combo,
                                                                         strict=True))))
    return out


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
    """The API alphabet BMC explores, derived from the API table (`api.API`).

    Sequence actions per sequence, in table order (a prompt is empty; token counts, resize's
    capacity and history, are symbolic in [0, max capacity]; the model's own requires
    add the rest); then the other actions with every value of their parameters (a
    pressure of 1..the level's slots: 0 changes nothing). Actions that read token content
    (`concrete_only`: commit) are left out.
    """
    out: list[ApiInstance] = []
    symbolic = (0, cfg.max_capacity)
    actions = [a for a in api.API.values() if not a.concrete_only]

    def instances(a: api.ApiAction, fixed: dict[str, Any]) -> list[ApiInstance]:
        todo = [p for p in a.params if p.name not in fixed]
        if not todo:
            sym = {n: symbolic for n, v in fixed.items() if v is _SYMBOLIC}
            return [ApiInstance(a.name, {n: v for n, v in fixed.items() if v is not _SYMBOLIC},
                                a.program, sym)]
        p = todo[0]
        return [i for v in _values(cfg, p.kind, fixed) for i in instances(a, {**fixed, p.name: v})]

    for q in range(cfg.num_sequences):
        for a in actions:
            if "seq" in a.param_names:
                out += instances(a, {"seq": q})
    for a in actions:
        if "seq" not in a.param_names:
            out += instances(a, {})
    return out


_SYMBOLIC = object()  # a parameter value left to the solver


def _values(cfg: KVConfig, kind: str, fixed: dict[str, Any]) -> list[Any]:
    """Every value BMC tries for a parameter of this kind."""
    if kind == "length":
        return [_SYMBOLIC]
    if kind == "tokens":
        return [()]
    if kind == "seq":
        return list(range(cfg.num_sequences))
    if kind == "level":
        return list(range(cfg.num_levels))
    if kind == "pool_group":
        return list(range(cfg.num_pool_groups))
    if kind == "slots":
        return list(range(1, cfg.slots_per_level[fixed["level"]] + 1))
    if kind == "stream":
        return list(range(cfg.num_sequences + 1))
    raise ValueError(f"BMC has no values for parameter kind {kind!r}")


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
    engine: str = "symbolic"  # "symbolic" (Z3 unrolling) or "explicit" (exhaustive search)
    states: int = 0  # distinct states the explicit search visited


def properties(layer: str) -> list[Invariant]:
    """What BMC looks for: a safety invariant (not an aux lemma) broken after a step.

    Aux lemmas and the API-scope invariants are left to the induction proof and to the
    concrete replay (which checks every invariant); keeping the bad-state formula small
    is what makes the unrolling fast.
    """
    return [i for i in INVARIANTS if i.scope == "step" and not i.aux]


def every_invariant(layer: str) -> list[Invariant]:
    """Every invariant the states of a layer keep: between API actions all of them (the
    API-scope ones and the lemmas too), between page actions the step-scope ones. The
    explicit engine checks them all: on concrete states that costs next to nothing, and it
    catches what only an API-scope invariant sees (a window off by one)."""
    return [i for i in INVARIANTS if layer == "api" or i.scope == "step"]


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


def record_prefix(lay: Layout, prefix: list[TraceStep]) -> list[TraceStep]:
    """The prefix with the model's choices filled in (the lowest legal ones when absent)."""
    m = Model(lay.cfg)
    out: list[TraceStep] = []
    for step in prefix:
        run_api_step(m, step)
        out.append(TraceStep(step.action, dict(step.params), "api",
                             [c for c in m.last_choices if c[1] != NONE]))
    return out
