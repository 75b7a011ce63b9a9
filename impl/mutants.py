"""Seeded-bug switches of the implementation (`kvpocket mutants`). Standard library only.

An implementation mutant is a named, realistic bug guarded by a one-line
`if mutants.active("name")` branch at the spot it lives in `impl/*.py`. Off by default:
`active` is one set lookup. (The model has no switches: a spec mutant overrides one of
its labelled conditions from outside, see `kvpocket.model.overrides`.)

Switch one on in-process with `with enable("name"):`, or for a whole process tree with
the environment variable `KVPOCKET_MUTANT=name[,name...]` (read at import; `enable`
also sets it while active, so spawned workers inherit it). The registry of names,
descriptions and the bugs they are modelled on is `kvpocket.verify.quality.seeded.MUTANTS`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "KVPOCKET_MUTANT"


def _parse(value: str | None) -> set[str]:
    return {n.strip() for n in (value or "").split(",") if n.strip()}


_ACTIVE: set[str] = _parse(os.environ.get(ENV))


def active(name: str) -> bool:
    """Whether the seeded bug `name` is switched on."""
    return name in _ACTIVE


def active_names() -> frozenset[str]:
    return frozenset(_ACTIVE)


@contextmanager
def enable(*names: str) -> Iterator[None]:
    """Switch the named bugs on for the block (and for processes it spawns); always restores."""
    saved, saved_env = set(_ACTIVE), os.environ.get(ENV)
    _ACTIVE.update(names)
    os.environ[ENV] = ",".join(sorted(_ACTIVE))
    try:
        yield
    finally:
        _ACTIVE.clear()
        _ACTIVE.update(saved)
        if saved_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved_env
