"""`kvpocket bench`: the smoke suite through the CLI entry, and option errors.

Counting properties only (allocator calls, events); timings are never asserted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvpocket.verify import bench, cli
from kvpocket.verify.bench import device

REQUIRED = ("pocket", "batch", "window", "tokens_per_block", "pressure",
            "allocator_calls_per_step", "events_per_step", "resize_us_median", "resize_us_p99",
            "distinct_slots_per_sequence", "releases_per_step", "cross_stream_waits_per_step",
            "resize_crossing_us_median", "resize_crossing_us_p99",
            "resize_non_crossing_us_median", "resize_non_crossing_us_p99",
            "pop_refusal_share", "config")


def run(argv: list[str]) -> int:
    """Through `kvpocket bench` once the CLI has it, else through the module's entry."""
    if any(c[0] == "bench" for c in cli.COMMANDS):
        return cli.main(["bench", *argv])
    return bench.main(argv)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("bench")
    rc = run(["--suite", "smoke", "--json", str(d / "b.json"), "--plots", str(d / "plots")])
    assert rc == 0
    data: dict[str, Any] = json.loads((d / "b.json").read_text())
    data["_dir"] = str(d)
    return data


@pytest.mark.slow  # the smoke suite's run (module fixture) is the cost
def test_json_has_required_keys(smoke: dict[str, Any]) -> None:
    rows = smoke["decode"]
    assert isinstance(rows, list) and rows
    for r in rows:
        for k in REQUIRED:
            assert k in r, k
        assert r["config"]["tokens_per_block"] == r["tokens_per_block"]
        assert r["invariant_violations"] == 0 and not r["leaks"]
    # pocket off and on side by side, for each configuration
    keys = {(r["batch"], r["window"], r["tokens_per_block"], r["pressure"], r["pocket"])
            for r in rows}
    assert {(*k[:4], not k[4]) for k in keys} == keys
    assert {(r["window"], r["tokens_per_block"]) for r in rows} >= {(128, 32), (131, 32)}
    assert {r["pressure"] for r in rows} == {False, True}
    assert smoke["config"]["name"] == "smoke"
    assert "fuzz" in smoke["verifier"]


@pytest.mark.slow  # the smoke suite's run (module fixture) is the cost
def test_long_run_state_is_bounded(smoke: dict[str, Any]) -> None:
    """What the manager holds after 1,000 closed sequences is what it held after none
    (the create-cost figure's counting side; the times are for docs/performance.md)."""
    rows = smoke["long_run"]["create"]
    assert [r["closed"] for r in rows] == [0, 1000]
    assert rows[0]["handles_held"] == rows[1]["handles_held"]
    assert rows[0]["live_streams"] == rows[1]["live_streams"]
    rec = smoke["long_run"]["record"]
    assert rec["steps"] == 300 and rec["peak_rss_mb"] > 0 and rec["log_mb"] >= 0


@pytest.mark.slow  # the smoke suite's run (module fixture) is the cost
def test_pocket_steady_state_counts(smoke: dict[str, Any]) -> None:
    rows = smoke["decode"]
    assert isinstance(rows, list)
    for r in rows:
        assert r["crossings"] > 0
        if r["pressure"]:
            continue
        if r["pocket"]:
            assert r["allocator_calls_per_crossing"] == 0
            assert r["events_per_crossing"] == 0
            assert r["releases_per_step"] == 0
            assert r["pocket_pops_per_step"] > 0
        else:
            assert r["allocator_calls_per_crossing"] == 1  # one SWA life cycle
            assert r["events_per_crossing"] >= 1


@pytest.mark.slow  # the smoke suite's run (module fixture) is the cost
def test_pressure_refusals_counted(smoke: dict[str, Any]) -> None:
    rows = smoke["decode"]
    assert isinstance(rows, list)
    hit = [r for r in rows if r["pocket"] and r["pressure"]]
    assert hit and all(0.0 <= r["pop_refusal_share"] <= 1.0 for r in hit)
    assert any(r["pocket_refusals_per_step"] > 0 for r in hit)


@pytest.mark.slow  # the smoke suite's run (module fixture) is the cost
def test_plots_written(smoke: dict[str, Any]) -> None:
    plots = smoke["plots"]
    assert isinstance(plots, list) and len(plots) == 3
    for p in plots:
        assert Path(p).is_file() and Path(p).read_bytes()[:4] == b"\x89PNG"


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("smoke", "default", "gpu"):
        assert name in out


