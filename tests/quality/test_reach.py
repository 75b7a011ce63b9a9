"""Bugs the preset matrix could not reach (`kvpocket.verify.quality.reach`): one needing
two sliding windows, one needing sinks after a suspend, one in the event-log writer. The
default campaign, on its example budget, must kill each within half of that budget; each
bug's shortest scenario is caught by the lockstep, and the unpatched implementation
passes it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvpocket.impl import kvcache
from kvpocket.impl.counters import COUNTER_NAMES
from kvpocket.model.config import KVConfig, LifeCycle
from kvpocket.verify import patching
from kvpocket.verify.conformance.lockstep import Divergence, Lockstep
from kvpocket.verify.conformance.matrix import DEFAULT_EXAMPLES
from kvpocket.verify.conformance.replay import replay
from kvpocket.verify.conformance.views import counter_differences
from kvpocket.verify.presets import PRESETS
from kvpocket.verify.quality.reach import REACH_BUGS
from kvpocket.verify.quality.seeded import CONFIGS, default_campaign
from kvpocket.verify.traces.trace import Trace, read_trace

Steps = list[tuple[str, dict[str, Any]]]


def without_bugs(trace: Trace) -> Trace:
    """The trace as the fixed code replays it: its header no longer asks for the bugs."""
    return replace(trace, extra={k: v for k, v in trace.extra.items() if k != patching.TRACE_KEY})


def _decode(h_from: int, h_to: int) -> Steps:
    return [("resize", {"seq": 0, "capacity": h + 1, "history": h}) for h in range(h_from, h_to)]


SEQ0_BLOCK0: list[int] = []  # stands for sequence 0's first committed block (see `_run`)
OPEN: Steps = [("create", {"seq": 0, "prompt": []}), ("resume", {"seq": 0}),
               ("stop_committing", {"seq": 0})]
TWO_WINDOWS = KVConfig(tokens_per_block=2, life_cycles=(
    LifeCycle("near", window=2), LifeCycle("far", window=7)), slots_per_level=(12, 6))

# (bug, configuration, steps: the last one is where the lockstep must stop)
SCENARIOS: dict[str, tuple[KVConfig, Steps]] = {
    "two-windows-fast-path": (TWO_WINDOWS, OPEN + _decode(0, 10)),
    "resume-forgets-sinks": (PRESETS["sinks"].config, OPEN + _decode(0, 8) + [
        ("suspend", {"seq": 0}), ("resume", {"seq": 0})]),
    "eventlog-failed-resize-true": (PRESETS["tiny"].config, [
        *OPEN, ("resize", {"seq": 0, "capacity": 20, "history": 0})]),
    # committing kept on: block 0 leaves the window at history 4 and stays held
    "block-entries-stale-edge": (PRESETS["tiny"].config, [
        ("create", {"seq": 0, "prompt": []}), ("resume", {"seq": 0}), *_decode(0, 5)]),
    # the last pressure drops sequence 2's committed page after a nested attempt below
    # (the disk, full of HELD pages) was rolled back
    "rollback-keeps-counts": (PRESETS["three-level"].config, [
        *(step for q, blocks in ((0, 2), (1, 2)) for step in (
            ("create", {"seq": q, "prompt": []}), ("resume", {"seq": q}),
            ("resize", {"seq": q, "capacity": 2 * blocks, "history": 0}),
            ("suspend", {"seq": q}))),
        ("create", {"seq": 2, "prompt": []}), ("resume", {"seq": 2}),
        ("resize", {"seq": 2, "capacity": 2, "history": 0}), ("commit", {"seq": 2, "n": 2}),
        ("close", {"seq": 2}), ("pressure", {"level": 0, "pool_group": 0, "slots": 6})]),
    # block 0 committed, out of the window, dropped (GPU, then host); sequence 1 commits
    # the same tokens onto its node (the tokens are sequence 0's, filled in by `_run`)
    "recommit-node-unreferenced": (PRESETS["tiny"].config, [
        ("create", {"seq": 0, "prompt": []}), ("resume", {"seq": 0}),
        ("resize", {"seq": 0, "capacity": 2, "history": 0}), ("commit", {"seq": 0, "n": 2}),
        ("resize", {"seq": 0, "capacity": 5, "history": 4}),
        ("pressure", {"level": 0, "pool_group": 0, "slots": 2}),
        ("pressure", {"level": 1, "pool_group": 0, "slots": 4}),
        ("create", {"seq": 1, "prompt": SEQ0_BLOCK0}), ("resume", {"seq": 1}),
        ("resize", {"seq": 1, "capacity": 2, "history": 0}), ("commit", {"seq": 1, "n": 2})]),
    # sequence 0's pages pushed to host, sequence 1 fills both GPU pool groups and suspends
    "load-back-one-pool-group": (PRESETS["split-pools"].config, [
        ("create", {"seq": 0, "prompt": []}), ("resume", {"seq": 0}),
        ("resize", {"seq": 0, "capacity": 2, "history": 0}), ("suspend", {"seq": 0}),
        ("pressure", {"level": 0, "pool_group": 0, "slots": 4}),
        ("pressure", {"level": 0, "pool_group": 1, "slots": 4}),
        ("create", {"seq": 1, "prompt": []}), ("resume", {"seq": 1}),
        ("resize", {"seq": 1, "capacity": 8, "history": 0}), ("suspend", {"seq": 1}),
        ("resume", {"seq": 0})]),
    # sequence 1's committed block stays queued (live); sequence 0's page leaves and
    # re-enters the GPU queue until the heap's garbage outgrows its bound (68 rounds)
    "heap-compaction-drops-tickets": (PRESETS["tiny"].config, [
        ("create", {"seq": 1, "prompt": []}), ("resume", {"seq": 1}),
        ("resize", {"seq": 1, "capacity": 2, "history": 0}), ("commit", {"seq": 1, "n": 2}),
        ("close", {"seq": 1}),
        ("create", {"seq": 0, "prompt": []}), ("resume", {"seq": 0}),
        ("resize", {"seq": 0, "capacity": 2, "history": 0}),
        *(step for _ in range(70) for step in (("suspend", {"seq": 0}),
                                               ("resume", {"seq": 0})))]),
    # the pocket fills (two blocks leave at once), GPU pressure drops its oldest page,
    # then stop_committing again on the stopped sequence
    "restop-full-pocket-forgets-slotless": (CONFIGS["wide-pocket"], [
        *OPEN, *_decode(0, 4), ("resize", {"seq": 0, "capacity": 10, "history": 3}),
        ("resize", {"seq": 0, "capacity": 10, "history": 9}),
        ("pressure", {"level": 0, "pool_group": 0, "slots": 7}),
        ("stop_committing", {"seq": 0})]),
}


def _run(cfg: KVConfig, steps: Steps, check_event_log: bool) -> int | None:
    """The step at which the lockstep stops, or None."""
    ls = Lockstep(cfg, check_event_log=check_event_log)
    try:
        for action, params in steps:
            if params.get("prompt") is SEQ0_BLOCK0:
                t = cfg.tokens_per_block
                params = {**params, "prompt": list(ls.model.state.tokens[0][:t])}
            ls.step(action, params)
    except Divergence as exc:
        return exc.step
    return None


@pytest.mark.parametrize("name", list(REACH_BUGS))
def test_the_shortest_scenario_is_caught_and_clean_code_passes(name: str) -> None:
    cfg, steps = SCENARIOS[name]
    assert _run(cfg, steps, check_event_log=True) is None
    with REACH_BUGS[name].apply():
        assert _run(cfg, steps, check_event_log=True) is not None
        caught = _run(cfg, steps, check_event_log=True)
    assert caught is not None and caught <= len(steps) - 1
    assert kvcache.KVCache._resume.__module__ == kvcache.__name__, "the patch is undone"


def test_each_bug_needs_what_the_presets_lacked() -> None:
    """The two-window bug is invisible on every preset's single sliding window, and the
    event-log bug without the log checked."""
    cfg, steps = SCENARIOS["eventlog-failed-resize-true"]
    with REACH_BUGS["eventlog-failed-resize-true"].apply():
        assert _run(cfg, steps, check_event_log=False) is None
    assert all(sum(lc.is_swa for lc in p.config.life_cycles) <= 1 for p in PRESETS.values())
    one_window = KVConfig(tokens_per_block=2, life_cycles=(LifeCycle("near", window=2),
                                                           LifeCycle("full")),
                          slots_per_level=(12, 6))
    with REACH_BUGS["two-windows-fast-path"].apply():
        assert _run(one_window, OPEN + _decode(0, 10), check_event_log=False) is None


@pytest.mark.quality
@pytest.mark.slow
@pytest.mark.parametrize("name", list(REACH_BUGS))
def test_the_default_campaign_kills_it_within_half_its_budget(name: str,
                                                               tmp_path: Path) -> None:
    with REACH_BUGS[name].apply():
        # Half the default budget: the plan does not depend on the budget, so a kill within
        # it is a kill within half of the default campaign's work.
        c = default_campaign(60.0, out_dir=str(tmp_path), examples=DEFAULT_EXAMPLES // 2)
        assert c.killed, f"{name} survived: {c.detail}"
        assert c.examples <= DEFAULT_EXAMPLES // 2, f"{name}: killed at example {c.examples}"
        assert c.trace is not None
        trace = read_trace(c.trace)
        assert not replay(trace).ok, "the reproducer reproduces (with the bug applied)"
    assert trace.extra[patching.TRACE_KEY] == [name], "the reproducer names the bug"
    assert replay(without_bugs(trace)).ok, "and passes without it"


def test_each_new_bug_needs_its_rare_path_or_guard_combination() -> None:
    """The heap bug changes nothing while the heap never compacts with live entries (fewer
    rounds), and the guard bug nothing unless the pocket is full (no second stale block)."""
    cfg, steps = SCENARIOS["heap-compaction-drops-tickets"]
    with REACH_BUGS["heap-compaction-drops-tickets"].apply():
        assert _run(cfg, steps[:8 + 2 * 60], check_event_log=False) is None
    cfg, steps = SCENARIOS["restop-full-pocket-forgets-slotless"]
    partly = [x for x in steps if x[1].get("history") != 9]
    with REACH_BUGS["restop-full-pocket-forgets-slotless"].apply():
        assert _run(cfg, partly, check_event_log=False) is None


def test_counter_check_names_what_a_call_did_not_do() -> None:
    """The counters' check: a rolled-back call changes no counter; a call that succeeded
    counts one per choice it made (undone ones not), and its releases balance the slots."""
    zero = dict.fromkeys(COUNTER_NAMES, 0)
    choices = [("evict", 0, 0, 3), ("undone", "evict", 1, 0, 5), ("alloc", 1, 0, 2),
               ("migrate", 3, 0, 1, 2)]
    done = {**zero, "evictions": 1, "alloc_calls": 1, "migrations": 1, "releases": 1}
    assert counter_differences(zero, done, choices, 4, 4) == []
    kept_undone = {**done, "evictions": 2}
    assert any("evictions" in line for line in
               counter_differences(zero, kept_undone, choices, 4, 4))
    assert any("releases" in line for line in counter_differences(zero, done, choices, 4, 3))
    failed = [*choices, ("fail", "OutOfPagesError")]
    assert counter_differences(zero, zero, failed, 4, 4) == []
    assert any("rolled back" in line for line in counter_differences(zero, done, failed, 4, 4))
