"""Configurations as drawn data (`configs.kv_configs`), the machine that draws one per
example, the event log checked in the lockstep, the default campaign's example budget and
steering, and `--config FILE.json`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, find, given, settings

from kvpocket.model.config import EvictParked, KVConfig, PocketPolicy
from kvpocket.verify import patching
from kvpocket.verify.cli.commands import main
from kvpocket.verify.cli.render import print_matrix
from kvpocket.verify.conformance.configs import kv_configs
from kvpocket.verify.conformance.fuzz import CampaignSpec, run_worker
from kvpocket.verify.conformance.lockstep import Divergence, Lockstep
from kvpocket.verify.conformance.matrix import (
    DEFAULT_MATRIX,
    CellStats,
    run_matrix,
    steering_slices,
)
from kvpocket.verify.conformance.replay import replay
from kvpocket.verify.conformance.stateful import STATS, drawn_machine_for, machine_for
from kvpocket.verify.presets import PRESETS
from kvpocket.verify.quality.reach import REACH_BUGS
from kvpocket.verify.traces.trace import Trace, read_trace

NO_DB = settings(database=None, max_examples=150, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


def without_bugs(trace: Trace) -> Trace:
    """The trace as the fixed code replays it: its header no longer asks for the bugs."""
    return replace(trace, extra={k: v for k, v in trace.extra.items() if k != patching.TRACE_KEY})


# ---- the strategy ----------------------------------------------------------------------


@NO_DB
@given(kv_configs())
def test_every_drawn_configuration_is_valid_and_small(cfg: KVConfig) -> None:
    cfg.validate()
    assert 1 <= sum(lc.is_swa for lc in cfg.life_cycles) <= 3
    assert cfg.num_levels <= 3 and max(cfg.slots_per_level) <= 12
    assert cfg.pocket.policy in (PocketPolicy.REVALIDATE, PocketPolicy.PIN)
    groups = [lc.pool_group for lc in cfg.life_cycles]
    for g in set(groups):  # room on GPU for one block of each life cycle of the group
        assert cfg.slots_per_level[0] > groups.count(g)
    assert KVConfig.from_json(cfg.to_json()) == cfg  # a reproducer's header rebuilds it


SHAPES: dict[str, Callable[[KVConfig], bool]] = {
    "two windows of different sizes": lambda c: len(
        {lc.window for lc in c.life_cycles if lc.is_swa}) >= 2,
    "full attention first": lambda c: not c.life_cycles[0].is_swa,
    "full attention last": lambda c: len(c.life_cycles) > 1 and not c.life_cycles[-1].is_swa,
    "sinks": lambda c: any(lc.sink_tokens for lc in c.life_cycles),
    "split pools": lambda c: c.num_pool_groups == 2,
    "three levels": lambda c: c.num_levels == 3,
    "GPU only": lambda c: c.num_levels == 1,
    "pocket off": lambda c: not c.pocket.enabled,
    "pin, migrating parked pages": lambda c: c.pocket.policy == PocketPolicy.PIN,
    "evict_parked=migrate": lambda c: c.pocket.evict_parked == EvictParked.MIGRATE,
    "pocket capacity 3": lambda c: c.pocket.capacity == 3,
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_strategy_reaches_every_shape(shape: str) -> None:
    cfg = find(kv_configs(), SHAPES[shape], settings=settings(database=None, max_examples=500))
    assert SHAPES[shape](cfg)


def test_only_the_given_policies_are_drawn() -> None:
    with pytest.raises(Exception, match="No examples found"):
        find(kv_configs((PocketPolicy.UNSAFE,)),
             lambda c: c.pocket.policy != PocketPolicy.UNSAFE,
             settings=settings(database=None, max_examples=100))


# ---- the drawn machine and its reproducers ------------------------------------------------


def _drawn_spec(tmp_path: Path, examples: int, event_log_every: int = 0) -> CampaignSpec:
    return CampaignSpec("drawn", PRESETS["two-level"].config, examples=examples, batch=examples,
                        seed=5, out_dir=str(tmp_path), event_log_every=event_log_every,
                        draw_policies=(PocketPolicy.REVALIDATE, PocketPolicy.PIN))


def test_a_drawn_campaign_is_clean_and_deterministic(tmp_path: Path) -> None:
    a = run_worker(_drawn_spec(tmp_path / "a", 12, event_log_every=2))
    b = run_worker(_drawn_spec(tmp_path / "b", 12, event_log_every=2))
    assert a.failures == [] and a.steps > 0
    assert (a.examples, a.steps, a.rare_states) == (b.examples, b.steps, b.rare_states)
    assert a.coverage_gaps == [], "no rare state is certain on a drawn configuration"
    assert a.first_reached and min(a.first_reached.values()) >= 1


def test_a_drawn_failure_carries_its_configuration(tmp_path: Path) -> None:
    """A bug that needs two sliding windows is found on a drawn configuration, and the
    reproducer's header holds that configuration (not the cell's stand-in)."""
    with REACH_BUGS["two-windows-fast-path"].apply():
        report = run_worker(_drawn_spec(tmp_path, 60))
        assert report.failures, "the drawn machine finds the two-window bug"
        trace = read_trace(report.failures[0].trace)
        assert len({lc.window for lc in trace.config.life_cycles if lc.is_swa}) >= 2
        assert trace.config != PRESETS["two-level"].config
        assert not replay(trace).ok
        assert trace.extra[patching.TRACE_KEY] == ["two-windows-fast-path"]
    assert replay(without_bugs(trace)).ok, "the unpatched implementation passes the trace"


# ---- the event log in the lockstep -------------------------------------------------------


def _out_of_pages(ls: Lockstep) -> None:
    ls.step("create", {"seq": 0, "prompt": []})
    ls.step("resume", {"seq": 0})
    ls.step("resize", {"seq": 0, "capacity": 2, "history": 0})
    ls.step("resize", {"seq": 0, "capacity": 20, "history": 0})  # 10 blocks, 4 GPU slots


def test_the_event_log_is_checked_at_every_step() -> None:
    ls = Lockstep(PRESETS["tiny"].config, check_event_log=True)
    _out_of_pages(ls)
    assert ls.records[-1].impl.value is False, "the last resize ran out of pages"
    assert ls.log_check is not None and ls.log_check.checked == 4
    with REACH_BUGS["eventlog-failed-resize-true"].apply():
        bad = Lockstep(PRESETS["tiny"].config, check_event_log=True)
        with pytest.raises(Divergence) as exc:
            _out_of_pages(bad)
        unchecked = Lockstep(PRESETS["tiny"].config)
        _out_of_pages(unchecked)  # without the log check the bug is invisible
    assert exc.value.step == 3 and exc.value.kind == "the event log disagrees with the model"
    assert "different result" in str(exc.value)


def test_every_kth_example_checks_the_event_log() -> None:
    machine = machine_for(PRESETS["tiny"].config, event_log_every=3, event_log_offset=1)
    STATS.reset()
    flags = [machine().check_event_log for _ in range(7)]
    assert flags == [False, True, False, False, True, False, False]  # (index + 1) % 3 == 0
    STATS.reset()
    first = machine_for(PRESETS["tiny"].config, event_log_every=3, event_log_offset=2)
    assert not first().check_event_log, "never the first example: Hypothesis's simplest"
    assert not any(machine_for(PRESETS["tiny"].config)().check_event_log for _ in range(3))
    drawn = drawn_machine_for((PocketPolicy.REVALIDATE,), event_log_every=1)()
    assert drawn.check_event_log and "ls" not in vars(drawn), "built when start draws"


def test_an_event_log_failure_replays_with_the_log_checked(tmp_path: Path) -> None:
    spec = CampaignSpec("tiny", PRESETS["tiny"].config, examples=40, batch=40, seed=1,
                        out_dir=str(tmp_path), event_log_every=1)
    with REACH_BUGS["eventlog-failed-resize-true"].apply():
        report = run_worker(spec)
        assert report.failures
        trace = read_trace(report.failures[0].trace)
        assert trace.extra.get("event_log") is True
        result = replay(trace)
        assert not result.ok and result.kind == "the event log disagrees with the model"
    assert replay(without_bugs(trace)).ok


# ---- the matrix: example budget, steering, first reached, ran short ----------------------


def test_steering_gives_late_and_missing_rare_states_more_slices() -> None:
    assert steering_slices(CellStats(examples=40, rare_states={"a": 3}, expected=["a"],
                                     first_reached={"a": 2})) == 0
    assert steering_slices(CellStats(examples=40, rare_states={"a": 3}, expected=["a"],
                                     first_reached={"a": 30})) == 1, "reached late"
    assert steering_slices(CellStats(examples=40, rare_states={"a": 3}, expected=["a", "b"],
                                     first_reached={"a": 30})) == 2, "late and missing"


def test_an_example_budget_is_the_same_run_everywhere(tmp_path: Path) -> None:
    cells = (DEFAULT_MATRIX[0], DEFAULT_MATRIX[-1])  # a preset and a drawn cell
    runs = [run_matrix(seed=2, total_examples=30, workers=1, out_dir=str(tmp_path / str(i)),
                       cells=cells) for i in range(2)]
    a, b = runs
    assert a.examples == 30 and a.total_examples == 30 and not a.ran_short
    assert (a.steps, a.rare_states) == (b.steps, b.rare_states)
    assert {n: c.first_reached for n, c in a.cells.items()} == \
        {n: c.first_reached for n, c in b.cells.items()}
    for c in a.cells.values():
        assert all(1 <= i <= c.examples for i in c.first_reached.values())
        assert set(c.first_reached) == {n for n, k in c.rare_states.items() if k}


def test_a_timed_run_that_ends_early_says_it_ran_short(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_matrix(budget_s=1e-9, out_dir=str(tmp_path), cells=DEFAULT_MATRIX[:1])
    assert report.ran_short and report.examples < report.intended_examples
    print_matrix(report)
    out = capsys.readouterr().out
    assert "INCOMPLETE" in out and "no bug found" not in out
    budgeted = run_matrix(total_examples=2, out_dir=str(tmp_path), cells=DEFAULT_MATRIX[:1])
    assert not budgeted.ran_short, "an example budget is the work asked for"


# ---- --config FILE.json ----------------------------------------------------------------


def _config_file(tmp_path: Path, data: object, name: str = "cfg.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_fuzz_and_record_accept_a_json_config(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    cfg = find(kv_configs(), SHAPES["two windows of different sizes"],
               settings=settings(database=None))
    path = _config_file(tmp_path, cfg.to_json())
    report = tmp_path / "r.json"
    code = main(["fuzz", "--config", str(path), "--examples", "3", "--no-progress",
                 "--out", str(tmp_path / "out"), "--json", str(report)])
    data = json.loads(report.read_text())
    assert data["config"] == "cfg" and not data["failures"]
    assert code == (3 if data["coverage_gaps"] else 0)  # gaps: found nothing, incomplete
    log = tmp_path / "events.ndjson"
    assert main(["trace", "record", "--config", str(path), "--steps", "30", "--out",
                 str(log)]) == 0
    header = json.loads(log.read_text().splitlines()[0])
    assert KVConfig.from_json(header["config"]) == cfg
    assert main(["trace", "check", str(log), "--config", str(path), "--no-progress"]) == 0
    capsys.readouterr()


BAD_FILES: list[tuple[object, str]] = [
    ({"tokens_per_block": 2, "windows": 3}, "'windows'"),
    ({"pocket": {"enabled": True, "policy": "sometimes"}}, "pocket.policy"),
    ({"slots_per_level": [4, "x"]}, "slots_per_level[1]"),
    ({"life_cycles": [{"name": "swa", "window": 0}]}, "life_cycles[0].window"),
    ("{not json", "invalid JSON"),
    ([1, 2], "a JSON object"),
]


@pytest.mark.parametrize(("data", "named"), BAD_FILES)
def test_a_bad_config_file_is_a_usage_error_naming_the_field(
        data: object, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _config_file(tmp_path, data)
    for argv in (["fuzz", "--config", str(path), "--examples", "2", "--no-progress",
                  "--out", str(tmp_path / "out")],
                 ["trace", "record", "--config", str(path), "--out", str(tmp_path / "l")],
                 ["prove", "--config", str(path), "--out", str(tmp_path / "out")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "--config" in err and str(path) in err and named in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "l").exists()


def test_a_missing_config_file_or_a_folder_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for target, says in ((tmp_path / "nope.json", "cannot read"), (tmp_path, "is a folder")):
        assert main(["fuzz", "--config", str(target), "--examples", "2",
                     "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert says in err and "--config" in err


def test_cli_total_examples_runs_the_plan_on_a_budget(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    code = main(["fuzz", "--total-examples", "10", "--workers", "1", "--no-progress",
                 "--json", str(out), "--out", str(tmp_path), "--verbose"])
    data = json.loads(out.read_text())
    assert data["unreached"] and code == 3  # ten examples reach few rare states: incomplete
    assert data["examples"] == 10 and data["total_examples"] == 10
    assert data["ran_short"] is False and data["intended_examples"] > 10
    first = data["cells"][DEFAULT_MATRIX[0].name]
    assert first["examples"] == 8 and first["first_reached"]
    text = capsys.readouterr().out
    assert "first reached" in text and "ran short" not in text
