"""Named conditions a verifier may override, by label, from outside the spec.

The spec names every condition it decides on: each page action's guard is a list of
labelled conditions, and the API programs wrap the few derived terms they decide on
in `named(ops, label, term)`. Mutation analysis ("would the kit notice if the spec said
this instead?") overrides a label, never a switch written into the spec:

* `("always", True)`  the condition always holds (a dropped guard or check);
* `("add", k)`        an integer term shifted by k (an off-by-one).

Overrides are plain data. Nothing here reads the environment: a verifier switches them on
in-process (`overriding`), and hands them to the worker processes it starts, which
`install` them (`verify/conformance/fuzz.py: init_worker`, as seeded bugs of impl/ are).
With none active, `named` is one dictionary test.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from .logic import Ops, Term

KINDS = ("always", "add")
Override = tuple[str, int | bool]


def check_override(label: str, ov: object) -> Override:
    if (not isinstance(ov, (tuple, list)) or len(ov) != 2 or ov[0] not in KINDS
            or not isinstance(ov[1], (int, bool))):
        raise ValueError(f"override of {label!r}: expected (kind, value) with kind one of "
                         f"{', '.join(KINDS)} and an int or bool value, got {ov!r}")
    return (str(ov[0]), ov[1])


_ACTIVE: dict[str, Override] = {}


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


def install(overrides: Mapping[str, Override]) -> None:
    """Switch the overrides on for the rest of this process (a worker started by a
    verifier that had them on)."""
    checked = {label: check_override(label, ov) for label, ov in overrides.items()}
    _ACTIVE.clear()
    _ACTIVE.update(checked)


@contextmanager
def overriding(overrides: Mapping[str, Override]) -> Iterator[None]:
    """Override the labelled conditions for the block; workers started inside it get them
    from their starter (`install`)."""
    checked = {label: check_override(label, ov) for label, ov in overrides.items()}
    saved = dict(_ACTIVE)
    _ACTIVE.update(checked)
    try:
        yield
    finally:
        _ACTIVE.clear()
        _ACTIVE.update(saved)
