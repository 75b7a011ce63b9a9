"""The quality tier: every seeded bug (`kvpocket.verify.quality.seeded.MUTANTS`) is killed by
the default campaign (the matrix `kvpocket fuzz` runs) or, for a spec bug the API cannot
reach, by Z3 induction, and no spec mutant's obligation is violated without it. Run with
`pytest -m quality -n 2`. The campaign runs on its example budget
(`matrix.DEFAULT_EXAMPLES`): a kill verdict is the same on any machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpocket.model.overrides import overriding
from kvpocket.verify import patching
from kvpocket.verify.conformance.matrix import DEFAULT_EXAMPLES
from kvpocket.verify.quality.patches import BUGS
from kvpocket.verify.quality.reach import REACH_BUGS
from kvpocket.verify.quality.seeded import (
    CONFIGS,
    EXPLICIT_BMC,
    MUTANTS,
    run_mutant,
    z3_checks,
)

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 60.0  # per mutant, for Z3 only: the campaign stops on its example budget
# The default campaign runs on an example budget, so a verdict is the same on any machine;
# every kill must come within half of the default budget (headroom for a machine that runs
# short), so the campaign runs that half: the same kills (the plan does not depend on the
# budget), and a spec mutant only Z3 can kill costs no more.
CAMPAIGN_EXAMPLES = DEFAULT_EXAMPLES // 2

# Known gaps: (mutant, why the ci campaign does not kill it). An entry here is a failing
# (xfail) test, listed in `kvpocket mutants` as a survivor, never silently dropped.
SURVIVORS: dict[str, str] = {}  # name -> why it survives; none today


def _params() -> list[object]:
    out: list[object] = []
    for name in MUTANTS:
        marks = [pytest.mark.xfail(reason=SURVIVORS[name], strict=False)] if name in SURVIVORS \
            else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def test_registry_is_complete() -> None:
    assert len(MUTANTS) >= 14
    # the bug zoo: test_zoo.py; the bugs only drawn configurations reach: test_reach.py
    patched = {n for n in BUGS if not n.startswith("zoo-") and n not in REACH_BUGS}
    impl_mutants = {m.name for m in MUTANTS.values() if m.layer == "impl"}
    assert patched == impl_mutants, "every implementation mutant has a patch and vice versa"
    for name in impl_mutants:  # `switch` names the functions the patch edits
        edited = {e.target.rpartition(":")[2] for e in BUGS[name].edits}
        assert all(f.split(".")[-1] in MUTANTS[name].switch for f in edited), name
    model_sources = "\n".join(p.read_text() for p in (ROOT / "model").glob("*.py"))
    assert "mutants" not in model_sources, "the spec carries no switches"
    for m in MUTANTS.values():
        assert m.layer in ("impl", "model") and m.description and m.modelled_on and m.switch
        assert m.preset in CONFIGS
        assert (m.layer == "model") == m.name.startswith("model-")
        assert (m.layer == "model") == bool(m.overrides), "spec mutants are label overrides"


@pytest.mark.quality
@pytest.mark.parametrize("name", _params())
def test_mutant_is_killed(name: str) -> None:
    m = MUTANTS[name]
    # a spec mutant is tried by induction first: the campaign only runs if that misses it
    r = run_mutant(m, budget_s=BUDGET_S, attention=False, z3=True, bmc=False,
                   examples=CAMPAIGN_EXAMPLES, first_kill=True)
    assert r.killed, f"{name} survived: {r.campaign}; z3 {r.z3}"
    if r.examples is not None:
        assert r.examples <= CAMPAIGN_EXAMPLES, f"{name}: killed at example {r.examples}"
    if r.trace_length is not None:
        # A data-corruption bug needs its stream interleaving in the trace (the writer, the
        # recycled slot, the copy and the read), so its shrunk trace is longer.
        most = 24 if m.data else 16
        assert r.trace_length <= most, f"{name}: shrunk trace has {r.trace_length} steps"
    assert not patching.active_names()


# That the unmutated kit raises no false alarm on the presets the mutants run on is the clean
# run of the default matrix (tests/conformance/test_matrix.py) and, for a preset and policy no
# cell has, of the `ci` campaign (tests/conformance/test_campaigns.py checks it has them all).


def test_no_false_alarm_induction() -> None:
    """Without its override each spec mutant's obligations are proved: they are among those
    `tests/proofs/test_z3_prove.py::test_step_invariants_are_inductive` proves for every
    action on gpu-host under revalidate and pin (run once there, not again per mutant)."""
    for m in MUTANTS.values():
        if m.layer == "model" and m.actions:
            assert (m.prove_config, m.policy) in {("gpu-host", "revalidate"),
                                                  ("gpu-host", "pin")}, m.name


def test_explicit_bmc_sees_a_spec_bug_induction_cannot() -> None:
    # The window off by one is an API-layer definition (no page action to prove): the
    # explicit BMC of the mutant's spec breaks `window_is_mapped` within 7 API steps.
    m = MUTANTS["model-window-off-by-one"]
    with overriding(m.overrides):  # as `run_mutant` runs it
        got = z3_checks(m)
    assert got["induction"].startswith("n/a") and got[EXPLICIT_BMC] == "violated", got
