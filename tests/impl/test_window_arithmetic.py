"""The manager's own window arithmetic (impl/window.py) against the spec's window rule.

impl/ does not borrow the spec's formula (a wrong window would then be wrong in both and
the lockstep blind to it): the two readings are compared here directly, and the seeded
mutant `window-off-by-one` (an off-by-one in impl/window.py) must be killed by the default
lockstep campaign (tests/quality/test_mutants.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvpocket.impl import window
from kvpocket.model.config import LifeCycle, stale_range
from kvpocket.verify.quality.patches import BUGS, switched_on
from kvpocket.verify.quality.seeded import MUTANTS

ROOT = Path(__file__).resolve().parents[2]
SPEC_WINDOW_NAMES = {"stale_range"}


def _blocks(r: tuple[int, int]) -> set[int]:
    return set(range(*r))


def _cycles() -> list[LifeCycle]:
    out = [LifeCycle("full", None, 0)]
    for w in range(1, 13):
        for sink in (0, 1, 3, 4, 9):
            out.append(LifeCycle(f"swa{w}s{sink}", w, sink))
    return out


@pytest.mark.parametrize("t", [1, 2, 3, 4, 8])
def test_out_of_window_is_the_spec_rule(t: int) -> None:
    for lc in _cycles():
        for h in range(0, 70):
            assert _blocks(window.out_of_window(lc, h, t)) == _blocks(stale_range(lc, h, t)), \
                (lc, h, t)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_next_window_move_is_a_bound_on_every_change(t: int) -> None:
    swa = [lc for lc in _cycles() if lc.window is not None]
    assert window.next_window_move([LifeCycle("full", None, 0)], 5, t) > 1 << 60  # never moves
    for h in range(0, 60):
        for lc in swa:
            bound = window.next_window_move([lc], h, t)
            assert bound > h
            now = _blocks(stale_range(lc, h, t))
            assert all(_blocks(stale_range(lc, x, t)) == now for x in range(h, bound)), (lc, h)
            assert _blocks(stale_range(lc, bound, t)) != now, (lc, h, bound)  # tight
        assert window.next_window_move(swa, h, t) == min(
            window.next_window_move([lc], h, t) for lc in swa)


def test_the_seeded_window_bug_changes_the_managers_reading() -> None:
    """The mutant patches the function the manager calls, so the campaign that must kill
    it (the quality tier) runs a manager whose window is one token late."""
    assert MUTANTS["window-off-by-one"].switch == "impl/window.py out_of_window"
    assert [e.target for e in BUGS["window-off-by-one"].edits] == \
        ["kvpocket.impl.window:out_of_window"]
    lc = LifeCycle("swa", 4, 0)
    with switched_on("window-off-by-one"):
        wrong = window.out_of_window(lc, 9, 2)
    assert _blocks(wrong) != _blocks(stale_range(lc, 9, 2))
    assert _blocks(window.out_of_window(lc, 9, 2)) == _blocks(stale_range(lc, 9, 2))


def test_impl_reads_no_window_arithmetic_of_the_spec() -> None:
    for path in sorted((ROOT / "impl").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("config"):
                names = {a.name for a in node.names}
                assert not names & SPEC_WINDOW_NAMES, \
                    f"{path.relative_to(ROOT)} imports the spec's window rule"
