"""Bounded model checking: the unsafe pocket's counterexample, decoded and replayed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpocket.model.state import Layout
from kvpocket.verify.bmc import api_instances, bmc, build_template
from kvpocket.verify.lockstep import Divergence, Lockstep
from kvpocket.verify.prove import (
    DEFAULT_MATRIX,
    PARK_DEPTH,
    PARK_PREFIX,
    PROVE_CONFIGS,
    write_bmc_trace,
)
from kvpocket.verify.replay import _ForcedSlots, replay
from kvpocket.verify.trace import TraceStep, read_trace, replay_on_model

# The first five steps of the migration-during-park scenario: a page is parked.
PREFIX = list(PARK_PREFIX)


def _lay(policy: str) -> Layout:
    return Layout(PROVE_CONFIGS["gpu-host"].config.with_pocket(True, policy))


def test_api_alphabet_is_enumerated_from_the_config() -> None:
    cfg = PROVE_CONFIGS["gpu-host-2seq"].config
    names = [i.name for i in api_instances(cfg)]
    assert names.count("resize") == 2 and names.count("close") == 2
    assert names.count("pressure") == 4 and names.count("advance") == 3
    # `close` is explored (a UsageError inside a `when` body is negated, not fatal).
    tpl = build_template(_lay("unsafe"), "api")
    assert "close" in [a.name for a in tpl.actions]


def test_unsafe_counterexample_decodes_and_replays(tmp_path: Path) -> None:
    lay = _lay("unsafe")
    r = bmc(lay, "api", PARK_DEPTH, prefix=PREFIX)
    assert r.status == "violated", r
    assert "popped_slots_valid" in r.broken
    assert len(r.steps) == 7 and r.steps[:5] == [
        TraceStep(s.action, s.params, "api", s.choices) for s in r.steps[:5]]
    assert [s.action for s in r.steps[5:]] == ["pressure", "resize"]
    assert ("pocket", 0) in r.steps[6].choices  # the pop is a model choice in the trace
    path = write_bmc_trace(tmp_path / "bmc.jsonl", lay.cfg, r)
    trace = read_trace(path)
    assert trace.source == "bmc" and trace.extra["layer"] == "api"
    step, broken = replay_on_model(trace)
    assert step == 6 and "popped_slots_valid" in broken
    # Implementation and model in lockstep: the model's invariant fires at the pop.
    res = replay(trace)
    assert not res.ok and res.failed_step == 6, res
    # The implementation itself aliases a slot after the same calls.
    ls = Lockstep(trace.config, eager=False)
    default = ls.impl.slot_policy
    with pytest.raises(Divergence):
        for s in trace.steps:
            forced = [int(v) for k, v in s.choices if k == "slot"]
            ls.impl.slot_policy = _ForcedSlots(forced, default) if forced else default
            ls.step(s.action, s.params)
    problems = ls.impl.check_invariants()
    assert any("slot" in p for p in problems), problems


@pytest.mark.parametrize("policy", ["revalidate", "pin"])
def test_safe_policies_are_clean_after_the_park(policy: str) -> None:
    # After the park and a GPU pressure step (it migrates the parked page where the
    # policy lets it), no next API step breaks an invariant.
    pressure = TraceStep("pressure", {"level": 0, "pool_group": 0, "slots": 1})
    r = bmc(_lay(policy), "api", 1, prefix=[*PREFIX, pressure])
    assert r.status == "proved" and r.steps == [], r


@pytest.mark.parametrize("policy", ["revalidate", "pin"])
def test_page_level_bmc_is_clean(policy: str) -> None:
    r = bmc(Layout(PROVE_CONFIGS["gpu"].config.with_pocket(True, policy)), "page", 3)
    assert r.status == "proved" and r.depth == 3, r


def test_default_matrix_covers_levels_sequences_and_both_bmc_layers() -> None:
    cfgs = [PROVE_CONFIGS[n] for n in DEFAULT_MATRIX]
    assert {c.config.num_levels for c in cfgs} == {1, 2, 3}
    assert {c.config.num_sequences for c in cfgs} == {1, 2}
    assert any(c.page_bmc for c in cfgs) and any(c.park_bmc for c in cfgs)
    # The park prefix is the one the unsafe counterexample above extends.
    assert all(c.config.max_blocks * c.config.tokens_per_block >= 6 for c in cfgs if c.park_bmc)
