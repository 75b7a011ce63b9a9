"""Output for a person: `prove` gives its verdict and a summary first (the rows behind
--verbose and in the JSON); `mutants --list` never breaks a name, and shows the markup-like
text of descriptions as written; usage errors go to stderr with the command's prefix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpocket.verify.cli.commands import main
from kvpocket.verify.quality.seeded import MUTANTS

PROVE = ["prove", "--config", "gpu", "--policy", "revalidate", "--depth", "0",
         "--page-depth", "0", "--workers", "1"]


@pytest.mark.slow
def test_prove_prints_the_summary_first_and_rows_only_with_verbose(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    js = tmp_path / "prove.json"
    assert main([*PROVE, "--json", str(js), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    first = out.strip().splitlines()[0]
    assert first.startswith("ALL PROVED:") and "0 violated, 0 unknown" in first
    assert "summary" in out and "gpu/revalidate" in out
    assert "every obligation" not in out and "--verbose prints every row" in out
    data = json.loads(js.read_text())
    rows = data["obligations"]
    assert rows and all(r["status"] == "proved" for r in rows)
    assert data["summary"]["gpu/revalidate"]["proved"] == len(rows)
    assert data["summary"]["gpu/revalidate"]["violated"] == 0
    assert main([*PROVE, "--verbose", "--out", str(tmp_path / "out")]) == 0
    verbose = capsys.readouterr().out
    assert "every obligation" in verbose
    assert all(r["obligation"].split()[0] in verbose for r in rows)


@pytest.mark.slow
def test_prove_prints_a_violation_and_its_counterexample(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["prove", "--config", "gpu-host", "--policy", "unsafe", "--workers", "1",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert out.strip().splitlines()[0].startswith("VIOLATED:")
    assert "counterexample trace" in out
    trace = next(tmp_path.glob("bmc-*.jsonl"))
    assert main(["replay", str(trace)]) == 1  # the written trace has its end marker


def test_mutants_list_keeps_names_whole_at_80_columns(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["mutants", "--list"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    for name in MUTANTS:
        assert any(f"│ {name} " in line for line in out.splitlines()), name
    assert "[h+1-w, h]" in out  # rich markup in a description is escaped, not swallowed


@pytest.mark.parametrize("argv", [["prove", "--depth", "-1"], ["mutants", "--only", "x"],
                                  ["fuzz", "--steps", "0"], ["trace", "record"],
                                  ["bench", "--suite", "x"], ["replay"]])
def test_usage_errors_go_to_stderr_with_the_command(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"kvpocket {argv[0]}: error: ")


@pytest.mark.slow
def test_prove_with_both_engines_reports_their_agreement(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["prove", "--config", "gpu", "--policy", "revalidate", "--depth", "0",
            "--page-depth", "2", "--engine", "both", "--workers", "1",
            "--json", str(tmp_path / "p.json"), "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = {r["obligation"]: r for r in json.loads((tmp_path / "p.json").read_text())
            ["obligations"]}
    assert rows["bmc:page<= 2 [explicit]"]["status"] == "proved"
    assert rows["bmc:page<= 2 [symbolic]"]["status"] == "proved"
    assert rows["bmc:page<= 2: engines agree"]["status"] == "proved"
    # An engine that answers differently makes the run fail, naming both answers.
    from kvpocket.verify.proofs import prove
    from kvpocket.verify.proofs.bounded import BmcResult

    def wrong(*args: object, **kwargs: object) -> BmcResult:
        return BmcResult("page", "revalidate", "violated", 1, [], ["slot_owned_once"], 0.0,
                         0.0, engine="explicit")

    monkeypatch.setattr(prove, "explicit_bmc", wrong)
    capsys.readouterr()
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "BMC engines disagree: explicit violated" in out and "symbolic proved" in out
