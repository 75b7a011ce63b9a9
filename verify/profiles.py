"""Hypothesis settings profiles for the lockstep machine.

dev:  quick local runs.
ci:   derandomized and bounded: the same examples every run, no database.
fuzz: long campaigns (use with `kvpocket fuzz --minutes`).

Every failure goes through the trace-level minimiser (`shrink.py`); only `fuzz`
also runs Hypothesis's own shrinker first, which is thorough but can take
minutes on a stateful test whose steps each run two KV-cache managers.
gpu:  the CuPy backend; no deadline (first kernel launches compile).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, settings

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
