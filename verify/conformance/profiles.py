"""The campaign profiles, registered as Hypothesis settings profiles.

dev:  quick local runs.
ci:   derandomized and bounded: the same examples every run, no database.
fuzz: long campaigns (use with `kvpocket fuzz --minutes`).
gpu:  the CuPy backend; no deadline (first kernel launches compile).

`kvpocket fuzz --profile NAME` takes the project's names; Hypothesis knows them as
`kvpocket-NAME` (`settings.get_profile("kvpocket-ci")`, `pytest --hypothesis-profile
kvpocket-ci`), because Hypothesis owns a profile called "ci" that it loads by itself when
a CI variable is set, and registering over it would change every test of a process that
imports kvpocket. Each profile's parent is Hypothesis's "default" profile, so a campaign
on a CI machine runs as it does anywhere else.

Every failure goes through the trace-level minimiser (`shrink.py`); only `fuzz`
also runs Hypothesis's own shrinker first, which is thorough but can take
minutes on a stateful test whose steps each run two KV-cache managers.

A campaign's examples depend on its seed alone: `seeded` keeps the example
database that Hypothesis's `@seed` would switch off, and `only_the_seed` stops
Hypothesis from mixing in constants collected from whatever modules the
process happened to import (which made CI runs differ from local ones). Both use
Hypothesis's private internals (no public API does either), hence the upper bound on
Hypothesis in pyproject.toml and tests/conformance/test_hypothesis_internals.py, which fails
by name when a release moves them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.internal.conjecture import providers

SUPPRESS = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target)
PREFIX = "kvpocket-"  # Hypothesis's name of a profile: PREFIX + the project's name


def _register(name: str, max_examples: int, steps: int, shrink: bool = False,
              derandomize: bool = False) -> None:
    settings.register_profile(
        PREFIX + name, parent=settings.get_profile("default"),
        max_examples=max_examples, stateful_step_count=steps, derandomize=derandomize,
        database=None, deadline=None, suppress_health_check=SUPPRESS,
        report_multiple_bugs=False, print_blob=False,
        phases=NO_SHRINK + ((Phase.shrink,) if shrink else ()))


_register("dev", 50, 30)
_register("ci", 60, 40, derandomize=True)
_register("fuzz", 100_000, 60, shrink=True)
_register("gpu", 40, 40)


@dataclass(frozen=True)
class Profile:
    """A campaign profile: its registered Hypothesis settings, and the backend it runs on
    (the one part of a profile that is not a Hypothesis setting)."""

    name: str
    backend: str

    @property
    def settings(self) -> settings:
        return settings.get_profile(PREFIX + self.name)

    @property
    def max_examples(self) -> int:
        return self.settings.max_examples

    @property
    def derandomize(self) -> bool:
        return self.settings.derandomize


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("dev", "numpy"), Profile("ci", "numpy"), Profile("fuzz", "numpy"),
    Profile("gpu", "cupy"))}


def hypothesis_settings(profile: Profile, max_examples: int | None = None,
                        steps: int | None = None, database: object = None) -> settings:
    """The profile's settings with a campaign's budget and example database."""
    base = profile.settings
    return settings(base, max_examples=max_examples or base.max_examples,
                    stateful_step_count=steps or base.stateful_step_count,
                    database=database)  # type: ignore[arg-type]


def seeded(test: Any, seed: int) -> Any:
    """Draw `test`'s examples from `seed` and still save failures to its database.

    Hypothesis's public `@seed` also switches the database off (it treats a seeded
    run as a replay), but a campaign needs both: the same examples for the same seed
    on a fresh database, and failures pooled for the other workers. So this sets only
    the seed attribute that `@seed` sets; tests/conformance/test_hypothesis_internals.py
    fails if a Hypothesis release changes that.
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
