"""Reachable and corrupted model states for the model tests."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from kvpocket.model import Model
from kvpocket.model.errors import UsageError
from kvpocket.model.machine import SPARSE_ABOVE
from kvpocket.model.sparse import SparseArray
from kvpocket.model.state import CONCRETE_FIELDS, STATE_FIELDS, State
from kvpocket.verify.presets import PRESETS


def reachable(preset: str, seed: int, steps: int, sparse: bool = False,
              order: str = "any") -> Model:
    """A model after `steps` random calls under policy profile `order`; `sparse`: every
    state array a `SparseArray` (else the presets' small arrays are tuples)."""
    m = Model(PRESETS[preset].config.with_order(order),
              sparse_above=0 if sparse else SPARSE_ABOVE)
    for _ in random_calls(m, seed, steps):
        pass
    return m


def random_calls(m: Model, seed: int, steps: int) -> Iterator[str]:
    """Make `steps` random API calls on `m` (a usage error is part of the run), yielding
    each call's name after it ran."""
    rng = random.Random(seed)
    cfg = m.cfg
    for _ in range(steps):
        seq = rng.randrange(cfg.num_sequences)
        s = m.state
        name, args = rng.choice([
            ("create", (seq, tuple(rng.randrange(2) for _ in range(rng.randrange(5))))),
            ("resume", (seq,)), ("stop_committing", (seq,)), ("suspend", (seq,)),
            ("close", (seq,)), ("commit", (seq, (rng.randrange(2),) * rng.randrange(1, 3))),
            ("resize", (seq, min(s.capacity[seq] + rng.randrange(4), cfg.max_capacity),
                        min(s.history[seq] + rng.randrange(3), s.capacity[seq]))),
            ("pressure", (rng.randrange(cfg.num_levels), 0, rng.randrange(1, 3))),
        ])
        with contextlib.suppress(UsageError):
            getattr(m, name)(*args)
        yield name


def perturb(s: State, rng: random.Random) -> State:
    name = rng.choice([f for f in STATE_FIELDS if f not in CONCRETE_FIELDS])
    value = getattr(s, name)
    changed: object
    if isinstance(value, (tuple, SparseArray)):
        i = rng.randrange(len(value))
        old = value[i]
        new = (not old) if isinstance(old, bool) else old + rng.choice([-2, -1, 1, 2])
        changed = value.set(i, new) if isinstance(value, SparseArray) else \
            (*value[:i], new, *value[i + 1:])
    else:
        changed = (not value) if isinstance(value, bool) else value + 1
    fields: dict[str, Any] = {name: changed}
    return replace(s, **fields)
