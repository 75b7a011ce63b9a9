"""Bounded model checking: the unsafe pocket's counterexample, decoded and replayed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpocket.model.machine import Model
from kvpocket.model.state import Layout
from kvpocket.verify.conformance.lockstep import Divergence, Lockstep
from kvpocket.verify.conformance.replay import _ForcedSlots, replay
from kvpocket.verify.proofs.bmc import BmcResult, api_instances, bmc, unroll_step
from kvpocket.verify.proofs.prove import (
    DEFAULT_MATRIX,
    PARK_DEPTH,
    PARK_PREFIX,
    PROVE_CONFIGS,
    UNSAFE_DEPTH,
    write_bmc_trace,
)
from kvpocket.verify.traces.trace import TraceStep, read_trace, replay_on_model

# The first five steps of the migration-during-park scenario: a page is parked.
PREFIX = list(PARK_PREFIX)


def _lay(policy: str) -> Layout:
    return Layout(PROVE_CONFIGS["gpu-host"].config.with_pocket(True, policy))


def test_api_alphabet_is_enumerated_from_the_config() -> None:
    cfg = PROVE_CONFIGS["gpu-host-2seq"].config
    names = [i.name for i in api_instances(cfg)]
    assert names.count("resize") == 2 and names.count("close") == 2
    assert names.count("pressure") == 4 and names.count("advance") == 3
    lay = _lay("unsafe")
    # From Init only `create` and the environment can act (the rest folds to disabled) ...
    first = {a.name for a in unroll_step(lay, "api", lay.initial_state(), 0).actions}
    assert "create" in first and not first & {"resume", "resize", "close", "suspend"}
    # ... and once a sequence exists, `close` is explored (a UsageError inside a `when`
    # body is negated into the enabling condition, not fatal).
    m = Model(lay.cfg)
    m.create(0)
    assert "close" in {a.name for a in unroll_step(lay, "api", m.state, 1).actions}


def _assert_replays(tmp_path: Path, r: BmcResult) -> None:
    """The trace BMC wrote breaks the model at its last step and aliases a slot in the
    implementation driven by the same calls and choices."""
    lay = _lay("unsafe")
    path = write_bmc_trace(tmp_path / "bmc.jsonl", lay.cfg, r)
    trace = read_trace(path)
    assert trace.source == "bmc" and trace.extra["layer"] == "api"
    last = len(trace.steps) - 1
    step, broken = replay_on_model(trace)
    assert step == last and "popped_slots_valid" in broken
    # Implementation and model in lockstep: the model's invariant fires at the pop.
    res = replay(trace)
    assert not res.ok and res.failed_step == last, res
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


def test_unsafe_counterexample_from_init_at_its_minimal_depth(tmp_path: Path) -> None:
    # Every depth below 7 is refuted first, so the trace found is a shortest one.
    r = bmc(_lay("unsafe"), "api", UNSAFE_DEPTH, timeout_ms=600_000)
    assert r.status == "violated" and len(r.steps) == UNSAFE_DEPTH == 7, r
    # evict_parked=drop (the default): the parked page's slot was released, so the pop
    # locks a page with no slot at all (under migrate it takes a host slot id as a GPU one:
    # slot_owned_once breaks instead).
    assert {"popped_slots_valid", "locked_at_gpu"} <= set(r.broken)
    actions = [s.action for s in r.steps]
    assert actions[0] == "create" and actions[-2:] == ["pressure", "resize"]
    assert actions.count("resize") == 3 and "stop_committing" in actions
    assert ("pocket", 0) in r.steps[-1].choices  # the pop is a model choice in the trace
    _assert_replays(tmp_path, r)


def test_unsafe_counterexample_from_the_park_prefix(tmp_path: Path) -> None:
    r = bmc(_lay("unsafe"), "api", PARK_DEPTH, prefix=PREFIX)
    assert r.status == "violated", r
    assert "popped_slots_valid" in r.broken
    assert len(r.steps) == 7 and r.steps[:5] == [
        TraceStep(s.action, s.params, "api", s.choices) for s in r.steps[:5]]
    assert [s.action for s in r.steps[5:]] == ["pressure", "resize"]
    _assert_replays(tmp_path, r)


@pytest.mark.parametrize("policy", ["revalidate", "pin"])
def test_safe_policies_are_clean_from_init(policy: str) -> None:
    r = bmc(_lay(policy), "api", 4)
    assert r.status == "proved" and r.depth == 4, r


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
    assert any(c.page_bmc for c in cfgs) and any(c.api_bmc for c in cfgs)
    # The park prefix is the one the unsafe counterexample above extends.
    assert all(c.config.max_blocks * c.config.tokens_per_block >= 6 for c in cfgs if c.api_bmc)


def test_values_too_wide_for_the_bit_vectors_stop_the_search_as_unknown(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import kvpocket.verify.proofs.bmc as bmc_module

    # 4-bit integers (3 for the values, with a margin) cannot hold capacity 6: the search
    # stops with a reason after the first step instead of letting the arithmetic wrap.
    monkeypatch.setattr(bmc_module, "INT_BITS", 4)
    r = bmc(_lay("revalidate"), "api", 3)
    assert r.status == "unknown" and r.depth == 0, r
    assert "do not fit 4-bit integers" in r.detail and "--depth" in r.detail
    monkeypatch.setattr(bmc_module, "INT_BITS", 12)
    assert bmc(_lay("revalidate"), "api", 3).status == "proved"

