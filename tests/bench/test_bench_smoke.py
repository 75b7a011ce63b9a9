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


def test_pressure_refusals_counted(smoke: dict[str, Any]) -> None:
    rows = smoke["decode"]
    assert isinstance(rows, list)
    hit = [r for r in rows if r["pocket"] and r["pressure"]]
    assert hit and all(0.0 <= r["pop_refusal_share"] <= 1.0 for r in hit)
    assert any(r["pocket_refusals_per_step"] > 0 for r in hit)


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
    import kvpocket.impl.backend as backend

    monkeypatch.setattr(backend, "gpu_available", lambda refresh=False: False)
    assert run(["--suite", "gpu"]) == 2
    err = capsys.readouterr().err
    assert "GPU" in err and "Traceback" not in err
    assert run(["--suite", "smoke", "--backend", "cupy"]) == 2
    assert "--backend" in capsys.readouterr().err


def test_simulator_gpu_paths() -> None:
    """The GPU-suite measurements, run on the simulator (tiny) so their code is exercised."""
    mg = device.migration_bandwidth("numpy", slot_bytes=4096, pages=8, reps=2)
    assert mg["migrations"] == 2 * 2 * 8 and mg["gpu_to_host_ratio_vs_bulk"] > 0
    orc = device.oracle_throughput("numpy", batch=2, steps=40, window=8, tpb=4)
    assert orc["mismatches"] == 0 and orc["decode_steps_per_second"] > 0
