"""The default campaign is a plan counted in examples, and "no bug found" is said only of
a plan that ran to its end (issue 31): the same run and verdict on any machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvpocket.verify.cli import main
from kvpocket.verify.conformance import matrix
from kvpocket.verify.exits import EXIT_FOUND, EXIT_INCOMPLETE, EXIT_OK

ROOT = Path(__file__).parents[2]


def _captured_run(monkeypatch: pytest.MonkeyPatch, **report_fields: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def fake_run_matrix(**kwargs: Any) -> matrix.MatrixReport:
        seen.update(kwargs)
        r = matrix.MatrixReport(kwargs["seed"], kwargs["workers"], kwargs["budget_s"], None,
                                "numpy", examples=40, steps=900,
                                total_examples=kwargs["total_examples"])
        for k, v in report_fields.items():
            setattr(r, k, v)
        return r

    monkeypatch.setattr(matrix, "run_matrix", fake_run_matrix)
    return seen


def test_the_default_fuzz_runs_the_plan_not_the_clock(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    seen = _captured_run(monkeypatch)
    assert main(["fuzz", "--out", str(tmp_path), "--no-progress"]) == EXIT_OK
    assert seen["total_examples"] == matrix.DEFAULT_EXAMPLES


def test_minutes_stay_an_option(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = _captured_run(monkeypatch)
    main(["fuzz", "--minutes", "0.5", "--out", str(tmp_path), "--no-progress"])
    assert seen["total_examples"] is None and seen["budget_s"] == 30.0


def test_a_timed_run_short_of_its_plan_is_incomplete_not_clean(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _captured_run(monkeypatch, ran_short=True)
    code = main(["fuzz", "--minutes", "0.5", "--out", str(tmp_path), "--no-progress",
                 "--json", str(tmp_path / "fuzz.json")])
    out = capsys.readouterr().out
    assert code == EXIT_INCOMPLETE
    assert "INCOMPLETE" in out and "no bug found" not in out
    assert main(["verdict", str(tmp_path / "fuzz.json")]) == EXIT_INCOMPLETE


def test_the_summary_says_what_was_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _captured_run(monkeypatch, checks={"data oracle": 40, "views": 40, "event log": 3})
    main(["fuzz", "--out", str(tmp_path), "--no-progress"])
    out = " ".join(capsys.readouterr().out.split())
    assert "examples ran to its end" in out
    assert "data oracle in every example" in out and "event log in 3 of 40 examples" in out
    # a check no example ran is named as off, never left out
    assert "race detector off" in out and "device mirror off" in out


def _report(tmp_path: Path, name: str, data: dict[str, Any]) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return str(p)


PROVE = {"summary": {"gpu/revalidate": {"proved": 9, "violated": 0, "unknown": 0}},
         "obligations": [], "interrupted": False, "cells": 1, "cells_finished": 1}


@pytest.mark.parametrize(("unknown", "violated", "want", "word"), [
    (0, 0, EXIT_OK, "CLEAN"), (1, 0, EXIT_INCOMPLETE, "INCOMPLETE"),
    (1, 1, EXIT_FOUND, "BUG FOUND"),
])
def test_verdict_combines_fuzz_and_prove(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         unknown: int, violated: int, want: int, word: str
                                         ) -> None:
    fuzz = matrix.MatrixReport(0, 1, 0.0, None, "numpy", examples=1000, steps=10,
                               total_examples=1000).to_json()
    prove = json.loads(json.dumps(PROVE))
    prove["summary"]["gpu/revalidate"].update(unknown=unknown, violated=violated)
    code = main(["verdict", _report(tmp_path, "f.json", fuzz), _report(tmp_path, "p.json", prove)])
    line = capsys.readouterr().out.strip()
    assert code == want and line.startswith(f"kvpocket: {word}:") and "fuzz:" in line \
        and "prove:" in line and len(line.splitlines()) == 1


def test_verdict_refuses_a_file_that_is_no_report(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verdict", _report(tmp_path, "x.json", {"hello": 1})]) == 2
    assert "x.json: not a report" in capsys.readouterr().err


@pytest.mark.slow
def test_the_verdict_does_not_depend_on_the_load(tmp_path: Path) -> None:
    # One CPU-bound job per core beside the second run: same examples, steps, rare states.
    env = {**os.environ, "PYTHONPATH": str(ROOT / ".devpath")}

    def run(name: str) -> dict[str, Any]:
        out = tmp_path / name
        done = subprocess.run([sys.executable, "-m", "kvpocket.verify.cli", "fuzz",
                               "--total-examples", "30", "--workers", "2", "--no-progress",
                               "--out", str(out), "--json", str(out / "fuzz.json")],
                              env=env, capture_output=True, timeout=1800)
        data = json.loads((out / "fuzz.json").read_text())
        assert done.returncode == (3 if data["unreached"] else 0), done.stderr
        return {k: data[k] for k in ("examples", "steps", "rare_states", "unreached")} | {
            "cells": {c: (s["examples"], s["steps"], s["rare_states"])
                      for c, s in data["cells"].items()}}

    quiet = run("quiet")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)]
    try:
        loaded = run("loaded")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert quiet == loaded and quiet["examples"] == 30
