"""The lockstep alphabet: the model's API table in the form traces and the lockstep use.

One difference from the API table: a lockstep step (and a trace line) names commit's
tokens by count, "the sequence's next n tokens", which the harness draws from its token
stream; so traces stay short and the data oracle knows every token. Event logs carry the
tokens themselves (the API form).
"""

from __future__ import annotations

from typing import Any

from kvpocket.model.api import API, Param

TRACE_FORM: dict[str, dict[str, Param]] = {"commit": {"tokens": Param("n", "count")}}


def trace_params(action: str) -> tuple[Param, ...]:
    swap = TRACE_FORM.get(action, {})
    return tuple(swap.get(p.name, p) for p in API[action].params)


def alphabet() -> dict[str, tuple[Param, ...]]:
    """Every action of the table, with its parameters in the trace form (read at call time:
    an action added to the table is in the alphabet)."""
    return {name: trace_params(name) for name in API}


def check_params(action: str, params: dict[str, Any]) -> None:
    """A trace line's action and parameters, validated with a clear message."""
    if action not in API:
        raise ValueError(f"unknown action '{action}'; expected one of {', '.join(API)}")
    want = {p.name for p in trace_params(action)}
    got = set(params)
    if want != got:
        raise ValueError(f"action '{action}' takes parameters {sorted(want)}, got {sorted(got)}")
    for p in trace_params(action):
        v = params[p.name]
        if p.kind == "tokens":
            if not isinstance(v, list) or not all(isinstance(x, int) for x in v):
                raise ValueError(f"parameter '{p.name}' of '{action}' must be a list of ints")
        elif isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"parameter '{p.name}' of '{action}' must be an int, got {v!r}")
