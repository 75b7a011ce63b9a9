"""Lockstep machines as plain test classes, so HypoFuzz (and pytest) can collect them.

`pip install hypofuzz && hypothesis fuzz -- tests/conformance/test_hypofuzz_targets.py` runs
them as coverage-guided campaigns; under pytest they run a small derandomized budget.
"""

from __future__ import annotations

from kvpocket.model.config import PocketPolicy
from kvpocket.verify.conformance.profiles import PROFILES, hypothesis_settings
from kvpocket.verify.conformance.stateful import machine_for
from kvpocket.verify.presets import PRESETS

_SMALL = hypothesis_settings(PROFILES["ci"], max_examples=10, steps=30)

TinyRevalidate = machine_for(PRESETS["tiny"].config.with_pocket(True, PocketPolicy.REVALIDATE))
TinyRevalidate.TestCase.settings = _SMALL
TestTinyRevalidate = TinyRevalidate.TestCase

ThreeLevelPin = machine_for(PRESETS["three-level"].config.with_pocket(True, PocketPolicy.PIN))
ThreeLevelPin.TestCase.settings = _SMALL
TestThreeLevelPin = ThreeLevelPin.TestCase
