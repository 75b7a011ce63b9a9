"""SGLang's real memory cache (UnifiedRadixCache with FULL and SWA components, the SWA
allocator, ReqToTokenPool; for an all-SWA model PureSWARadixCache over the one-pool
PureSWATokenToKVPoolAllocator) under the target campaign. Skipped (with the reason) where
SGLang is not installed; `scripts/sglang.sh --tests` runs them against the pinned release."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpocket.verify.targets.base import CheckFailure, TargetUnavailable
from kvpocket.verify.targets.campaign import known_bug, run_campaign, run_ops
from kvpocket.verify.targets.sglang import (
    BUG_PURE_RECACHE,
    BUG_PURE_TAIL,
    HYBRID_GROUPS,
    PRESETS,
    PURE_RARE_STATES,
    RARE_PURE_FINISH_AFTER_WINDOW,
    RARE_PURE_RETRACT_SHIELDED,
    RARE_STATES,
    RARE_SWA_ONLY_EVICTION,
    RARE_TOMBSTONE_INSERT,
    SglangTarget,
    api,
    sglang_available,
)
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


HYBRID = [name for name, cfg in PRESETS.items() if cfg.groups == HYBRID_GROUPS]
ALL_SWA = ["swa", "swa-prefill-aware"]  # the all-SWA presets the pinned release builds


@pytest.mark.parametrize("preset", HYBRID)
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


# -- all-SWA models (every layer sliding-window): PureSWARadixCache --------------------


def test_the_default_preset_is_still_hybrid() -> None:
    assert next(iter(PRESETS)) == "hybrid"
    assert [n for n in PRESETS if n.startswith("swa")] == ["swa", "swa-paged",
                                                           "swa-prefill-aware"]


def test_all_swa_presets_build_the_releases_own_pure_swa_cache() -> None:
    inst = SglangTarget().build(PRESETS["swa"])
    a = api()
    assert type(inst.tree) is a.pure_tree.PureSWARadixCache
    assert type(inst.alloc) is a.swa_alloc.PureSWATokenToKVPoolAllocator
    assert inst.alloc.full_attn_allocator is inst.alloc.swa_attn_allocator
    assert int(inst.alloc.swa_available_size()) == inst.swa_size == 16
    assert inst.full_size == 0


def test_a_paged_all_swa_preset_is_refused_in_one_line() -> None:
    # every release so far asserts page_size == 1 in PureSWATokenToKVPoolAllocator
    with pytest.raises(TargetUnavailable, match="takes page size 1 only") as info:
        SglangTarget().build(PRESETS["swa-paged"])
    assert "\n" not in str(info.value) and "swa-paged" in str(info.value)


def test_all_swa_rare_states_are_no_tombstone_states() -> None:
    target = SglangTarget()
    for name in ALL_SWA:
        states = target.rare_states(PRESETS[name])
        assert RARE_TOMBSTONE_INSERT not in states and RARE_SWA_ONLY_EVICTION not in states
        assert RARE_PURE_FINISH_AFTER_WINDOW in states
    assert RARE_PURE_RETRACT_SHIELDED in target.rare_states(PRESETS["swa-prefill-aware"])
    assert target.rare_states(PRESETS["swa"]) == PURE_RARE_STATES
    assert target.rare_states(PRESETS["hybrid"]) == RARE_STATES


@pytest.mark.parametrize("preset", ALL_SWA)
def test_all_swa_short_workload_passes_with_known_bugs_avoided(preset: str) -> None:
    counts = run_ops(SglangTarget(avoid_known=True), PRESETS[preset], SHORT)
    assert counts.get("decode freed out-of-window SWA slots", 0) > 0
    assert counts.get("prefix_hit", 0) > 0 and counts.get("sanity_check", 0) > 0
    assert counts.get("eviction from the all-SWA tree", 0) > 0


@pytest.mark.parametrize("preset", ALL_SWA)
def test_all_swa_small_campaign_is_clean(preset: str) -> None:
    # `swa` past the pinned release's known bug (below); `swa-prefill-aware` as it is
    target = SglangTarget(avoid_known=preset == "swa")
    report = run_campaign(target, PRESETS[preset], examples=200, campaign_seed=0)
    assert report.failure is None, report.failure
    assert report.rare_states["decode freed out-of-window SWA slots"] > 0
    assert report.rare_states[RARE_PURE_FINISH_AFTER_WINDOW] > 0
    assert report.rare_states["prefix hit on a request finished after out-of-window frees"] > 0


# The shrunk trace of sglang#31486 (tests/targets/engine_cases): a 1-token prompt decoded
# past the window, finished: the insert takes its whole row, the slot its decode freed
# out of the window included.
RECACHE = [Op("arrive", (0, 0, 0, 0, 0)), Op("schedule", (0, 1, 7))]


def test_the_default_campaign_finds_31486_on_the_pinned_release(tmp_path: Path) -> None:
    report = run_campaign(SglangTarget(), PRESETS["swa"], examples=3000, campaign_seed=0,
                          out_dir=str(tmp_path))
    assert report.failure is not None and report.failure.check == "pool"
    assert "not its size 16" in report.failure.message
    assert report.examples < 500 and Path(report.failure.reproducer).exists()
    assert known_bug(SglangTarget(), PRESETS["swa"], report.failure.ops) \
        == f"{BUG_PURE_RECACHE}: {SglangTarget().known_bugs()[BUG_PURE_RECACHE]}"


def test_31486_is_the_evict_floor_zero_release() -> None:
    with pytest.raises(CheckFailure, match="SWA pool: available 10 \\+ evictable 7"):
        run_ops(SglangTarget(), PRESETS["swa"], RECACHE)
    # the same request, as a prefill-aware model's (its evict floor set), is released right
    run_ops(SglangTarget(), PRESETS["swa-prefill-aware"], RECACHE)
    assert BUG_PURE_TAIL not in SglangTarget().known_bugs()  # fixed in 0.5.20


def planted_recache() -> SglangTarget:
    import sglang_planted

    return SglangTarget(on_build=sglang_planted.planted_tree(
        sglang_planted.WINDOW_EVICTED_RECACHED, "checkpoint"))


def test_planted_window_evicted_recache_found_by_the_default_campaign(tmp_path: Path) -> None:
    # #31486's shape on the prefill-aware preset, where the pinned release is right: the
    # release's insert drops the evict floor's key limit.
    report = run_campaign(planted_recache(), PRESETS["swa-prefill-aware"], examples=3000,
                          campaign_seed=0, out_dir=str(tmp_path))
    assert report.failure is not None
    assert report.failure.check in ("pool", "ownership")
    assert report.examples < 500 and Path(report.failure.reproducer).exists()
    run_ops(SglangTarget(), PRESETS["swa-prefill-aware"], report.failure.ops)  # unplanted: passes
