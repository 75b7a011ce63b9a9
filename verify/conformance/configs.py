"""Configurations as drawn data: a Hypothesis strategy for valid, small `KVConfig`s.

The presets (`verify/presets.py`) each pin one shape of manager; a bug that needs a
shape no preset has (two sliding windows of different sizes, sinks together with a
full-attention life cycle listed first, a disk level under split pools, ...) behaves
like correct code on every one of them. `kv_configs()` draws the shape too: the number
of life cycles and their windows, sinks, order and priorities, tokens per block, pool
groups, levels and slots per level, sequences, the pocket's capacity, policy and
`evict_parked`. Sizes stay small so that eviction, parking and OutOfPages happen within
a few steps, and every drawn value is one `KVConfig` accepts (a strategy that drew an
invalid one would be a bug of this module, tested in tests/conformance/test_configs.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from kvpocket.model.config import (
    EvictParked,
    KVConfig,
    LifeCycle,
    PocketConfig,
    PocketPolicy,
)

SAFE_POLICIES: tuple[PocketPolicy, ...] = (PocketPolicy.REVALIDATE, PocketPolicy.PIN)
MAX_SWA = 3  # sliding-window life cycles per configuration
MAX_WINDOW = 8  # tokens
MAX_SLOTS = 12  # per level and pool group


@st.composite
def life_cycles(draw: st.DrawFn) -> tuple[LifeCycle, ...]:
    """One to three sliding windows (often of different sizes, some with sink tokens) and
    maybe a full-attention life cycle, listed first or last; pool groups numbered without
    gaps in order of first use."""
    n_swa = draw(st.integers(1, MAX_SWA), label="sliding windows")
    windows = draw(st.lists(st.integers(1, MAX_WINDOW), min_size=n_swa, max_size=n_swa),
                   label="windows")
    swa = []
    for i, window in enumerate(windows):
        sinks = draw(st.sampled_from((0, 0, 1, 2)), label=f"sinks {i}")
        priority = draw(st.sampled_from((10, 20, 35)), label=f"priority {i}")
        swa.append(LifeCycle(f"swa{i}", window=window, sink_tokens=sinks, priority=priority))
    lcs = list(swa)
    full = draw(st.sampled_from(("none", "first", "last")), label="full attention")
    if full != "none":
        lc = LifeCycle("full", priority=draw(st.sampled_from((20, 35, 50)), label="priority"))
        lcs = [lc, *lcs] if full == "first" else [*lcs, lc]
    split = draw(st.booleans(), label="split pools") and len(lcs) > 1
    raw = [draw(st.integers(0, 1), label=f"pool group {i}") if split else 0
           for i in range(len(lcs))]
    renumber: dict[int, int] = {}
    for g in raw:
        renumber.setdefault(g, len(renumber))
    return tuple(LifeCycle(lc.name, lc.window, lc.sink_tokens, renumber[g], lc.priority)
                 for lc, g in zip(lcs, raw, strict=True))


@st.composite
def kv_configs(draw: st.DrawFn, policies: Sequence[PocketPolicy | str] = SAFE_POLICIES,
               pocket_off: bool = True) -> KVConfig:
    """A valid `KVConfig` of a small size. `policies`: the pocket policies to draw from
    (the default campaign checks the safe ones); `pocket_off`: sometimes draw the pocket
    disabled."""
    lcs = draw(life_cycles(), label="life cycles")
    t = draw(st.integers(1, 4), label="tokens per block")
    levels = draw(st.integers(1, 3), label="levels")
    # Enough GPU slots per pool group for one block of each of its life cycles (and one
    # more): otherwise nearly every call runs out of pages and nothing else is explored.
    per_group = max(sum(1 for lc in lcs if lc.pool_group == g)
                    for g in {lc.pool_group for lc in lcs})
    gpu = draw(st.integers(per_group + 1, MAX_SLOTS), label="GPU slots")
    lower = draw(st.lists(st.integers(1, 8), min_size=levels - 1, max_size=levels - 1),
                 label="lower slots")
    off = pocket_off and draw(st.integers(0, 3), label="pocket off") == 0  # one in four
    pocket = PocketConfig(
        enabled=not off,
        capacity=draw(st.integers(1, 3), label="pocket capacity"),
        policy=PocketPolicy.parse(draw(st.sampled_from(tuple(policies)), label="policy")),
        evict_parked=draw(st.sampled_from(tuple(EvictParked)), label="evict_parked"),
    )
    return KVConfig(
        tokens_per_block=t, life_cycles=lcs, slots_per_level=(gpu, *lower),
        num_sequences=draw(st.integers(1, 3), label="sequences"),
        max_blocks=draw(st.integers(4, 12), label="max blocks"), pocket=pocket,
    )
