"""Named conditions a verifier may override, by label, from outside the spec.

The spec names every condition it decides on: each page action's guard is a list of
labelled conditions, and the API programs wrap the few derived terms they decide on
in `named(ops, label, term)`. Mutation analysis ("would the kit notice if the spec said
this instead?") overrides a label, never a switch written into the spec:

* `("always", True)`  the condition always holds (a dropped guard or check);
* `("add", k)`        an integer term shifted by k (an off-by-one).

Overrides are plain data, so they reach spawned workers through the environment
variable `KVPOCKET_MODEL_OVERRIDES` (JSON, read at import; `overriding` sets it while
active). With none active, `named` is one dictionary test.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from .logic import Ops, Term

ENV = "KVPOCKET_MODEL_OVERRIDES"
KINDS = ("always", "add")
Override = tuple[str, int | bool]


def check_override(label: str, ov: object) -> Override:
    if (not isinstance(ov, (tuple, list)) or len(ov) != 2 or ov[0] not in KINDS
            or not isinstance(ov[1], (int, bool))):
        raise ValueError(f"override of {label!r}: expected (kind, value) with kind one of "
                         f"{', '.join(KINDS)} and an int or bool value, got {ov!r}")
    return (str(ov[0]), ov[1])


def _parse(text: str | None) -> dict[str, Override]:
    if not text:
        return {}
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError(f"{ENV}: expected a JSON object of label -> [kind, value]")
    return {str(k): check_override(str(k), v) for k, v in raw.items()}


_ACTIVE: dict[str, Override] = _parse(os.environ.get(ENV))


def named(ops: Ops, label: str, term: Term) -> Term:
    """`term`, unless a verifier overrides the condition called `label`."""
    if not _ACTIVE or label not in _ACTIVE:
        return term
    kind, value = _ACTIVE[label]
    return ops.const(value) if kind == "always" else ops.add(term, value)


def any_override() -> bool:
    return bool(_ACTIVE)


def active() -> dict[str, Override]:
    return dict(_ACTIVE)


@contextmanager
def overriding(overrides: Mapping[str, Override]) -> Iterator[None]:
    """Override the labelled conditions for the block (and processes it spawns)."""
    checked = {label: check_override(label, ov) for label, ov in overrides.items()}
    saved, saved_env = dict(_ACTIVE), os.environ.get(ENV)
    _ACTIVE.update(checked)
    os.environ[ENV] = json.dumps(_ACTIVE, sort_keys=True)
    try:
        yield
    finally:
        _ACTIVE.clear()
        _ACTIVE.update(saved)
        if saved_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved_env
