"""Bounded model checking, both engines: the unsafe pocket's counterexample, decoded and
replayed; the safe policies clean; the explicit engine agreeing with the symbolic one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from kvpocket.model import api
from kvpocket.model.config import SeqStatus
from kvpocket.model.executor import Executor
from kvpocket.model.invariants import Invariant
from kvpocket.model.machine import Model
from kvpocket.model.overrides import overriding
from kvpocket.model.state import Layout, State
from kvpocket.verify.conformance.lockstep import Divergence, Lockstep
from kvpocket.verify.conformance.replay import _ForcedSlots, replay
from kvpocket.verify.proofs.bounded import BmcResult, api_instances, properties
from kvpocket.verify.proofs.explicit_bmc import GUARD_BROKEN, explicit_bmc
from kvpocket.verify.proofs.prove import (
    DEFAULT_MATRIX,
    PARK_DEPTH,
    PARK_PREFIX,
    PROVE_CONFIGS,
    UNSAFE_DEPTH,
    write_bmc_trace,
)
from kvpocket.verify.proofs.symbolic_bmc import bmc, unroll_step
from kvpocket.verify.quality.seeded import MUTANTS
from kvpocket.verify.traces.trace import TraceStep, read_trace, replay_on_model, run_api_step

Engine = Callable[..., BmcResult]
ENGINES: dict[str, Engine] = {"explicit": explicit_bmc, "symbolic": bmc}

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


# From Init the symbolic engine refutes depth 6 and finds depth 7 in Z3 (about three CPU
# minutes together): the `deep` tier. CI keeps what it shows in three cheaper checks: the
# explicit engine from Init (this test), the symbolic engine from the park prefix (below)
# and the symbolic engine refuting every depth from Init under the safe policies.
@pytest.mark.parametrize("engine", [
    pytest.param(name, marks=[pytest.mark.deep] if name == "symbolic" else [])
    for name in ENGINES])
@pytest.mark.slow
def test_unsafe_counterexample_from_init_at_its_minimal_depth(tmp_path: Path,
                                                             engine: str) -> None:
    # Every depth below 7 is refuted first, so the trace found is a shortest one.
    r = ENGINES[engine](_lay("unsafe"), "api", UNSAFE_DEPTH)
    assert r.status == "violated" and len(r.steps) == UNSAFE_DEPTH == 7, r
    assert r.engine == engine
    # evict_parked=drop (the default): the parked page's slot was released, so the pop
    # locks a page with no slot at all (under migrate it takes a host slot id as a GPU one:
    # slot_owned_once breaks instead).
    assert {"popped_slots_valid", "locked_at_gpu"} <= set(r.broken)
    actions = [s.action for s in r.steps]
    assert actions[0] == "create" and actions[-2:] == ["pressure", "resize"]
    assert actions.count("resize") == 3 and "stop_committing" in actions
    assert ("pocket", 0) in r.steps[-1].choices  # the pop is a model choice in the trace
    _assert_replays(tmp_path, r)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.slow
def test_unsafe_counterexample_from_the_park_prefix(tmp_path: Path, engine: str) -> None:
    r = ENGINES[engine](_lay("unsafe"), "api", PARK_DEPTH, prefix=PREFIX)
    assert r.status == "violated", r
    assert "popped_slots_valid" in r.broken
    assert len(r.steps) == 7 and r.steps[:5] == [
        TraceStep(s.action, s.params, "api", s.choices) for s in r.steps[:5]]
    assert [s.action for s in r.steps[5:]] == ["pressure", "resize"]
    _assert_replays(tmp_path, r)


@pytest.mark.parametrize("policy", ["revalidate", "pin"])
@pytest.mark.slow
def test_safe_policies_are_clean_from_init(policy: str) -> None:
    r = bmc(_lay(policy), "api", 4)
    assert r.status == "proved" and r.depth == 4, r
    # The explicit engine goes to the unsafe counterexample's depth, every invariant.
    r = explicit_bmc(_lay(policy), "api", UNSAFE_DEPTH)
    assert r.status == "proved" and r.depth == UNSAFE_DEPTH and r.states > 1000, r


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("policy", ["revalidate", "pin"])
@pytest.mark.slow
def test_safe_policies_are_clean_after_the_park(policy: str, engine: str) -> None:
    # After the park and a GPU pressure step (it migrates the parked page where the
    # policy lets it), no next API step breaks an invariant.
    pressure = TraceStep("pressure", {"level": 0, "pool_group": 0, "slots": 1})
    r = ENGINES[engine](_lay(policy), "api", 1, prefix=[*PREFIX, pressure])
    assert r.status == "proved" and r.steps == [], r


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("policy", ["revalidate", "pin"])
@pytest.mark.slow
def test_page_level_bmc_is_clean(policy: str, engine: str) -> None:
    r = ENGINES[engine](Layout(PROVE_CONFIGS["gpu"].config.with_pocket(True, policy)),
                        "page", 3)
    assert r.status == "proved" and r.depth == 3, r


# ---- the explicit engine against the symbolic one -----------------------------------------
_PAGE_MUTANTS = [m for m in MUTANTS.values() if m.layer == "model" and m.actions]


# Found by page-level BMC within 4 steps; the others need longer runs (induction finds them).
_FOUND_AT_PAGE_DEPTH_4 = {"model-drop-held"}


@pytest.mark.parametrize("name", [m.name for m in _PAGE_MUTANTS])
@pytest.mark.slow
def test_engines_agree_on_the_spec_mutants_at_the_page_layer(name: str) -> None:
    # A wrong spec (a label override) is a different transition system: both engines must
    # give the same verdict, at the same depth, asking the same properties.
    # Depth 4 where the mutant breaks something; the others agree on "proved" at depth 3
    # (at 4 the explicit engine alone takes 13 s a mutant, and the verdict is the same).
    m = MUTANTS[name]
    found = name in _FOUND_AT_PAGE_DEPTH_4
    depth = 4 if found else 3
    lay = Layout(PROVE_CONFIGS["gpu-host"].config.with_pocket(True, m.policy))
    with overriding(m.overrides):
        sym = bmc(lay, "page", depth)
        exp = explicit_bmc(lay, "page", depth, props=properties("page"))
    assert (exp.status, len(exp.steps)) == (sym.status, len(sym.steps)), (exp, sym)
    assert exp.status == ("violated" if found else "proved"), exp
    if exp.status == "violated":  # shortest traces may differ, so may what they break
        assert exp.broken and sym.broken, (exp, sym)


def _broken_suspend(ex: Executor, seq: int) -> None:
    """A wrong API program: suspend completes a migration that was never begun."""
    ex.do("migrate_complete", page=0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.slow
def test_a_page_guard_failing_inside_an_api_action_is_a_counterexample(
        monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    monkeypatch.setitem(api.API, "suspend", replace(api.API["suspend"], program=_broken_suspend))
    r = ENGINES[engine](_lay("revalidate"), "api", 3)
    assert r.status == "violated" and r.steps[-1].action == "suspend", r
    assert any("guard" in b for b in r.broken), r.broken
    if engine == "explicit":
        assert r.broken == [GUARD_BROKEN]


def test_explicit_engine_checks_the_api_scope_invariants_too() -> None:
    # The window off by one keeps every step-scope invariant: only `window_is_mapped`
    # (API scope) sees it, which the explicit engine checks and the symbolic one does not.
    m = MUTANTS["model-window-off-by-one"]
    with overriding(m.overrides):
        r = explicit_bmc(_lay(m.policy), "api", 4)
        narrow = explicit_bmc(_lay(m.policy), "api", 4, props=properties("api"))
    assert r.status == "violated" and "window_is_mapped" in r.broken, r
    assert narrow.status == "proved", narrow


def _stand_in(name: str, broken_when: Callable[[Layout, State], bool]) -> Invariant:
    return Invariant(name, "a stand-in property", "api",
                     lambda ops, lay, s: not broken_when(lay, s))


def test_explicit_engine_explores_token_content_when_asked() -> None:
    lay = _lay("revalidate")
    # Committed pages: only a `commit` with token content makes one.
    committed = _stand_in("nothing_committed", lambda lay, s: any(
        bool(s.alive[p]) and bool(s.committed[p]) for p in range(lay.pages)))
    assert explicit_bmc(lay, "api", 5, props=[committed]).status == "proved"
    r = explicit_bmc(lay, "api", 5, props=[committed], content=True)
    assert r.status == "violated" and r.steps[-1].action == "commit", r
    # Prefix reuse: after a block of A was committed and its sequence closed, the only
    # next step that brings back committed tokens is `create` with a prompt starting A.
    t = lay.cfg.tokens_per_block
    closed = [TraceStep("create", {"seq": 0, "prompt": []}), TraceStep("resume", {"seq": 0}),
              TraceStep("resize", {"seq": 0, "capacity": t, "history": 0}),
              TraceStep("commit", {"seq": 0, "tokens": [0] * t}), TraceStep("close", {"seq": 0})]
    reused = _stand_in("no_prefix_reuse", lambda lay, s: any(
        int(s.committed_tokens[q]) > 0 and int(s.seq_status[q]) == int(SeqStatus.SUSPENDED)
        for q in range(lay.seqs)))
    assert explicit_bmc(lay, "api", 1, prefix=closed, props=[reused]).status == "proved"
    r = explicit_bmc(lay, "api", 1, prefix=closed, props=[reused], content=True)
    assert r.status == "violated" and len(r.steps) == len(closed) + 1, r
    assert r.steps[-1].action == "create" and r.steps[-1].params["prompt"][:t] == [0] * t
    # The trace, token content and all, replays on the model to a state that breaks it.
    m = Model(lay.cfg)
    for step in r.steps:
        run_api_step(m, step)
    assert not reused.predicate(m.ops, lay, m.state)


def test_explicit_engine_stops_as_unknown_past_its_state_budget() -> None:
    r = explicit_bmc(_lay("revalidate"), "api", UNSAFE_DEPTH, max_states=100)
    assert r.status == "unknown" and "more than 100 states" in r.detail, r
    assert r.depth < UNSAFE_DEPTH


def test_explicit_engine_says_when_it_has_seen_every_reachable_state() -> None:
    # No pocket, one slot, one block: few states, so a deep search exhausts them; the
    # result then holds for every depth, and says so.
    cfg = PROVE_CONFIGS["gpu"].config
    tiny = replace(cfg, slots_per_level=(1,), max_blocks=1, max_pages=1).with_pocket(False)
    r = explicit_bmc(Layout(tiny), "api", 30)
    assert r.status == "proved" and "every reachable state seen" in r.detail, r


def test_symmetry_reduction_offers_only_the_lowest_of_interchangeable_candidates() -> None:
    offered: list[tuple[str, int]] = []

    class Spy:
        def choose(self, kind: str, candidates: Sequence[int], labels: Sequence[object]) -> int:
            offered.append((kind, len(candidates)))
            return candidates[0]

    cfg = _lay("revalidate").cfg
    for reduce in (False, True):
        offered.clear()
        m = Model(cfg, chooser=Spy(), reduce_symmetry=reduce)
        m.create(0)
        m.resume(0)
        assert m.resize(0, 2, 0)
        # Init: every GPU slot is free and idle, every page record dead: all twins.
        widths = dict(offered)
        if reduce:
            assert widths == {"slot": 1, "page": 1}, offered
        else:
            assert widths["slot"] == cfg.slots_per_level[0] and widths["page"] > 1, offered


def test_default_matrix_covers_levels_sequences_and_both_bmc_layers() -> None:
    cfgs = [PROVE_CONFIGS[n] for n in DEFAULT_MATRIX]
    assert {c.config.num_levels for c in cfgs} == {1, 2, 3}
    assert {c.config.num_sequences for c in cfgs} == {1, 2}
    assert any(c.page_bmc for c in cfgs) and any(c.api_bmc for c in cfgs)
    # The unsafe counterexample above (its pop resizes to 6 tokens) fits a configuration
    # the API-level BMC of the matrix covers.
    assert any(c.config.max_blocks * c.config.tokens_per_block >= 6 for c in cfgs if c.api_bmc)


def test_values_too_wide_for_the_bit_vectors_stop_the_search_as_unknown(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import kvpocket.verify.proofs.symbolic_bmc as bmc_module

    # 4-bit integers (3 for the values, with a margin) cannot hold capacity 6: the search
    # stops with a reason after the first step instead of letting the arithmetic wrap.
    monkeypatch.setattr(bmc_module, "INT_BITS", 4)
    r = bmc(_lay("revalidate"), "api", 3)
    assert r.status == "unknown" and r.depth == 0, r
    assert "do not fit 4-bit integers" in r.detail and "--depth" in r.detail
    monkeypatch.setattr(bmc_module, "INT_BITS", 12)
    assert bmc(_lay("revalidate"), "api", 3).status == "proved"



def test_a_counterexample_never_replaces_an_earlier_one(tmp_path: Path) -> None:
    from kvpocket.verify.proofs.prove import counterexample_path

    first = counterexample_path(tmp_path, "gpu-host", "unsafe", "api")
    first.write_text("the first run's counterexample\n")
    second = counterexample_path(tmp_path, "gpu-host", "unsafe", "api")
    assert second != first and second.name == "bmc-gpu-host-unsafe-api-2.jsonl"
    assert first.read_text() == "the first run's counterexample\n"
