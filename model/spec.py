"""The spec as data: the action table and invariant catalogue, and a page's life.

`kvpocket spec` prints this; docs/spec.md embeds the generated diagram, and a
test checks both that the docs are current and that every transition the
model actually takes appears in `PAGE_LIFE`, so the diagram cannot drift.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from .api import API
from .config import KVConfig, Order
from .invariants import INVARIANTS
from .logic import CONCRETE
from .pages import PAGE_ACTIONS, has_slot, in_pocket, moving
from .state import Layout, State


class Life(StrEnum):
    """Where a page record is in its life (a coarse view for the diagram)."""

    UNUSED = "Unused"
    LOCKED = "Locked"
    HELD = "Held"
    PARKED = "Parked"
    PARKED_NO_SLOT = "ParkedNoSlot"  # parked, its slot dropped (evict_parked=drop)
    MIGRATING = "Migrating"
    CACHED = "Cached"  # DROPPABLE: committed and queued (radix-tree cache), or about to die


def life_of(lay: Layout, s: State, p: int) -> Life:
    ops = CONCRETE
    if not s.alive[p]:
        return Life.UNUSED
    if moving(ops, s, p):
        return Life.MIGRATING
    if in_pocket(ops, s, p):
        return Life.PARKED if has_slot(ops, s, p) else Life.PARKED_NO_SLOT
    if s.locks[p] > 0:
        return Life.LOCKED
    if s.holds[p] > 0:
        return Life.HELD
    return Life.CACHED


U, L, H, P, M, C = (Life.UNUSED, Life.LOCKED, Life.HELD, Life.PARKED, Life.MIGRATING,
                    Life.CACHED)
PNS = Life.PARKED_NO_SLOT

# Transitions each page action may cause for the page it acts on (self-loops omitted).
PAGE_LIFE: dict[str, tuple[tuple[Life, Life], ...]] = {
    "allocate": ((U, L),),
    "release": ((C, U),),
    "lock": ((H, L),),
    "unlock": ((L, H),),
    "hold": ((C, H),),
    "release_holder": ((H, C),),
    "schedule": (),
    "exclude": (),
    "evict_begin": ((H, M), (C, M), (P, M)),
    "onboard_begin": ((H, M),),
    "migrate_complete": ((M, H), (M, C), (M, P)),
    "copy_fail": ((M, H), (M, C), (M, P)),
    "drop": ((C, U),),
    "drop_parked": ((P, PNS),),  # stays in its pocket (HELD by the entry), without a slot
    "park": ((H, P),),
    "pop": ((P, L),),
    "drain": ((P, U), (PNS, U)),
    "commit_page": (),
    "complete": (),
    "set_status": (),
    "set_lengths": (),
    "set_commit_state": (),
}


def mermaid_page_life() -> str:
    """A Mermaid state diagram of a page's life, generated from PAGE_LIFE."""
    edges: dict[tuple[Life, Life], list[str]] = {}
    for action, pairs in PAGE_LIFE.items():
        for pair in pairs:
            edges.setdefault(pair, []).append(action)
    lines = ["stateDiagram-v2", f"    [*] --> {U.value}"]
    for (src, dst), actions in edges.items():
        lines.append(f"    {src.value} --> {dst.value}: {', '.join(actions)}")
    return "\n".join(lines)


def page_action_guard_text(cfg: KVConfig, name: str) -> list[str]:
    """The guard's named conditions, read off the definition itself."""
    lay = Layout(cfg)
    action = PAGE_ACTIONS[name]
    params = {p.name: p.domain(cfg).start for p in action.params}
    return [label for label, _ in action.guard(CONCRETE, lay, lay.initial_state(), params)]


# What the `lru` policy profile decides in the API programs, where the safety spec leaves
# the choice free (the page actions' differences are read off their guards).
_CASCADE = "victims are queue heads; room below is made whenever the heads there can leave"
API_POLICY: dict[str, str] = {
    "resize": f"{_CASCADE}; a pop takes the oldest pocket entry",
    "resume": _CASCADE,
    "pressure": _CASCADE,
}


def policy_conditions(cfg: KVConfig, name: str) -> list[str]:
    """The guard conditions of a page action under the `lru` profile that the safety spec
    (`order=any`) does not have: what is policy, not safety."""
    safety = set(page_action_guard_text(cfg.with_order(Order.ANY), name))
    return [c for c in page_action_guard_text(cfg.with_order(Order.LRU), name)
            if c not in safety]


def spec_json(cfg: KVConfig) -> dict[str, Any]:
    """The action table and invariant catalogue under the configuration's profile; each
    action's `policy` names what the `lru` profile adds to the safety spec."""
    actions: list[dict[str, Any]] = []
    for name, a in PAGE_ACTIONS.items():
        actions.append({
            "name": name, "layer": "page", "parameters": [p.name for p in a.params],
            "guard": " and ".join(page_action_guard_text(cfg, name)), "doc": a.doc,
            "policy": " and ".join(policy_conditions(cfg, name)),
        })
    for api in API.values():
        actions.append({
            "name": api.name, "layer": api.layer, "parameters": list(api.param_names),
            "guard": api.precondition, "doc": api.doc, "returns": api.returns,
            "policy": API_POLICY.get(api.name, ""),
        })
    invariants = [
        {"name": i.name, "statement": i.statement, "scope": i.scope,
         "kind": "auxiliary" if i.aux else "safety"}
        for i in INVARIANTS
    ]
    return {"config": cfg.to_json(), "actions": actions, "invariants": invariants}


def markdown_tables(cfg: KVConfig) -> str:
    """The action table and the invariant catalogue as Markdown (docs/spec.md embeds it)."""
    data = spec_json(cfg)
    lines = ["| layer | action | parameters | guard / precondition (safety) | `order=lru` adds "
             "(policy) |", "|---|---|---|---|---|"]
    for a in data["actions"]:
        guard = a["guard"].replace("|", "\\|")
        policy = a["policy"] or "-"
        lines.append(f"| {a['layer']} | `{a['name']}` | {', '.join(a['parameters'])} | {guard} "
                     f"| {policy} |")
    lines += ["", "| invariant | scope | kind | statement |", "|---|---|---|---|"]
    for i in data["invariants"]:
        lines.append(f"| `{i['name']}` | {i['scope']} | {i['kind']} | {i['statement']} |")
    return "\n".join(lines)
