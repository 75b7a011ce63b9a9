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


def api_form() -> dict[str, tuple[Param, ...]]:
    """Every action of the table with its own parameters (the form event logs carry)."""
    return {name: a.params for name, a in API.items()}


def check_params(action: object, params: dict[str, Any],
                 form: dict[str, tuple[Param, ...]] | None = None, events: bool = False) -> None:
    """The one validator of an action call: its name and parameters against the table, in
    the trace form (`alphabet()`, the default) or another (`api_form()`; pass it once per
    log rather than per line). `events`: an event log's line, whose copy stream may be
    named "copy". A ValueError names the action, the parameter and what it takes."""
    table = alphabet() if form is None else form
    if not isinstance(action, str) or action not in table:
        raise ValueError(f"unknown action {action!r}; expected one of {', '.join(table)}")
    want = table[action]
    names = {p.name for p in want}
    if set(params) != names:
        hint = " (event logs carry the committed \"tokens\", not \"n\")" \
            if events and "n" in params else ""
        raise ValueError(f"action '{action}' takes parameters {sorted(names)}, "
                         f"got {sorted(params)}{hint}")
    for p in want:
        v = params[p.name]
        if p.kind == "tokens":
            if not isinstance(v, list) or not all(_is_int(x) for x in v):
                raise ValueError(f"parameter '{p.name}' of '{action}' must be a list of ints")
        elif events and p.kind == "stream" and v == "copy":
            continue
        elif not _is_int(v):
            raise ValueError(f"parameter '{p.name}' of '{action}' must be an int, got {v!r}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
