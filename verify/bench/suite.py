"""`kvpocket bench`: decode A/B (pocket off vs on), cost scaling, verifier speed, GPU.

Suites (`--list`):

* `smoke`   seconds; what the test suite runs (tiny batches, one fuzz worker).
* `default` the numbers of docs/performance.md (under ~10 minutes on 2 cores).
* `gpu`     the decode A/B on CuPy, migration copy bandwidth against a plain CuPy
            copy of the same bytes, and the data oracle's throughput (needs a GPU).

Decode A/B: `batch` sequences decode in lockstep under one SWA life cycle
(`window`/`tokens_per_block`), with committing stopped (the disaggregated-decode
case the pocket targets). The manager is brought straight to the steady state
(history `window + tokens_per_block`), warmed for one block period, then `steps`
decode steps (`resize(h + 1, h)` per sequence) are measured. Pocket off and on run
the same configuration side by side. With `pressure`, another tenant asks the GPU
level for `pressure_slots_per_step` more free slots after every decode step
(`manager.pressure`): parked pages are the only evictable GPU pages, so they migrate
to host and their pop is refused (`pop_refusal_share`).

Counts are per decode step of the whole batch (`*_per_step`) and per boundary
crossing of one sequence (`*_per_crossing`); they count the decoding sequences'
work only (the tenant's migrations are `tenant_migrations_per_step`). Times are
per `resize()` call of one sequence, in microseconds, split into crossing steps
(a new block), retire steps (a block leaves the window, no new block) and flat
steps (neither); "non-crossing" is retire + flat.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from kvpocket.impl.backend import gpu_available
from kvpocket.verify.bench.cases import (
    BACKENDS,
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    SUITES,
    BenchResult,
    BenchUsageError,
    DecodeCase,
    Suite,
)
from kvpocket.verify.bench.decode import run_decode_ab
from kvpocket.verify.bench.device import migration_bandwidth, oracle_throughput
from kvpocket.verify.bench.geometry import GeometryCase, bench_geometry, full_pool_throughput
from kvpocket.verify.bench.longrun import create_cost, record_peak
from kvpocket.verify.bench.report import print_result
from kvpocket.verify.bench.verifier import bench_bmc_unsafe, bench_fuzz, bench_mutants, bench_prove
from kvpocket.verify.exits import EXIT_INTERRUPTED
from kvpocket.verify.interrupts import stop_if_interrupted
from kvpocket.verify.terminal import Progress
from kvpocket.verify.traces.trace import write_atomic
from kvpocket.verify.usage import CliError, check_outputs


# ---- CLI ------------------------------------------------------------------------------
def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", default="default", metavar="NAME",
                        help="one of " + ", ".join(SUITES) + " (default default); see --list")
    parser.add_argument("--backend", default=None, metavar="B",
                        help="numpy (default) or cupy for the decode rows (the gpu suite uses cupy)")
    parser.add_argument("--json", dest="json_path", default=None, metavar="FILE",
                        help="write every number, with its configuration, to FILE")
    parser.add_argument("--plots", default=None, metavar="DIR",
                        help="write PNG plots to DIR (needs matplotlib: pip install "
                        "'kvpocket[plots]')")
    parser.add_argument("--out", dest="bench_out", default=None, metavar="DIR",
                        help="scratch directory for verifier runs (default: a temporary one)")
    parser.add_argument("--list", dest="list_suites", action="store_true",
                        help="list the suites and exit")


def _validate(args: argparse.Namespace) -> tuple[Suite, str]:
    if args.suite not in SUITES:
        raise BenchUsageError(f"argument --suite: expected one of {', '.join(SUITES)}, "
                              f"got {args.suite!r}")
    suite = SUITES[args.suite]
    backend = args.backend if args.backend is not None else (suite.backend or "numpy")
    if backend not in BACKENDS:
        raise BenchUsageError(f"argument --backend: expected one of {', '.join(BACKENDS)}, "
                              f"got {backend!r}")
    if suite.backend is not None and backend != suite.backend:
        raise BenchUsageError(f"argument --backend: the {suite.name} suite runs on "
                              f"{suite.backend} only, got {backend!r}")
    if (backend == "cupy" or suite.gpu) and not gpu_available():
        what = "the gpu suite" if suite.gpu else "--backend cupy"
        raise BenchUsageError(f"argument {'--suite' if suite.gpu else '--backend'}: {what} "
                              "needs CuPy and a usable CUDA GPU; none was found "
                              "(pip install 'kvpocket[cuda]' on a machine with one)")
    _check_outputs(args)
    return suite, backend


def _check_outputs(args: argparse.Namespace) -> None:
    """Every output path is checked before the run (minutes of work are not lost to a bad
    --json at the end): a writable file, writable folders."""
    try:
        check_outputs([("--json", args.json_path)],
                      [("--plots", args.plots), ("--out", args.bench_out)])
    except CliError as exc:
        raise BenchUsageError(str(exc)) from None
    if args.plots and not _installed("matplotlib"):
        raise BenchUsageError("argument --plots: needs matplotlib, an optional extra "
                              "(pip install 'kvpocket[plots]' or pip install matplotlib)")


def _installed(name: str) -> bool:
    """Whether `name` can be imported, without importing it (matplotlib takes seconds)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def _machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "numpy": np.__version__,
            "platform": platform.platform(), "processor": platform.processor() or
            platform.machine(), "cpu_count": os.cpu_count()}


