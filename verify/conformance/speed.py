"""Every structure kept for speed, checked against its plain meaning after each step.

One registry for both sides: the implementation's (`impl/selfcheck.py: SPEED_CHECKS`:
the lazy eviction heaps, the allocators' free lists, the radix tree's index, the
handles' remembered stale ranges and window-change bound) and the executable model's
(`model/speedcheck.py: SPEED_CHECKS`: the incremental checker's memory and its
entries-by-page index, the block-key tables, the remembered resize answers, the sparse
arrays). The lockstep (`lockstep.py`) calls `check_speed_structures` after every step
and raises a `Divergence` naming the structure that drifted.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from kvpocket.impl.manager import KVCacheManager
from kvpocket.impl.selfcheck import SPEED_CHECKS as IMPL_CHECKS
from kvpocket.model import speedcheck
from kvpocket.model.machine import Model

KIND = "a speed structure differs from its meaning"

# structure name -> the side it lives on (docs/campaigns.md lists them)
STRUCTURES: dict[str, str] = {
    **dict.fromkeys(IMPL_CHECKS, "implementation"),
    **dict.fromkeys(speedcheck.SPEED_CHECKS, "model"),
}

# Remembered resize answers never change once made: each is checked once per model.
_RESIZE_SEEN: WeakKeyDictionary[Model, set[tuple[Any, ...]]] = WeakKeyDictionary()
# The incremental checker's memory is checked for one invariant in HELD_PARTS after each
# step, in rotation (all of them every step would double a campaign's cost; a remembered
# violation lasts until a step repairs the state, so it is met within HELD_PARTS steps).
HELD_PARTS = 8
_CALLS: WeakKeyDictionary[Model, int] = WeakKeyDictionary()


def check_speed_structures(impl: KVCacheManager, model: Model) -> list[str]:
    """Each structure's disagreements with its plain meaning, led by the side and the
    structure's name; [] when every one agrees."""
    out = [f"implementation {name}: {line}"
           for name, check in IMPL_CHECKS.items() for line in check(impl)]
    seen = _RESIZE_SEEN.setdefault(model, set())
    for name, check in speedcheck.SPEED_CHECKS.items():
        if check is speedcheck.resize_memo:
            lines = speedcheck.resize_memo(model, seen)
        elif check is speedcheck.incremental_held:
            calls = _CALLS[model] = _CALLS.get(model, -1) + 1
            lines = speedcheck.incremental_held(model, calls % HELD_PARTS, HELD_PARTS)
        else:
            lines = check(model)
        out += [f"model {name}: {line}" for line in lines]
    return out


# ---- the speed structures' rare paths, with live entries (rare states of the gate) -------
HEAP_COMPACTED = "eviction heap compacted with live entries"
RARE_PATHS: tuple[str, ...] = (HEAP_COMPACTED,)

_COMPACTIONS: WeakKeyDictionary[KVCacheManager, int] = WeakKeyDictionary()


def rare_path_events(impl: KVCacheManager) -> list[str]:
    """The speed structures' rare paths the last step ran with live entries (a bug on such
    a path changes nothing when it runs with none): an eviction queue's heap rebuilt from
    its live entries."""
    queues = [q for level in impl.storage.queues for q in level]
    total = sum(q.compactions for q in queues)
    before = _COMPACTIONS.get(impl, 0)
    _COMPACTIONS[impl] = total
    if total > before and any(q.compacted_live for q in queues):
        return [HEAP_COMPACTED]
    return []
