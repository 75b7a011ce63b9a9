"""Piped output is readable: tables as wide as their content (never cut at 80 columns), one
console for every command (`bench` no wider than the others), and progress as plain lines
at a bounded rate, during every phase that can take long (fuzz, prove, trace check)."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from kvpocket.model.spec import spec_json
from kvpocket.verify.cli.commands import main
from kvpocket.verify.presets import DEFAULT_PRESET, preset
from kvpocket.verify.quality.seeded import MUTANTS


@pytest.fixture
def piped(monkeypatch: pytest.MonkeyPatch) -> None:
    """stdout and stderr are not terminals (capsys) and nobody set a width."""
    monkeypatch.delenv("COLUMNS", raising=False)


def test_piped_mutants_list_keeps_every_header_and_cell_whole(
        piped: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mutants", "--list"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    header = next(line for line in out.splitlines() if "mutant" in line and "layer" in line)
    for col in ("mutant", "layer", "bug", "modelled on", "switch"):
        assert f" {col} " in header, (col, header)
    for m in MUTANTS.values():  # each row on one line, its description unbroken
        assert any(m.name in line and m.description in line for line in out.splitlines())


def test_piped_spec_prints_each_guard_on_one_line(
        piped: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for a in spec_json(preset(DEFAULT_PRESET))["actions"]:
        assert any(a["guard"] in line for line in lines), a["name"]


def test_bench_tables_use_the_common_console_width(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from kvpocket.verify.bench.cases import BenchResult
    from kvpocket.verify.bench.report import print_result

    monkeypatch.setenv("COLUMNS", "100")  # as every other command: the width asked for
    bmc = {"rows": [{"engine": "explicit", "states": 5, "status": "violated", "depth": 7,
                     "broken": ["popped_slots_valid", "no_slot_aliasing"], "seconds": 1.0}],
           "config": "gpu-host", "layer": "api", "max_depth": 8, "target_seconds": 10}
    print_result(BenchResult("smoke", "numpy", {"python": "3", "numpy": "2", "cpu_count": 2},
                             {}, verifier={"bmc_unsafe": bmc}))
    out = capsys.readouterr().out
    assert "BMC from Init" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_piped_progress_is_plain_lines_at_a_bounded_rate() -> None:
    from kvpocket.verify.terminal import Progress

    buf = io.StringIO()
    out = Console(file=buf, force_terminal=False, width=80)
    with Progress("work", out=out, plain_every_s=3600) as line:
        for i in range(1000):
            line.update(f"failures 0  item {i} " + "x" * 200)
    text = buf.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 2  # the first figures at once, the final ones at the end
    assert lines[0].startswith("work: failures 0  item 0 ") and "item 999" in lines[1]
    assert all(len(line) > 200 for line in lines)  # never cut at the console's width


def test_live_fuzz_progress_on_an_80_column_terminal_keeps_failures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpocket.verify import terminal
    from kvpocket.verify.conformance.progress import CampaignProgress

    buf = io.StringIO()
    monkeypatch.setattr(terminal, "console", lambda stderr=False: Console(
        file=buf, force_terminal=True, width=80))
    spec = SimpleNamespace(config_name="three-level", cfg=preset("three-level"))
    with CampaignProgress(spec, True) as bar:
        bar.tick(123_456)
    assert "failures 0" in buf.getvalue()


def test_piped_fuzz_shows_plain_progress_with_failures(
        tmp_path: Path, piped: None, capsys: pytest.CaptureFixture[str]) -> None:
    # five examples reach few rare states: found nothing, but incomplete (exit 3)
    assert main(["fuzz", "--config", "tiny", "--examples", "5", "--out", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines()[0].startswith("fuzz tiny/revalidate: failures 0  examples")


def test_prove_shows_each_phase_as_it_starts(
        tmp_path: Path, piped: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prove", "--config", "gpu", "--policy", "pin", "--depth", "0",
                 "--page-depth", "1", "--workers", "1", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "\r" not in "".join(err)
    assert [x.split(" [")[0] for x in err] == [
        "prove gpu/pin: bmc:page<= 1 (explicit engine)",
        "prove gpu/pin: explicit engine, depth 1 of 1 (1 states so far)",
        "prove gpu/pin: induction (Z3): init, one consecution obligation per action, safety",
        "prove: gpu/pin done (1 of 1 cells)"]


def test_a_long_step_still_shows_its_figures_when_piped() -> None:
    """Plain lines come from a timer: figures set just before a step that runs long are
    printed while it runs, not only when the next update comes (the timer's call is made
    here by hand, at a time past the interval: no test waits on a clock)."""
    import time

    from kvpocket.verify.terminal import Progress

    buf = io.StringIO()
    out = Console(file=buf, force_terminal=False, width=80)
    with Progress("work", out=out, plain_every_s=3600, final_line=False) as line:
        assert line._timer is not None and line._timer.is_alive()
        line.update("depth 1")
        line.update("depth 2")  # within the interval: not printed now
        assert "depth 2" not in buf.getvalue()
        line._flush(time.monotonic() + 3600)  # what the timer does once the interval is over
        line._flush(time.monotonic() + 3600)  # nothing new: nothing printed
    assert [x.split(" [")[0] for x in buf.getvalue().splitlines()] == [
        "work: depth 1", "work: depth 2"]
