"""SGLang's real memory cache (UnifiedRadixCache with FULL and SWA components, the SWA
allocator, ReqToTokenPool) under the target campaign. Skipped (with the reason) where
SGLang is not installed; `scripts/sglang.sh --tests` runs them against the pinned release."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpocket.verify.targets.campaign import run_campaign, run_ops
from kvpocket.verify.targets.sglang import PRESETS, RARE_STATES, SglangTarget, sglang_available
from kvpocket.verify.targets.workload import Op

pytestmark = pytest.mark.skipif(not sglang_available(), reason="SGLang is not installed in "
                                "this interpreter; scripts/sglang.sh --tests runs these "
                                "against the pinned sglang")

# A short fixed workload: two requests sharing a prefix, chunked prefill, decode past the
# window (out-of-window SWA frees), a finish with its cache insert, a hit on it.
SHORT = [Op("arrive", (0, 8, 2, 0)), Op("schedule", (0, 3, 8)), Op("arrive", (0, 8, 3, 0)),
         Op("schedule", (1, 20, 8)), Op("finish", (0,)), Op("arrive", (0, 10, 1, 0)),
         Op("schedule", (1, 4, 8)), Op("preempt", (0,)), Op("schedule", (0, 20, 3)),
         Op("reset", (1,))]


@pytest.mark.parametrize("preset", list(PRESETS))
def test_short_workload_passes_every_check(preset: str) -> None:
    counts = run_ops(SglangTarget(), PRESETS[preset], SHORT)
    assert counts.get("decode", 0) > 0 and counts.get("prefix_hit", 0) > 0
    assert counts.get("decode freed out-of-window SWA slots", 0) > 0
    assert counts.get("sanity_check", 0) > 0


def test_campaign_is_clean_and_reaches_rare_states() -> None:
    report = run_campaign(SglangTarget(), PRESETS["hybrid"], examples=60, campaign_seed=0)
    assert report.failure is None, report.failure
    assert report.coverage_gaps == [], report.coverage_gaps
    assert set(report.rare_states) == set(RARE_STATES)


def planted() -> SglangTarget:
    import sglang_planted

    stale_mapping_allocator = sglang_planted.stale_mapping_allocator

    return SglangTarget(allocator_class=stale_mapping_allocator())


def test_planted_stale_swa_mapping_fails_the_short_workload() -> None:
    with pytest.raises(AssertionError, match=r"ownership|data"):
        run_ops(planted(), PRESETS["hybrid"], SHORT)


def test_planted_stale_swa_mapping_found_by_the_default_campaign(tmp_path: Path) -> None:
    # The default command's plan (seed 0, default steps) stops at its first failure.
    report = run_campaign(planted(), PRESETS["hybrid"], examples=3000, campaign_seed=0,
                          out_dir=str(tmp_path))
    assert report.failure is not None
    assert report.failure.check in ("ownership", "data")
    assert report.examples < 500  # found (and shrunk) early in the 3,000-example plan
    assert Path(report.failure.reproducer).exists()


# A salted request's prompt is cached, then the same prompt arrives without the salt (or
# the same with an adapter, then without it).
NAMESPACE_SHORT = {
    "salt": [Op("arrive", (0, 8, 0, 1)), Op("schedule", (0, 20, 1)), Op("finish", (0,)),
             Op("arrive", (0, 8, 0, 0)), Op("schedule", (0, 20, 1))],
    "adapter": [Op("arrive", (0, 8, 0, 3)), Op("schedule", (0, 20, 1)), Op("finish", (0,)),
                Op("arrive", (0, 8, 0, 0)), Op("schedule", (0, 20, 1))],
}


def namespace_planted(which: str) -> SglangTarget:
    import sglang_planted

    edits = sglang_planted.SALT_DROPPED if which == "salt" else \
        sglang_planted.EXTRA_KEY_DROPPED
    return SglangTarget(on_build=sglang_planted.planted_tree(edits))


def test_a_salted_prompt_is_hit_with_its_salt_only() -> None:
    ops = NAMESPACE_SHORT["salt"]
    same_salt = [*ops[:3], Op("arrive", (0, 8, 0, 1)), ops[4]]
    assert run_ops(SglangTarget(), PRESETS["hybrid"], same_salt).get("prefix_hit", 0) == 1
    assert run_ops(SglangTarget(), PRESETS["hybrid"], ops).get("prefix_hit", 0) == 0


@pytest.mark.parametrize(("which", "check"), [("salt", "isolation failure"),
                                              ("adapter", "data")])
def test_planted_namespace_bug_fails_the_short_workload(which: str, check: str) -> None:
    with pytest.raises(AssertionError, match=check):
        run_ops(namespace_planted(which), PRESETS["hybrid"], NAMESPACE_SHORT[which])


@pytest.mark.parametrize(("which", "check"), [("salt", "isolation failure"),
                                              ("adapter", "data")])
def test_planted_namespace_bug_found_by_the_default_campaign(tmp_path: Path, which: str,
                                                             check: str) -> None:
    report = run_campaign(namespace_planted(which), PRESETS["hybrid"], examples=3000,
                          campaign_seed=0, out_dir=str(tmp_path))
    assert report.failure is not None and report.failure.check == check
    assert Path(report.failure.reproducer).exists()
