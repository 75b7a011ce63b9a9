"""One verdict rule for every engine's report (`verify/verdicts.py`): the command that ran an
engine returns the verdict `kvpocket verdict` reads from its JSON, and a run that checked
less than it says is never clean."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvpocket.verify.cli import main
from kvpocket.verify.cli.verdict import read_verdict
from kvpocket.verify.exits import EXIT_FOUND, EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK
from kvpocket.verify.verdicts import (
    campaign_verdict,
    matrix_verdict,
    prove_verdict,
    target_verdict,
    verdict_of,
)


@pytest.mark.parametrize("args", [
    ["fuzz", "--config", "tiny", "--examples", "4"],
    ["fuzz", "--config", "tiny", "--policy", "unsafe", "--examples", "60"],
    ["fuzz", "--total-examples", "12", "--workers", "1"],
], ids=["campaign", "campaign-with-a-bug", "matrix"])
def test_the_command_returns_the_verdict_its_report_reads(
        args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "r.json"
    code = main([*args, "--no-progress", "--json", str(report), "--out", str(tmp_path)])
    capsys.readouterr()
    assert code == read_verdict(report).code
    assert code in (EXIT_FOUND, EXIT_INCOMPLETE)  # tiny plans: a bug, or rare states missed


def _campaign(**kw: Any) -> dict[str, Any]:
    return {"config": "tiny", "policy": "revalidate", "examples": 9, "failures": [],
            "interrupted": False, "rare_states": {"a": 1, "b": 0}, "coverage_gaps": [], **kw}


def _target(**kw: Any) -> dict[str, Any]:
    return {"target": "vllm", "version": "0.32.0", "config": "hybrid", "examples": 9,
            "failure": None, "coverage_gaps": [], "rare_states": {}, **kw}


def test_a_rare_state_never_reached_is_incomplete_for_every_engine() -> None:
    assert campaign_verdict(_campaign()).code == EXIT_OK
    gap = campaign_verdict(_campaign(coverage_gaps=["b"]))
    assert gap.code == EXIT_INCOMPLETE and "b" in gap.words
    assert target_verdict(_target()).code == EXIT_OK
    assert target_verdict(_target(coverage_gaps=["hit into a nearly full pool"])).code == \
        EXIT_INCOMPLETE
    matrix = {"kind": "matrix", "examples": 5, "cells": {"c": {}}, "failures": [],
              "interrupted": False, "ran_short": False, "unreached": ["x"], "total_examples": 5}
    assert matrix_verdict(matrix).code == EXIT_INCOMPLETE
    assert matrix_verdict({**matrix, "unreached": []}).code == EXIT_OK


def test_a_bug_outranks_an_interruption_in_every_engine() -> None:
    failure = {"message": "step 3: divergence", "cell": "c", "kind": "divergence"}
    assert campaign_verdict(_campaign(failures=[failure], interrupted=True)).code == EXIT_FOUND
    assert campaign_verdict(_campaign(interrupted=True, coverage_gaps=["b"])).code == \
        EXIT_INTERRUPTED
    found = target_verdict(_target(failure={"check": "data"}, known_engine_bug="k: what"))
    assert found.code == EXIT_FOUND and "known engine bug k" in found.words
    prove = {"summary": {"gpu/pin": {"proved": 3, "violated": 1, "unknown": 1}},
             "obligations": [], "interrupted": True, "cells": 2, "cells_finished": 1}
    assert prove_verdict(prove).code == EXIT_FOUND
    prove["summary"] = {"gpu/pin": {"proved": 3, "violated": 0, "unknown": 1}}
    assert prove_verdict(prove).code == EXIT_INTERRUPTED
    prove["interrupted"] = False
    assert prove_verdict(prove).code == EXIT_INCOMPLETE


def test_each_report_kind_is_told_apart() -> None:
    assert verdict_of(_target()) == target_verdict(_target())
    assert verdict_of(_campaign()) == campaign_verdict(_campaign())
    assert verdict_of({"something": "else"}) is None
    assert verdict_of(json.loads(json.dumps(_campaign()))) is not None
