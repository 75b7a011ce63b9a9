"""The bug zoo (`kvpocket.verify.quality.zoo.ZOO`): bugs reported against real KV-cache managers,
recreated in `impl/`. Each one must be killed by the DEFAULT campaign (`run_matrix`, what
`kvpocket fuzz` runs with no options), not by a preset chosen for it. That the unmutated
kit raises no alarm on the same campaign is tested with the matrix itself.

Run with `pytest -m quality tests/quality/test_zoo.py -n 2`. The campaign runs on its
example budget (`matrix.DEFAULT_EXAMPLES`), so a verdict is the same on any machine, and
every bug must be killed within half of it (docs/bug-zoo.md has the examples-to-kill)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpocket.verify import patching
from kvpocket.verify.conformance.matrix import DEFAULT_EXAMPLES
from kvpocket.verify.quality.killmatrix import run_mutants
from kvpocket.verify.quality.patches import BUGS, switched_on
from kvpocket.verify.quality.seeded import DETECTORS, MUTANTS, MutantResult
from kvpocket.verify.quality.zoo import HAZARDS, ZOO, run_zoo_bug

pytestmark = [pytest.mark.quality, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 60.0  # per bug, unused with an example budget (kept for the targeted campaign)
# The default campaign on an example budget: the same verdict on any machine, and every
# bug killed within half of the default budget (headroom for a machine that runs short),
# so the campaign runs that half (the plan does not depend on the budget).
CAMPAIGN_EXAMPLES = DEFAULT_EXAMPLES // 2

# Known gaps: (zoo bug, why the default campaign misses it). An entry here is a failing
# (xfail) test and a survivor in `kvpocket mutants --zoo`, never silently dropped.
SURVIVORS: dict[str, str] = {}


def _params() -> list[object]:
    return [pytest.param(name, id=name, marks=[pytest.mark.xfail(reason=SURVIVORS[name],
                                                                 strict=False)]
                         if name in SURVIVORS else []) for name in ZOO]


def test_registry_sanity() -> None:
    assert len(ZOO) >= 12
    assert not set(ZOO) & set(MUTANTS), "the zoo is separate from the seeded mutants"
    for name, bug in ZOO.items():
        assert name == bug.name and name.startswith("zoo-")
        assert bug.origin.strip() and bug.description.strip() and bug.recreation.strip()
        assert "\n" not in bug.description
        assert bug.hazard in HAZARDS, (name, bug.hazard)
        assert bug.counterpart == "direct" or bug.counterpart.startswith("closest: "), name
        path = ROOT / bug.switch_file
        assert bug.switch_file.startswith("impl/") and path.is_file(), (name, bug.switch)
        edited = {e.target.rpartition(".")[2] for e in BUGS[name].edits}
        assert all(f in bug.switch for f in edited), f"{name}: `switch` names what it edits"
    assert len({b.origin for b in ZOO.values()}) == len(ZOO), "one bug per upstream report"
    assert set(SURVIVORS) <= set(ZOO)


def test_every_patch_is_registered() -> None:
    assert {n for n in BUGS if n.startswith("zoo-")} == set(ZOO)
    assert all(e.target.startswith("kvpocket.impl.") for n in ZOO for e in BUGS[n].edits), \
        "zoo bugs are patches of the implementation only"


def test_cli_zoo_list_and_usage(capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping inside table cells
    assert run_mutants(None, 60.0, None, list_only=True, zoo=True) == 0
    out = capsys.readouterr().out
    assert all(b.name in out and b.origin in out for b in ZOO.values())
    assert run_mutants(None, 60.0, None, list_only=True, zoo=False) == 0
    assert "[h+1-w, h]" in capsys.readouterr().out, "rich markup in descriptions is escaped"
    some = next(iter(ZOO))
    assert run_mutants(some, 60.0, None, list_only=True, zoo=False) == 2
    assert "--zoo" in capsys.readouterr().err
    assert run_mutants("pop-no-revalidate", 60.0, None, list_only=True, zoo=True) == 2


def test_result_rows_carry_origin() -> None:
    row = MutantResult("zoo-x", "impl", origin="vLLM #1", hazard="leak").to_json()
    assert row["origin"] == "vLLM #1" and row["hazard"] == "leak"
    seeded = MutantResult("m", "impl", origin="seeded: x").to_json()
    assert seeded["origin"] == "seeded: x" and "hazard" not in seeded
    json.dumps(row)


@pytest.mark.parametrize("name", _params())
def test_zoo_bug_is_killed_by_the_default_campaign(name: str, tmp_path: Path) -> None:
    r = run_zoo_bug(ZOO[name], budget_s=BUDGET_S, workers=1, out_dir=str(tmp_path),
                    examples=CAMPAIGN_EXAMPLES)
    assert not patching.active_names(), "the product code is restored"
    assert r.killed, f"{name} ({ZOO[name].origin}) survived: {r.campaign}"
    assert r.examples is not None and r.examples <= CAMPAIGN_EXAMPLES, r.examples
    assert r.campaign.startswith("default campaign"), r.campaign
    assert r.detectors and r.detectors[0] in DETECTORS
    assert r.trace is not None and Path(r.trace).is_file()
    assert r.trace_length is not None and r.trace_length <= 30, r.trace_length


def test_stale_block_table_reproducer_is_caught() -> None:
    """The survivor's shortest scenario: the lockstep check flags it at once (the gap is
    in generation, not in the checks)."""
    from kvpocket.verify.conformance.lockstep import Divergence, Lockstep
    from kvpocket.verify.presets import PRESETS

    steps: list[tuple[str, dict[str, object]]] = [("create", {"seq": 0, "prompt": []}),
                                                  ("resume", {"seq": 0})]
    steps += [("resize", {"seq": 0, "capacity": h + 1, "history": h}) for h in range(8)]
    steps += [("suspend", {"seq": 0}), ("resume", {"seq": 0})]
    with switched_on("zoo-stale-block-table"):
        ls = Lockstep(PRESETS["tiny"].config)
        with pytest.raises(Divergence) as exc:
            for action, params in steps:
                ls.step(action, params)
    assert exc.value.step == len(steps) - 1, "caught by the resume, not earlier"
    clean = Lockstep(PRESETS["tiny"].config)
    for action, params in steps:
        clean.step(action, params)  # and the unmutated implementation passes it