@pytest.mark.parametrize(("argv", "needle"), [
    (["--suite", "nope"], "--suite"),
    (["--backend", "torch"], "--backend"),
    (["--suite", "smoke", "--json", ""], "--json"),
])
def test_option_errors(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    if needle == "--suite":
        assert "smoke, default, gpu" in err
    if needle == "--backend":
        assert "numpy, cupy" in err


def test_gpu_suite_without_gpu(capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    import kvpocket.verify.bench.suite as suite_module

    monkeypatch.setattr(suite_module, "gpu_available", lambda refresh=False: False)
    assert run(["--suite", "gpu"]) == 2
    err = capsys.readouterr().err
    assert "GPU" in err and "kvpocket[cuda]" in err and "Traceback" not in err
    assert run(["--suite", "smoke", "--backend", "cupy"]) == 2
    assert "--backend" in capsys.readouterr().err


def test_simulator_gpu_paths() -> None:
    """The GPU-suite measurements, run on the simulator (tiny) so their code is exercised."""
    mg = device.migration_bandwidth("numpy", slot_bytes=4096, pages=8, reps=2)
    assert mg["migrations"] == 2 * 3 * 8  # a warm-up round plus 2, each way
    # batched: per round one copy batch each way plus the sequence's fence, not 8 events
    assert mg["copy_events"] <= 3 * 3 and mg["gpu_to_host_ratio_vs_bulk"] > 0
    assert mg["gpu_to_host_api_ms"] > 0 and mg["host_to_gpu_ratio_vs_bulk"] > 0


@pytest.mark.parametrize("pattern", ["contiguous", "scattered"])
def test_simulator_copy_slots_bench(pattern: str) -> None:
    r = device.copy_slots_bandwidth("numpy", slot_bytes=1024, pages=16, reps=2,
                                    pattern=pattern)
    assert r["bytes"] == 16 * 1024 and r["gpu_to_host_GBps"] > 0 and r["host_to_gpu_GBps"] > 0
    with pytest.raises(ValueError, match="pattern"):
        device.copy_slots_bandwidth("numpy", pattern="diagonal")


@pytest.mark.parametrize(("mode", "positions"), [("sweep", 2 * 2 * 8), ("reads", 24 * 2 * 8)])
def test_simulator_oracle_throughput(mode: str, positions: int) -> None:
    orc = device.oracle_throughput("numpy", batch=2, steps=40, window=8, tpb=4,
                                   check_every=16, mode=mode)
    assert orc["mismatches"] == 0 and orc["decode_steps_per_second"] > 0
    assert orc["checks"] == 3 and orc["verified_positions"] == positions  # first: warm-up
    assert orc["verified_positions_per_second"] > 0
    pre = device.oracle_throughput("numpy", batch=2, steps=4, window=8, tpb=4, prefill=8,
                                   check_every=2, slot_elems=2)
    assert pre["mismatches"] == 0 and pre["checks"] == 2  # at steps 2 and 4
    assert pre["verified_positions"] == 2 * 8  # one timed sweep of two full windows


def test_gpu_suite_steps_on_the_simulator(tmp_path: Path) -> None:
    """scripts/gpu_suite.sh steps 3 and 4, dry-run on the simulator with fake test runs."""
    extras = device.suite_extras(str(tmp_path), backend="numpy", small=True)
    assert set(extras) == {"migration_auto", "migration_runs", "migration_staged",
                           "oracle_sweep", "copy_slots_contiguous_auto",
                           "copy_slots_contiguous_staged", "copy_slots_scattered_auto",
                           "copy_slots_scattered_staged", "oracle_reads"}
    assert extras["oracle_reads"]["mismatches"] == 0 == extras["oracle_sweep"]["mismatches"]
    # no bench JSON yet (the decode A/B ran out of time): the extras' own figures count
    s = device.suite_summary(str(tmp_path), runs=0, passed=0)
    assert s["oracle_verified_positions_per_second"] == extras["oracle_sweep"][
        "verified_positions_per_second"] > 0
    assert s["migration"]["gpu_to_host_api_ms"] == extras["migration_auto"]["gpu_to_host_api_ms"]
    case = '<testcase classname="tests.impl.test_cupy_backend" name="{}">{}</testcase>'
    for i in range(1, 11):
        body = "<failure/>" if i == 3 else ""
        (tmp_path / f"gpu-tests-{i}.xml").write_text(
            "<testsuites><testsuite>"
            + case.format("test_copy_slot_all_level_pairs_and_events", body)
            + case.format("test_levels_live_on_device_pinned_host_and_disk", "")
            + "</testsuite></testsuites>")
    (tmp_path / "bench-gpu.json").write_text(json.dumps({"gpu": {
        "migration": {"gpu_to_host_ratio_vs_bulk": 0.93, "host_to_gpu_ratio_vs_bulk": 0.85},
        "oracle": {"verified_positions_per_second": 2.5e8}}}))
    s = device.suite_summary(str(tmp_path), runs=10, passed=9)
    assert s["copy_chain_passes"] == 9 and s["test_runs_passed"] == 9
    assert s["per_test_passes"][
        "tests.impl.test_cupy_backend::test_levels_live_on_device_pinned_host_and_disk"] == 10
    assert list(s["targets"].values()) == [False, True, False, True]
    assert json.loads((tmp_path / "gpu-summary.json").read_text())["extras"] == extras
    assert device.main(["summary", str(tmp_path), "10", "9"]) == 1


def test_oracle_ab_against_itself() -> None:
    oracle_py = Path(device.__file__).resolve().parents[1] / "oracles" / "data.py"
    r = device.oracle_ab(str(oracle_py), batch=2, window=8, steps=20, reps=1)
    assert r["positions"] == 2 * sum(min(h + 1, 8) for h in range(20))
    assert set(r["positions_per_cpu_second"]) == {"old reads", "new reads", "new sweep"}
    assert r["sweep_speedup"] > 0 and r["reads_speedup"] > 0
    with pytest.raises((ValueError, FileNotFoundError)):
        device.oracle_ab(str(oracle_py.with_name("no_such_oracle.py")), reps=1)


def test_gpu_suite_script_refuses_without_a_gpu(tmp_path: Path) -> None:
    import os
    import subprocess

    from kvpocket.impl.backend import gpu_available

    if gpu_available():
        pytest.skip("a GPU is usable here: the script would run the whole suite")
    root = Path(device.__file__).resolve().parents[2]
    script = root / "scripts" / "gpu_suite.sh"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    done = subprocess.run(["bash", str(script)], env={**os.environ, "OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 3 and "gpu_available = False" in done.stdout
    assert not list(tmp_path.glob("gpu-tests-*"))  # nothing ran


@pytest.mark.slow
def test_bmc_bench_reports_the_unsafe_counterexample_per_engine(
        capsys: pytest.CaptureFixture[str]) -> None:
    from kvpocket.verify.bench.cases import BenchResult
    from kvpocket.verify.bench.report import print_result
    from kvpocket.verify.bench.verifier import bench_bmc_unsafe

    b = bench_bmc_unsafe(engines=("explicit",))
    (row,) = b["rows"]
    assert (row["engine"], row["status"], row["depth"]) == ("explicit", "violated", 7), row
    assert "popped_slots_valid" in row["broken"] and row["states"] > 0
    res = BenchResult("default", "numpy", {"python": "3", "numpy": "2", "cpu_count": 2}, {},
                      verifier={"bmc_unsafe": b})
    print_result(res)
    out = capsys.readouterr().out
    assert "BMC from Init, explicit engine" in out and "violated at depth 7" in out
    assert "target 10 s" in out


def test_trace_check_at_real_geometry(smoke: dict[str, Any]) -> None:
    # Counting only: a header-only log declaring 2**20 slots per level is accepted and the
    # model stores no position for it; a recorded log at 100,000 slots per level is
    # accepted whole (its speed and memory are figures for docs/performance.md).
    geo = smoke["verifier"]["trace_geometry"]
    start, run_ = geo["startup"], geo["throughput"]
    assert start["ok"] and start["slots_per_level"] == 1 << 20
    assert start["stored_positions"] == 0
    assert run_["ok"] and run_["slots_per_level"] == 100_000
    assert run_["events"] == run_["events_recorded"] >= 300
    assert run_["peak_rss_mb"] > 0
    # the reading floor reads the same events; the model ran page actions for them
    assert run_["reader_events"] == run_["events"]
    assert run_["page_actions"] >= run_["events"] // 2
    # the same log under a real manager's declared sequences and blocks is valid too
    declared = run_["declared"]
    assert declared["ok"] and declared["events"] == run_["events"]
    assert declared["num_sequences"] == 1024 and declared["max_blocks"] == 8192


def test_trace_check_of_a_full_pool(smoke: dict[str, Any]) -> None:
    # Counting only: the full-pool log (sequences prefilling past the pool's size) is
    # accepted whole, and once the pool is full its allocations evict (more page actions
    # per event than the sequences' own allocations alone would take).
    fp = smoke["verifier"]["full_pool"]
    assert fp["ok"] and fp["events"] == fp["events_recorded"] == 5 * fp["sequences"]
    assert fp["slots_per_level"] == 300 and fp["peak_rss_mb"] > 0
    assert fp["page_actions_per_event"] > 30 * 2 / 5
