"""Every shrunk trace in verify/regressions replays with its recorded outcome."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpocket.verify.conformance.replay import replay
from kvpocket.verify.traces.trace import read_trace

REGRESSIONS = sorted((Path(__file__).parents[2] / "verify" / "regressions").glob("*.jsonl"))


def test_the_folder_is_not_empty() -> None:
    assert len(REGRESSIONS) >= 5


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_regression_replays(path: Path) -> None:
    trace = read_trace(path)
    expect = trace.extra.get("expect")
    assert expect, f"{path.name}: header has no 'expect'"
    result = replay(trace)
    if expect == "pass":
        assert result.ok, result.report
    else:
        assert not result.ok and result.kind == expect, result.report
