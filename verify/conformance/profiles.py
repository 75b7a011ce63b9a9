"""Hypothesis settings profiles for the lockstep machine.

dev:  quick local runs.
ci:   derandomized and bounded: the same examples every run, no database.
fuzz: long campaigns (use with `kvpocket fuzz --minutes`).

Every failure goes through the trace-level minimiser (`shrink.py`); only `fuzz`
also runs Hypothesis's own shrinker first, which is thorough but can take
minutes on a stateful test whose steps each run two KV-cache managers.
gpu:  the CuPy backend; no deadline (first kernel launches compile).

A campaign's examples depend on its seed alone: `seeded` keeps the example
database that Hypothesis's `@seed` would switch off, and `only_the_seed` stops
Hypothesis from mixing in constants collected from whatever modules the
process happened to import (which made CI runs differ from local ones).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.internal.conjecture import providers

SUPPRESS = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]


@dataclass(frozen=True)
class Profile:
    name: str
    max_examples: int
    steps: int
    derandomize: bool
    backend: str
    doc: str
    hypothesis_shrink: bool  # else only the fast trace-level minimiser (shrink.py) runs


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("dev", 50, 30, False, "numpy", "quick local runs", False),
    Profile("ci", 60, 40, True, "numpy", "derandomized and bounded, no database", False),
    Profile("fuzz", 100_000, 60, False, "numpy", "long campaigns", True),
    Profile("gpu", 40, 40, False, "cupy", "CuPy backend, no deadline", False),
)}


def hypothesis_settings(profile: Profile, max_examples: int | None = None,
                        steps: int | None = None, database: object = None) -> settings:
    return settings(
        max_examples=max_examples or profile.max_examples,
        stateful_step_count=steps or profile.steps,
        derandomize=profile.derandomize,
        deadline=None,
        database=database,  # type: ignore[arg-type]
        suppress_health_check=SUPPRESS,
        report_multiple_bugs=False,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
        + ([Phase.shrink] if profile.hypothesis_shrink else []),
        print_blob=False,
    )


def seeded(test: Any, seed: int) -> Any:
    """Draw `test`'s examples from `seed` and still save failures to its database.

    Hypothesis's public `@seed` also switches the database off (it treats a seeded
    run as a replay), but a campaign needs both: the same examples for the same seed
    on a fresh database, and failures pooled for the other workers. So this sets only
    the seed attribute that `@seed` sets; tests/lockstep/test_databases.py fails if a
    Hypothesis release changes that.
    """
    test._hypothesis_internal_use_seed = seed
    return test


@contextmanager
def only_the_seed() -> Iterator[None]:
    """Generate from the seed alone: no constants harvested from loaded modules.

    Hypothesis (6.13x on) sometimes draws an integer from the constants found in
    every "local" module in `sys.modules`, so the same seed gave different examples
    depending on which modules earlier tests had imported. The pool is empty while
    the campaign runs and restored afterwards; a Hypothesis without the harvest
    needs nothing.
    """
    harvest = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if harvest is None or cache is None:
        yield
        return
    empty = type(harvest())  # the pool's own class, constructed empty
    providers._get_local_constants = empty
    cache.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = harvest
        cache.cache.clear()
