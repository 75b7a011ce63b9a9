"""The parametric (every-size) proof: it proves the safe policies, finds the unsafe
counterexample, notices weakened guards, and its abstraction over-approximates the model."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from typing import Any

import pytest

from kvpocket.model import Model
from kvpocket.model.config import KVConfig
from kvpocket.model.invariants import INVARIANTS_BY_NAME
from kvpocket.model.logic import CONCRETE
from kvpocket.model.overrides import overriding
from kvpocket.model.pages import PAGE_ACTIONS, STILL_VALID
from kvpocket.model.state import Layout, State
from kvpocket.verify.presets import preset
from kvpocket.verify.proofs import epr
from kvpocket.verify.proofs.parametric import (
    PARAMETRIC_INVARIANTS,
    PROVED,
    VIOLATED,
    check_action,
    check_init,
    holds_concretely,
    prove_parametric,
    run_parametric,
)
from kvpocket.verify.proofs.prove import PROVE_CONFIGS


def _cfg(policy: str, name: str = "gpu-host", **pocket: Any) -> KVConfig:
    return PROVE_CONFIGS[name].config.with_pocket(True, policy, **pocket)


# ---- the proof ------------------------------------------------------------------------------

POCKET_ACTIONS = ("park", "pop", "drain", "evict_begin", "drop_parked", "allocate", "release")


@pytest.mark.parametrize("policy", ["revalidate", "pin"])
@pytest.mark.slow
def test_safe_policies_prove_the_pocket_actions(policy: str) -> None:
    outcomes = prove_parametric(_cfg(policy), POCKET_ACTIONS)
    assert [o.obligation for o in outcomes] == ["init", *(f"consecution:{a}" for a in POCKET_ACTIONS)]
    assert all(o.status == PROVED for o in outcomes), [(o.obligation, o.status, o.detail)
                                                       for o in outcomes]
    # Every pocket-safety invariant is among those proved.
    names = {i.name for i in PARAMETRIC_INVARIANTS if i.safety}
    assert {"popped_slots_valid", "no_unsynced_reuse", "pocket_entries_orphaned",
            "slot_owned_once", "pinned_pockets_stay"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpu", "gpu-host", "gpu-host-disk", "gpu-host-full"])
def test_safe_policies_prove_every_action(name: str) -> None:
    for policy in ("revalidate", "pin"):
        outcomes = prove_parametric(_cfg(policy, name))
        assert len(outcomes) == 1 + len(PAGE_ACTIONS)
        bad = [(o.obligation, o.status, o.detail) for o in outcomes if o.status != PROVED]
        assert not bad, (name, policy, bad)


def test_unsafe_pop_is_a_counterexample_to_induction() -> None:
    out = check_action(_cfg("unsafe"), "pop")
    assert out.status == VIOLATED and out.cti is not None
    assert out.cti.broken == ["popped_slots_valid"]
    text = out.cti.text
    assert text.startswith("counterexample to induction: pop(")
    # Small and readable: the parked page lost its slot (dropped by the cascade).
    assert "slot=-" in text and "pocket lc0[0]=" in text
    assert len(text.splitlines()) < 20


def test_unsafe_pop_with_migrating_victims_is_the_migration_during_park_bug() -> None:
    out = check_action(_cfg("unsafe", evict_parked="migrate"), "pop")
    assert out.status == VIOLATED and out.cti is not None
    assert out.cti.broken == ["popped_slots_valid"]


def test_init_and_the_other_actions_are_fine_under_unsafe() -> None:
    cfg = _cfg("unsafe")
    assert check_init(cfg).status == PROVED
    assert check_action(cfg, "park").status == PROVED


@pytest.mark.parametrize(("policy", "label", "action"), [
    ("revalidate", STILL_VALID, "pop"),
    ("revalidate", "page is DROPPABLE", "release"),
    ("pin", "page is not pinned in a pocket", "schedule"),
])
def test_weakening_a_guard_breaks_the_proof(policy: str, label: str, action: str) -> None:
    cfg = _cfg(policy)
    assert check_action(cfg, action).status == PROVED
    with overriding({label: ("always", True)}):
        out = check_action(cfg, action)
    assert out.status == VIOLATED and out.cti is not None, (label, out.status)


def test_a_guard_over_every_record_needs_a_listed_abstraction(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """The `lru` profile's victim guard scans every page's stamp (the safety spec's reads
    one page: `queued`, in the fragment as it is)."""
    label = "page is the head of its level's eviction queue"
    monkeypatch.delitem(epr.ABSTRACTIONS, label)
    with pytest.raises(epr.NotInFragment, match="reads every record"):
        check_action(_cfg("revalidate").with_order("lru"), "drop")
    assert check_action(_cfg("revalidate"), "drop").status == PROVED


# ---- the abstraction over-approximates the model, on sampled reachable states ---------------

Transition = tuple[State, str, dict[str, int]]


def _walk(cfg: KVConfig, steps: int, seed: int) -> tuple[list[State], list[Transition]]:
    """A random API walk on the model: the states between API actions, and every page
    action the model took (from the state it took it in)."""
    m = Model(cfg)
    lay = m.layout
    rng = random.Random(seed)
    t = cfg.tokens_per_block
    history = [0] * lay.seqs
    script: list[tuple[str, dict[str, Any]]] = []
    for q in range(lay.seqs):
        script += [("create", {"seq": q, "prompt": []}), ("resume", {"seq": q})]
        if q == 0 or rng.random() < 0.5:  # decoding without committing: pages park
            script.append(("stop_committing", {"seq": q}))
    states: list[State] = []
    moves: list[Transition] = []
    for i in range(len(script) + steps):
        q, r = rng.randrange(lay.seqs), rng.random()
        if i < len(script):
            action, params = script[i]
        elif r < 0.55:  # decoding (mostly sequence 0): the window slides, blocks park, pop
            q = 0 if rng.random() < 0.8 else q
            history[q] = min(history[q] + rng.randrange(1, t + 1), lay.blocks * t - 2 * t)
            action, params = "resize", {"seq": q, "capacity": history[q] + t,
                                        "history": history[q]}
        elif r < 0.7:
            action, params = "pressure", {"level": rng.randrange(cfg.num_levels),
                                          "pool_group": rng.randrange(cfg.num_pool_groups),
                                          "slots": rng.randrange(1, 3)}
        elif r < 0.85:
            action, params = "advance", {"stream": rng.randrange(lay.seqs + 1)}
        elif r < 0.95:
            other: list[tuple[str, dict[str, Any]]] = [
                ("suspend", {"seq": q}), ("resume", {"seq": q}),
                ("commit", {"seq": q, "tokens": [1, 2]})]
            action, params = rng.choice(other)
        else:
            action, params = "resume", {"seq": q}
        s = m.state
        m.run(action, params)
        for step in m.last_steps:
            moves.append((s, step.action, dict(step.params)))
            s = PAGE_ACTIONS[step.action].effect(CONCRETE, lay, s, dict(step.params))
        states.append(m.state)
    return states, moves


def _enabled(lay: Layout, s: State, action: str, limit: int, rng: random.Random
             ) -> list[dict[str, int]]:
    a = PAGE_ACTIONS[action]
    names = [p.name for p in a.params]
    insts = [dict(zip(names, c, strict=True))
             for c in itertools.product(*(p.domain(lay.cfg) for p in a.params))]
    ok = [i for i in insts if all(g for _, g in a.guard(CONCRETE, lay, s, dict(i)))]
    rng.shuffle(ok)
    return ok[:limit]


POCKET = frozenset({"park", "pop"})
SAMPLES = [("tiny", "revalidate", 0, POCKET),
           pytest.param("split-pools", "pin", 1, POCKET, marks=pytest.mark.slow),
           pytest.param("three-level", "unsafe", 2, frozenset({"evict_begin", "migrate_complete"}),
                        marks=pytest.mark.slow)]


@pytest.mark.parametrize(("preset_name", "policy", "seed", "expect"), SAMPLES)
def test_abstraction_over_approximates_every_action(preset_name: str, policy: str, seed: int,
                                                    expect: frozenset[str]) -> None:
    """alpha(s') is a parametric successor of alpha(s) for transitions the model takes
    (two per action) and for enabled instances the walk's end states offer."""
    cfg = preset(preset_name).with_pocket(True, policy)
    lay = Layout(cfg)
    rng = random.Random(seed)
    states, moves = _walk(cfg, 40, seed)
    by_action: dict[str, list[Transition]] = {}
    for move in moves:
        by_action.setdefault(move[1], []).append(move)
    sample = [m for ms in by_action.values() for m in rng.sample(ms, min(2, len(ms)))]
    for s in states[-12::6]:
        sample += [(s, a, p) for a in PAGE_ACTIONS for p in _enabled(lay, s, a, 1, rng)]
    for s, action, params in sample:
        assert epr.simulation_failures(lay, s, action, params) == [], (action, params)
    covered = {a for _, a, _ in sample}
    assert {"allocate", "unlock", "complete", "set_lengths", *expect} <= covered, covered


def test_simulation_check_catches_a_wrong_successor() -> None:
    cfg = preset("tiny").with_pocket(True, "revalidate")
    lay = Layout(cfg)
    s = _walk(cfg, 12, 3)[0][-1]
    params = _enabled(lay, s, "complete", 1, random.Random(0)) or _enabled(
        lay, s, "set_commit_state", 1, random.Random(0))
    assert params
    action = "complete" if "stream" in params[0] else "set_commit_state"
    post = PAGE_ACTIONS[action].effect(CONCRETE, lay, s, dict(params[0]))
    assert epr.simulation_failures(lay, s, action, params[0], post) == []
    wrong = replace(post, bad_pop=not post.bad_pop, clock=post.clock + 1)
    failures = epr.simulation_failures(lay, s, action, params[0], wrong)
    assert "bad_pop" in failures and "clock" in failures


# ---- the parametric invariants say what the model's catalogue says ---------------------------

def _perturb(lay: Layout, s: State, rng: random.Random) -> State:
    """One array element set to another plausible value (often breaks an invariant)."""
    name = rng.choice(["alive", "slot", "level", "locks", "holds", "queued", "owner", "lc",
                       "slot_owner", "entry", "entry_locked", "pocket", "dst_level",
                       "committed", "seq_status"])
    arr = list(getattr(s, name))
    i = rng.randrange(len(arr))
    if isinstance(arr[i], bool):
        arr[i] = not arr[i]
    elif name in ("slot", "level", "dst_level", "lc"):
        arr[i] = rng.choice([-1, 0, 1]) if name != "lc" else rng.randrange(lay.lcs)
    elif name in ("locks", "holds", "seq_status"):
        arr[i] = rng.randrange(3)
    elif name == "owner":
        arr[i] = rng.randrange(-1, lay.seqs)
    else:
        arr[i] = rng.randrange(-1, lay.pages)
    return replace(s, **{name: tuple(arr)})


@pytest.mark.slow
def test_parametric_invariants_agree_with_the_catalogue() -> None:
    cfg = preset("tiny").with_pocket(True, "revalidate")
    lay = Layout(cfg)
    rng = random.Random(5)
    states = _walk(cfg, 30, 5)[0][10::10]
    states += [_perturb(lay, s, rng) for s in states for _ in range(3)]
    exact = [i for i in PARAMETRIC_INVARIANTS if i.exact and i.name in INVARIANTS_BY_NAME]
    assert len(exact) >= 12
    disagreements = []
    broken = 0
    for s in states:
        for inv in exact:
            model = bool(INVARIANTS_BY_NAME[inv.name].predicate(CONCRETE, lay, s))
            broken += not model
            if holds_concretely(lay, s, inv) != model:
                disagreements.append(inv.name)
    assert not disagreements
    assert broken > 0  # the perturbed states do break some invariants


def test_the_lemmas_hold_on_reachable_states() -> None:
    cfg = preset("tiny").with_pocket(True, "revalidate")
    lay = Layout(cfg)
    lemmas = [i for i in PARAMETRIC_INVARIANTS if not i.exact]
    assert {i.name for i in lemmas} == {"refcounts_match", "values_in_range"}
    for s in _walk(cfg, 30, 7)[0][::6]:
        for inv in lemmas:
            assert holds_concretely(lay, s, inv), inv.name
    # ... and they are not vacuous: a wrong lock count breaks refcounts_match.
    s = _walk(cfg, 30, 7)[0][-1]
    wrong = replace(s, locks=tuple(x + 1 for x in s.locks))
    assert not holds_concretely(lay, wrong, next(i for i in lemmas if i.name == "refcounts_match"))


# ---- the command line ------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_reports_the_unsafe_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run_parametric([("gpu/unsafe", _cfg("unsafe", "gpu"))], None, 1)
    out = capsys.readouterr().out
    assert rc == 1
    assert "consecution:pop" in out and "violated" in out
    assert "counterexample to induction: pop(" in out


def test_cli_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    from kvpocket.verify.cli import main

    assert main(["prove", "--parametric", "--policy", "nonsense"]) == 2


def test_every_form_not_derived_says_why() -> None:
    """The parametric invariants are derived from the model's definitions (the one-page
    form over the page sort, the one-sequence form over the sequence sort, or the definition
    as it is) unless `RESTATED` gives a reason;
    the executable model's hand-written companions likewise (`fastcheck.HAND_WRITTEN`)."""
    from kvpocket.model.fastcheck import FAST, HAND_WRITTEN
    from kvpocket.verify.proofs.parametric import RESTATED

    for inv in PARAMETRIC_INVARIANTS:
        if inv.name in RESTATED or inv.name == "dead_pages_are_blank":  # + a nil lemma
            continue
        maker = inv.build.__qualname__.split(".")[0]
        defined = INVARIANTS_BY_NAME[inv.name]
        wanted = "for_every_page" if defined.per_page else \
            "for_every_seq" if defined.per_seq else "as_defined"
        assert maker == wanted, inv.name
    assert set(RESTATED) <= {i.name for i in PARAMETRIC_INVARIANTS}
    derived = {i.name for i in INVARIANTS_BY_NAME.values()
               if i.per_page is not None or i.per_entry is not None or i.per_seq is not None}
    assert set(FAST) == derived | set(HAND_WRITTEN)
