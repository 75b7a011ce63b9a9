"""Z3's limits are resource units, never seconds, and an unknown obligation is its own
exit status (3): a proof that did not finish is never reported as a pass (issue 31)."""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest

from kvpocket.verify.exits import EXIT_INCOMPLETE, EXIT_OK
from kvpocket.verify.proofs import explicit_bmc, prove, solver

VERIFY = Path(__file__).parents[2] / "verify"


def test_no_solver_is_given_a_time_limit() -> None:
    # Every `.set(...)` on a solver names `rlimit`, never `timeout` (a clock limit makes
    # "unknown" depend on the machine's load).
    timed = []
    for path in VERIFY.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "set" and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in ("timeout", "soft_timeout")):
                timed.append(f"{path.relative_to(VERIFY)}:{node.lineno}")
    assert not timed, timed


def test_an_unknown_obligation_exits_3_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setattr(solver, "DEFAULT_RLIMIT", 2_000)  # too few units to decide anything
    out = tmp_path / "prove.json"
    code = prove.run_prove("gpu", "revalidate", 0, str(out), str(tmp_path), workers=1,
                           page_depth=0)
    assert code == EXIT_INCOMPLETE
    data = json.loads(out.read_text())
    unknown = [o for o in data["obligations"] if o["status"] == "unknown"]
    assert unknown and all("resource limit" in o["detail"] for o in unknown), unknown


def test_a_slow_clock_changes_no_verdict(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Every reading of the clock jumps an hour: a verdict that read it (a timeout in
    # seconds) would turn "proved" into "unknown".
    ticks = iter(range(0, 10**12, 3600))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(ticks)))
    monkeypatch.setattr(time, "monotonic", lambda: float(next(ticks)))
    code = prove.run_prove("gpu-host", "revalidate", 3, str(tmp_path / "p.json"),
                           str(tmp_path), workers=1, page_depth=2)
    assert code == EXIT_OK
    statuses = {o["status"] for o in json.loads((tmp_path / "p.json").read_text())["obligations"]}
    assert statuses == {"proved"}


def test_explicit_bmc_is_bounded_by_states_not_time() -> None:
    from kvpocket.model.state import Layout

    lay = Layout(prove.PROVE_CONFIGS["gpu-host"].config)
    r = explicit_bmc.explicit_bmc(lay, "api", 7, max_states=50)
    assert r.status == "unknown" and "more than 50 states" in r.detail


def test_units_spent_are_reported() -> None:
    import z3

    s = solver.new_solver()
    x = z3.Int("x")
    s.add(x * x == 49, x > 0)
    answer = solver.check(s)
    assert answer.status == "sat" and answer.units > 0
    tight = solver.limited(z3.Solver(), 1)
    y = z3.BitVec("y", 32)
    tight.add(y * y * y == 12_345_677, y * 7 != 3)
    assert solver.check(tight).status == "unknown"
