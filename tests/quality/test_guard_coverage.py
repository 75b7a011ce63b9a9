"""The default plan (`kvpocket fuzz --total-examples 1100`) reaches every guard combination
its cells must reach (`verify/conformance/guards.py`) and the speed structures' rare path
with live entries, with no false alarm."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpocket.verify.conformance.guards import PREFIX as GUARD_PREFIX
from kvpocket.verify.conformance.matrix import DEFAULT_EXAMPLES, run_matrix
from kvpocket.verify.conformance.speed import HEAP_COMPACTED


@pytest.mark.quality
@pytest.mark.slow
def test_the_default_plan_reaches_every_allowed_combination(tmp_path: Path) -> None:
    report = run_matrix(total_examples=DEFAULT_EXAMPLES, out_dir=str(tmp_path))
    assert report.failures == [], report.failures[0].message if report.failures else ""
    assert [n for n in report.unreached if n.startswith(GUARD_PREFIX)] == []
    wanted = {n for c in report.cells.values() for n in c.expected
              if n.startswith(GUARD_PREFIX)}
    assert len(wanted) >= 180 and all(report.rare_states[n] for n in wanted)
    assert report.rare_states[HEAP_COMPACTED] > 0
