"""The two private Hypothesis internals a seeded campaign relies on (no public API does
either: verify/conformance/profiles.py) are still where they were. pyproject.toml bounds
Hypothesis below 7; a release inside the bound that moves one fails here, by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hypothesis
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers

from kvpocket.verify.conformance.profiles import PREFIX, PROFILES, hypothesis_settings, seeded

ROOT = Path(__file__).resolve().parents[2]
MOVED = (f"Hypothesis {hypothesis.__version__} moved a private API that "
         "verify/conformance/profiles.py uses")


def _seeded_draws(seed: int) -> list[int]:
    seen: list[int] = []

    @settings(max_examples=20, database=None)
    @given(st.integers(0, 10**9))
    def probe(n: int) -> None:
        seen.append(n)

    seeded(probe, seed)()
    return seen


def test_seed_attribute_is_the_one_at_seed_sets_and_hypothesis_reads() -> None:
    marked = hypothesis.seed(1234)(lambda: None)
    assert getattr(marked, "_hypothesis_internal_use_seed", None) == 1234, MOVED
    assert _seeded_draws(7) == _seeded_draws(7), MOVED + ": a seeded test drew differently"
    assert _seeded_draws(7) != _seeded_draws(8), MOVED + ": the seed is not read"


def test_the_constant_harvest_is_where_only_the_seed_empties_it() -> None:
    assert callable(getattr(providers, "_get_local_constants", None)), MOVED
    assert hasattr(getattr(providers, "CONSTANTS_CACHE", None), "cache"), MOVED


def test_the_installed_hypothesis_is_inside_the_declared_bound() -> None:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if d.startswith("hypothesis")]
    assert spec == "hypothesis>=6.100,<7"
    major, minor = (int(x) for x in hypothesis.__version__.split(".")[:2])
    assert (major, minor) >= (6, 100) and major < 7


def test_profiles_are_registered_with_hypothesis() -> None:
    for name in ("dev", "ci", "fuzz", "gpu"):
        registered = settings.get_profile(PREFIX + name)
        assert PROFILES[name].settings is registered
        assert hypothesis_settings(PROFILES[name], max_examples=3).max_examples == 3
    assert settings.get_profile(PREFIX + "ci").derandomize
    assert not settings.get_profile(PREFIX + "dev").derandomize
    assert settings.get_profile("ci") is not settings.get_profile(PREFIX + "ci")  # Hypothesis's own


def test_the_active_profile_is_the_one_pytest_was_asked_for() -> None:
    """Run by the next test in a pytest of its own (`--hypothesis-profile`); in a plain run,
    the profile Hypothesis chose itself is active."""
    wanted = os.environ.get("KVPOCKET_EXPECT_PROFILE")
    name = settings.get_current_profile_name()
    assert name == (wanted or name)
    if wanted:
        assert settings().max_examples == settings.get_profile(wanted).max_examples


def test_pytest_loads_a_project_profile() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--hypothesis-profile", "kvpocket-ci", f"{Path(__file__)}::"
         "test_the_active_profile_is_the_one_pytest_was_asked_for"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "KVPOCKET_EXPECT_PROFILE": "kvpocket-ci"})
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
