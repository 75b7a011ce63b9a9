"""Bounded model checking from Init, explicit engine: breadth-first over concrete states.

The same search as the symbolic engine (`symbolic_bmc`), run on the executable model instead of
Z3: the same alphabet (`bounded.api_instances` with every value of resize's capacity and
history, or every page-action instance), the same start state, the same properties, and
the same symmetry reduction (of interchangeable candidates only the lowest is tried).
It checks more, by default: every invariant the layer's states keep
(`bounded.every_invariant`), since on concrete states that is cheap. With `content`
it also explores what only concrete execution can: `commit` and prompts with token
content (`content_moves`), so committed pages, prefix reuse and key clashes are in
the search too.

Each API program's nondeterminism is enumerated by re-running it with a script of choice
positions, depth-first over its choice tree: the run takes the scripted candidate at
each choice it reaches and the first one beyond the script, and every alternative it
passed by becomes a new script. States are deduplicated (a step that changes nothing, or
leads back, is never extended), so breadth-first order finds a shortest violating run,
and a depth is complete only when every state at the depth before it has been expanded.
When a depth adds no new state, every reachable state has been seen: the result is then
proved for every depth, and says so.

The model's concrete execution is what makes this fast at small scopes (thousands of
states, no solver); the symbolic engine stays the independent cross-check, and the two
must agree (tests/proofs/test_bmc.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from itertools import product
from typing import Any

from kvpocket.model.config import NONE
from kvpocket.model.errors import GuardViolation
from kvpocket.model.invariants import Invariant
from kvpocket.model.logic import CONCRETE
from kvpocket.model.machine import Model
from kvpocket.model.pages import PAGE_ACTIONS
from kvpocket.model.state import Layout, State
from kvpocket.verify.proofs.bounded import (
    BmcResult,
    api_instances,
    every_invariant,
    page_instances,
    record_prefix,
    start_state,
)
from kvpocket.verify.traces.trace import TraceStep

DEFAULT_MAX_STATES = 400_000  # about 1 GB of states; past it the search stops as unknown
GUARD_BROKEN = "page-action guard violated inside an API action"


class _Scripted:
    """Takes the scripted candidate position at each choice, the first one past the
    script; records how many candidates each choice offered (the tree's branching)."""

    def __init__(self, script: tuple[int, ...]) -> None:
        self.script = script
        self.widths: list[int] = []

    def choose(self, kind: str, candidates: Sequence[int], labels: Sequence[object]) -> int:
        i = len(self.widths)
        self.widths.append(len(candidates))
        return candidates[self.script[i] if i < len(self.script) else 0]


def _api_moves(lay: Layout, content: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """The API alphabet with every value of its symbolic arguments spelled out (and, with
    `content`, the token-content moves of `content_moves`)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for inst in api_instances(lay.cfg):
        names = list(inst.symbolic)
        for values in product(*(range(lo, hi + 1) for lo, hi in inst.symbolic.values())):
            out.append((inst.name, {**inst.args, **dict(zip(names, values, strict=True))}))
    return out + (content_moves(lay) if content else [])


def content_moves(lay: Layout) -> list[tuple[str, dict[str, Any]]]:
    """Moves that carry token content, per sequence: `create` with a prompt of one or two
    full blocks, `commit` of a partial block or of one full block. Two block contents, A
    (zeros) and B (ones), are enough to tell a prefix hit (A after A) from a miss (B) and
    to make a key clash (committing A where A is already committed)."""
    t, most = lay.cfg.tokens_per_block, lay.cfg.max_capacity
    a, b = (0,) * t, (1,) * t
    prompts = [p for p in (a, a + b) if len(p) <= most]
    commits = [(0,), a, b] if t > 1 else [a, b]
    out: list[tuple[str, dict[str, Any]]] = []
    for q in range(lay.cfg.num_sequences):
        out += [("create", {"seq": q, "prompt": p}) for p in prompts]
        out += [("commit", {"seq": q, "tokens": c}) for c in commits]
    return out


def _trace_params(params: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}


class _Successors:
    """Every step from a state: (the trace step, the state after it or None when a
    page-action guard failed inside the API action)."""

    def __init__(self, lay: Layout, layer: str, content: bool) -> None:
        self.lay = lay
        self.layer = layer
        self.model = Model(lay.cfg, reduce_symmetry=True)
        self.api_moves = _api_moves(lay, content) if layer == "api" else []
        self.page_moves = page_instances(lay) if layer == "page" else []
        self.runs = 0  # programs run (API) or guards evaluated (page)

    def __call__(self, s: State) -> Iterator[tuple[TraceStep, State | None]]:
        return self._api(s) if self.layer == "api" else self._page(s)

    def _api(self, s: State) -> Iterator[tuple[TraceStep, State | None]]:
        m = self.model
        for name, params in self.api_moves:
            scripts: list[tuple[int, ...]] = [()]
            while scripts:
                script = scripts.pop()
                chooser = _Scripted(script)
                m.state = s
                self.runs += 1
                try:
                    result = m.run(name, params, chooser)
                    post: State | None = m.state
                except GuardViolation:
                    result, post = None, None
                for j in range(len(script), len(chooser.widths)):
                    pad = script + (0,) * (j - len(script))
                    scripts.extend((*pad, alt) for alt in range(1, chooser.widths[j]))
                if result is not None and (result.error is not None or post == s):
                    continue  # a usage error, or no change: nothing new to explore
                choices = [(k, int(v)) for k, v in m.last_choices if v != NONE]
                yield TraceStep(name, _trace_params(params), "api", choices), post

    def _page(self, s: State) -> Iterator[tuple[TraceStep, State | None]]:
        for inst in self.page_moves:
            a = PAGE_ACTIONS[inst.action]
            params = inst.param_dict
            self.runs += 1
            if all(ok for _, ok in a.guard(CONCRETE, self.lay, s, params)):
                yield (TraceStep(inst.action, dict(params), "page"),
                       a.effect(CONCRETE, self.lay, s, params))


def explicit_bmc(lay: Layout, layer: str, depth: int, prefix: list[TraceStep] | None = None,
                 max_states: int = DEFAULT_MAX_STATES,
                 props: Sequence[Invariant] | None = None, content: bool = False,
                 on_depth: Callable[[int, int], None] | None = None) -> BmcResult:
    """Search breadth-first for the shortest run (<= depth steps) that breaks a property
    (`props`, default `every_invariant(layer)`; `bounded.properties(layer)` asks exactly
    what the symbolic engine asks) or a page-action guard inside an API action. `content`:
    explore token content too (`content_moves`; the symbolic engine cannot).

    Same contract as `bmc.bmc`: the run starts in Init, or (API layer) in the state after
    `prefix`, and a trace found then starts with the prefix. "unknown" when more than
    `max_states` states would be needed (a count, never a time: the same answer on any
    machine); its depth is the last one completed.
    """
    t0 = time.perf_counter()
    head = record_prefix(lay, prefix) if prefix else []
    start = start_state(lay, head) if head else lay.initial_state()
    policy = lay.cfg.pocket.policy.value
    checked = list(every_invariant(layer) if props is None else props)

    def broken(s: State) -> list[str]:
        return [i.name for i in checked if not i.predicate(CONCRETE, lay, s)]

    def result(status: str, k: int, steps: list[TraceStep], bad: list[str],
               detail: str = "") -> BmcResult:
        return BmcResult(layer, policy, status, k, steps, bad, time.perf_counter() - t0, 0.0,
                         detail, engine="explicit", states=len(parent))

    parent: dict[State, tuple[State, TraceStep] | None] = {start: None}

    def trace_to(s: State, last: TraceStep | None) -> list[TraceStep]:
        steps = [last] if last is not None else []
        link = parent[s]
        while link is not None:
            s, step = link
            steps.append(step)
            link = parent[s]
        return head + steps[::-1]

    bad = broken(start)
    if bad:
        return result("violated", len(head), head, bad)
    successors = _Successors(lay, layer, content)
    frontier = [start]
    for k in range(depth):
        if on_depth is not None:  # a progress line: the depth and the states seen so far
            on_depth(k + 1, len(parent))
        deeper: list[State] = []
        for s in frontier:
            for step, post in successors(s):
                if post is None:
                    steps = trace_to(s, step)
                    return result("violated", len(steps), steps, [GUARD_BROKEN])
                if post in parent:
                    continue
                parent[post] = (s, step)
                bad = broken(post)
                if bad:
                    steps = trace_to(post, None)
                    return result("violated", len(steps), steps, bad)
                deeper.append(post)
                if len(parent) > max_states:
                    return result("unknown", k, [], [],
                                  f"more than {max_states} states by depth {k + 1}; use a "
                                  "smaller --depth or configuration")
        if not deeper:
            return result("proved", depth, [], [],
                          f"every reachable state seen by depth {k} ({len(parent)} states)")
        frontier = deeper
    return result("proved", depth, [], [], f"{len(parent)} states, {successors.runs} runs")