def run_suite(suite: Suite, backend: str, out_dir: str, log: Callable[[str], None]
              ) -> BenchResult:
    t_all = time.perf_counter()
    res = BenchResult(suite.name, backend, _machine(), {
        "description": suite.description, **asdict(suite), "backend": backend,
        "pressure_slots_per_step": "max(1, batch // 64)"})
    def next_job(msg: str) -> None:  # a job that absorbed a Ctrl-C (a campaign) stops here
        stop_if_interrupted()
        log(msg)

    try:
        _run_jobs(suite, backend, out_dir, next_job, res)
        stop_if_interrupted()
    except KeyboardInterrupt:  # the rows so far are reported, marked (`verify/interrupts.py`)
        res.interrupted = True
    res.seconds = time.perf_counter() - t_all
    return res


def _run_jobs(suite: Suite, backend: str, out_dir: str, log: Callable[[str], None],
              res: BenchResult) -> None:
    for case in suite.decode:
        log(f"decode {case.batch} x {case.window}/{case.tokens_per_block}, {case.steps} steps"
            f"{', pressure' if case.pressure else ''} ({backend})")
        res.decode += run_decode_ab(case, backend)
    if suite.batch_sweep:
        w, t = suite.batch_sweep_preset
        res.scaling["batch"] = []
        for n in suite.batch_sweep:
            log(f"sweep batch {n} x {w}/{t}")
            res.scaling["batch"] += run_decode_ab(DecodeCase(n, w, t, suite.sweep_steps), backend)
    if suite.window_sweep:
        res.scaling["window"] = []
        for w in suite.window_sweep:
            log(f"sweep window {suite.window_sweep_batch} x {w}/{suite.window_sweep_tpb}")
            res.scaling["window"] += run_decode_ab(
                DecodeCase(suite.window_sweep_batch, w, suite.window_sweep_tpb, suite.sweep_steps),
                backend)
    if suite.fuzz_examples or suite.fuzz_seconds:
        log("verifier: lockstep fuzz")
        res.verifier["fuzz"] = bench_fuzz(suite, out_dir)
    if suite.prove_configs:
        log("verifier: prove per configuration")
        res.verifier["prove"] = bench_prove(suite.prove_configs, out_dir)
    if suite.bmc_unsafe:
        log("verifier: BMC to the unsafe counterexample")
        res.verifier["bmc_unsafe"] = bench_bmc_unsafe()
    if suite.mutants:
        log("verifier: mutant time-to-kill")
        res.verifier["mutants"] = bench_mutants()
    if suite.trace_geometry is not None:
        startup, slots, events = suite.trace_geometry
        log(f"verifier: trace check at real geometry ({slots} slots per level, {events} events)")
        res.verifier["trace_geometry"] = bench_geometry(GeometryCase(startup, slots, events))
    if suite.full_pool is not None:
        slots, seqs = suite.full_pool
        log(f"verifier: trace check of a full pool ({slots} GPU slots, {seqs} sequences)")
        res.verifier["full_pool"] = full_pool_throughput(slots, seqs)
    if suite.create_marks:
        log(f"long run: create cost after {', '.join(map(str, suite.create_marks))} closed")
        res.long_run["create"] = create_cost(suite.create_marks)
    if suite.record_steps:
        log(f"long run: trace record --steps {suite.record_steps}, peak memory")
        res.long_run["record"] = record_peak(suite.record_steps)
    if suite.gpu:
        log("gpu: migration bandwidth, oracle throughput")
        res.gpu = {"migration": migration_bandwidth(backend),
                   "oracle": oracle_throughput(backend)}


def run_bench(args: argparse.Namespace) -> int:
    """Benchmark the pocket (decode A/B, scaling), the verifiers and the GPU paths."""
    if getattr(args, "list_suites", False):
        for s in SUITES.values():
            print(f"{s.name:8} {s.description}")
        return EXIT_OK
    try:
        suite, backend = _validate(args)
    except BenchUsageError as exc:
        print(f"kvpocket bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    with contextlib.ExitStack() as stack:
        # each job's line as it starts, through the one progress component
        log = stack.enter_context(Progress("bench", live=False, final_line=False)).note
        out_dir = args.bench_out or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="kvpocket-bench-"))
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        res = run_suite(suite, backend, out_dir, log)
    if args.plots and not res.interrupted:
        # matplotlib: optional (kvpocket[plots]) and seconds to import
        from kvpocket.verify.bench.plots import write_plots

        res.plots = write_plots(res.to_json(), args.plots)
    if res.interrupted:
        print("INTERRUPTED: the rows below are those of the part that ran", file=sys.stderr)
    print_result(res)
    if args.json_path:
        write_atomic(args.json_path, json.dumps(res.to_json(), indent=1) + "\n")
        print(f"wrote {args.json_path}")
    if res.plots:
        print("plots: " + ", ".join(res.plots))
    bad = [r for r in res.decode + [x for v in res.scaling.values() for x in v]
           if r["invariant_violations"] or r["leaks"]]
    if bad:
        print(f"kvpocket bench: {len(bad)} rows ended with invariant violations or leaks",
              file=sys.stderr)
        return EXIT_FAIL
    return EXIT_INTERRUPTED if res.interrupted else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvpocket bench", description=run_bench.__doc__)
    add_bench_arguments(parser)
    return run_bench(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
