"""`kvpocket replay`: results, and clear errors for malformed traces."""

from __future__ import annotations

import json
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
