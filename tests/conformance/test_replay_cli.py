"""`kvpocket replay`: results, and clear errors for malformed traces."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvpocket.verify.cli.commands import main
from kvpocket.verify.presets import PRESETS

REGRESSIONS = Path(__file__).parents[2] / "verify" / "regressions"


def test_replay_reports_the_first_violation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(REGRESSIONS / "migration-during-park-unsafe.jsonl")]) == 1
    out = capsys.readouterr().out
    assert "step 6: model invariant violated" in out and "popped_slots_valid" in out
    assert "changed by the step" in out  # a readable before/after of what the step did


def test_replay_of_a_clean_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(REGRESSIONS / "migration-during-park-revalidate.jsonl")]) == 0
    assert "implementation and model agree" in capsys.readouterr().out


def _header() -> str:
    cfg = PRESETS["tiny"].config
    return json.dumps({"kvpocket_trace": 1, "config": cfg.to_json()})


@pytest.mark.parametrize(("body", "needle"), [
    ("", "empty"),
    ('{{"nope": 1}}\n', "not a kvpocket trace header"),
    ("{header}\n{{not json\n", ":2: invalid JSON"),
    ('{header}\n{{"action": "fly", "params": {{}}}}\n', ":2: unknown action 'fly'"),
    ('{header}\n{{"action": "resume", "params": {{"seq": "x"}}}}\n', ":2: parameter 'seq'"),
    ('{header}\n{{"action": "resume"}}\n', ":2: missing field 'params'"),
    ('{header}\n{{"action": "resume", "params": {{"seq": 0}}}}\n{{"action": "res', "truncated"),
])
def test_malformed_traces_name_the_line(tmp_path: Path, body: str, needle: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(body.format(header=_header()))
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_every_regression_trace_ends_with_a_correct_end_marker() -> None:
    from kvpocket.verify.traces.trace import END_KEY, read_trace

    for path in sorted(REGRESSIONS.glob("*.jsonl")):
        last = json.loads(path.read_text().splitlines()[-1])
        assert set(last) == {END_KEY, "digest"}, path.name
        assert last[END_KEY] == len(read_trace(path).steps), path.name


def test_a_trace_cut_at_a_line_boundary_is_truncated_not_shorter(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = (REGRESSIONS / "migration-during-park-unsafe.jsonl").read_text().splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:-3]) + "\n")  # the marker and the last two steps gone
    assert main(["replay", str(cut)]) == 2
    err = capsys.readouterr().err
    n = len(lines) - 3
    assert f"cut.jsonl:{n}: the trace is truncated: no end marker after line {n}" in err
    # An old trace without a marker is read only when asked; this one is then clean, as
    # the violating step was cut away: which is why it is refused by default.
    assert main(["replay", str(cut), "--allow-unterminated"]) == 0


def test_written_traces_round_trip_with_their_marker(tmp_path: Path) -> None:
    from kvpocket.verify.traces.trace import read_trace, write_trace

    trace = read_trace(REGRESSIONS / "migration-during-park-pin.jsonl")
    path = write_trace(tmp_path / "t.jsonl", trace)
    again = read_trace(path)
    assert [s.to_json() for s in again.steps] == [s.to_json() for s in trace.steps]
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # the usual mode, not mkstemp's 0600
