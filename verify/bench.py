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
import gc
import io
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvpocket.model.config import KVConfig, LifeCycle, PocketConfig, stale_range

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
BACKENDS = ("numpy", "cupy")


class BenchUsageError(ValueError):
    """A bad option value; the message names the option and the allowed values."""


# ---- suites ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeCase:
    batch: int
    window: int
    tokens_per_block: int
    steps: int
    pressure: bool = False


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    decode: tuple[DecodeCase, ...]
    batch_sweep: tuple[int, ...] = ()
    batch_sweep_preset: tuple[int, int] = (128, 32)
    window_sweep: tuple[int, ...] = ()
    window_sweep_batch: int = 256
    window_sweep_tpb: int = 32
    sweep_steps: int = 128
    fuzz_examples: int | None = None  # fuzz budget: examples, or
    fuzz_seconds: float | None = None  # seconds per run
    fuzz_all_cores: bool = True
    prove_configs: tuple[str, ...] = ()
    bmc_unsafe: bool = False
    mutants: bool = False
    gpu: bool = False
    backend: str | None = None  # forced backend (gpu: cupy)


def _matrix(batches: Sequence[int], presets: Sequence[tuple[int, int]],
            steps: Callable[[int, int, int], int], pressure: Sequence[bool]) -> tuple[DecodeCase, ...]:
    return tuple(DecodeCase(n, w, t, steps(n, w, t), p)
                 for p in pressure for (w, t) in presets for n in batches)


DECODE_PRESETS = ((128, 32), (131, 32), (4096, 64))


def _default_steps(n: int, w: int, t: int) -> int:
    if w >= 1024:
        return 64 if n >= 1024 else 128  # 1024 x 4096/64 is kept cheap
    return 128 if n >= 1024 else 256


SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("smoke", "seconds: 8 sequences, 128/32 and 131/32, with and without pressure; "
          "tiny sweeps; 2 fuzz examples on one worker",
          _matrix((8,), ((128, 32), (131, 32)), lambda n, w, t: 96, (False, True)),
          batch_sweep=(4, 16), window_sweep=(64, 128), window_sweep_batch=8, sweep_steps=48,
          fuzz_examples=2, fuzz_all_cores=False),
    Suite("default", "batches 64/256/1024 x windows 128/32, 131/32, 4096/64, with and without "
          "pressure; batch and window sweeps; fuzz (1 worker and all cores), prove per "
          "configuration, BMC to the unsafe counterexample, mutant time-to-kill",
          _matrix((64, 256, 1024), DECODE_PRESETS, _default_steps, (False, True)),
          batch_sweep=(16, 64, 256, 1024, 2048),
          window_sweep=(64, 128, 256, 512, 1024, 2048, 4096), window_sweep_batch=128,
          sweep_steps=96, fuzz_seconds=15.0,
          prove_configs=("gpu", "gpu-host", "gpu-host-disk", "gpu-host-2seq"),
          bmc_unsafe=True, mutants=True),
    Suite("gpu", "CuPy: decode A/B (batches 64/256/1024 x 128/32, 131/32, 4096/64; pressure "
          "at 256), migration copy bandwidth vs a plain CuPy copy, data-oracle throughput",
          _matrix((64, 256, 1024), DECODE_PRESETS, _default_steps, (False,))
          + _matrix((256,), DECODE_PRESETS, _default_steps, (True,)),
          gpu=True, backend="cupy"),
)}


# ---- decode A/B -----------------------------------------------------------------------
def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def pressure_slots(batch: int) -> int:
    """The tenant's demand per decode step: 1/64 of the batch (at least 1 slot)."""
    return max(1, batch // 64)


def decode_config(batch: int, window: int, tpb: int, pocket: bool, total_tokens: int) -> KVConfig:
    """GPU + host; GPU sized for every sequence's window plus slack, host for the
    tenant's evictions. The same pools with the pocket off and on."""
    per_seq = _ceil(window, tpb) + 4  # in-window blocks + straddle + pocket
    return KVConfig(
        tokens_per_block=tpb,
        life_cycles=(LifeCycle("swa", window=window, priority=20),),
        slots_per_level=(batch * per_seq + 16, batch * 2 + 16),
        num_sequences=batch, max_blocks=_ceil(total_tokens, tpb) + 1,
        pocket=PocketConfig(enabled=pocket),
    )


def _stats(ns: list[int]) -> tuple[float, float]:
    if not ns:
        return 0.0, 0.0
    a = np.asarray(ns, dtype=np.float64) / 1000.0
    return float(np.median(a)), float(np.percentile(a, 99))


def _sum_counters(mgr: Any, seq_ids: Sequence[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for sid in seq_ids:
        for k, v in mgr.counters_of(sid).as_dict().items():
            out[k] = out.get(k, 0) + v
    return out


def run_decode_case(case: DecodeCase, pocket: bool, backend: str = "numpy") -> dict[str, Any]:
    """One decode row (see the module docstring)."""
    from kvpocket.impl.manager import KVCacheManager

    n, w, t, steps = case.batch, case.window, case.tokens_per_block, case.steps
    h0 = w + t  # first measured-ish history: every window block exists
    warm = t + 1  # one retire and one crossing: the pocket is primed
    start = h0 + warm
    cfg = decode_config(n, w, t, pocket, start + steps + 1)
    t_begin = time.perf_counter()
    mgr = KVCacheManager(cfg, backend=backend)
    seqs = []
    for sid in range(n):
        kv = mgr.create(sid)
        if not kv.resume():
            raise RuntimeError("bench config too small")
        kv.stop_committing()
        seqs.append(kv)
    for kv in seqs:  # jump straight into the steady state, then warm the pocket
        if not kv.resize(h0 + 1, h0):
            raise RuntimeError("bench config too small")
    for h in range(h0 + 1, start):
        for kv in seqs:
            kv.resize(h + 1, h)
    ids = [kv.seq_id for kv in seqs]
    c0 = _sum_counters(mgr, ids)
    tot0 = mgr.counters_of().as_dict()
    slots: list[set[int]] = [{int(s) for s in kv.index[0, :kv.num_blocks] if s >= 0} for kv in seqs]
    lc = cfg.life_cycles[0]
    cross: list[int] = []
    retire: list[int] = []
    flat: list[int] = []
    k = pressure_slots(n)
    alloc0 = mgr.storage.allocs[0][0]
    pressure_ok = 0
    crossings = 0
    clock = time.perf_counter_ns
    gc.collect()
    gc_was = gc.isenabled()
    gc.disable()  # a collector pause is not resize()'s cost (stated in the config)
    try:
        for h in range(start, start + steps):
            is_cross = _ceil(h + 1, t) != _ceil(h, t)
            is_retire = stale_range(lc, h, t) != stale_range(lc, h - 1, t)
            buf = cross if is_cross else retire if is_retire else flat
            app = buf.append
            for kv in seqs:
                t0 = clock()
                ok = kv.resize(h + 1, h)
                app(clock() - t0)
                if not ok:
                    raise RuntimeError("out of pages during the benchmark")
            if is_cross:
                crossings += n
                for kv, s in zip(seqs, slots, strict=True):
                    s.add(int(kv.index[0, kv.num_blocks - 1]))
            if case.pressure and mgr.pressure(0, 0, alloc0.num_free + k):
                pressure_ok += 1
    finally:
        if gc_was:
            gc.enable()
    mgr.synchronize()
    c1 = _sum_counters(mgr, ids)
    tot1 = mgr.counters_of().as_dict()
    d = {key: c1.get(key, 0) - c0.get(key, 0) for key in c1}
    tenant_migrations = (tot1["migrations"] - tot0["migrations"]) - d["migrations"]
    violations = len(mgr.check_invariants())
    for kv in seqs:
        kv.close()
    leaks = bool(mgr.shutdown())
    med, p99 = _stats(cross + retire + flat)
    cm, cp = _stats(cross)
    nm, np99 = _stats(retire + flat)
    rm, rp = _stats(retire)
    fm, fp = _stats(flat)
    distinct = [len(s) for s in slots]
    pops, refused = d["pocket_pops"], d["pocket_refusals"]
    per_cross = max(1, crossings)
    return {
        "pocket": pocket, "batch": n, "window": w, "tokens_per_block": t,
        "pressure": case.pressure, "steps": steps, "backend": backend,
        "crossings": crossings,
        "allocator_calls_per_step": d["alloc_calls"] / steps,
        "allocator_calls_per_crossing": d["alloc_calls"] / per_cross,
        "releases_per_step": d["releases"] / steps,
        "events_per_step": d["events_recorded"] / steps,
        "events_per_crossing": d["events_recorded"] / per_cross,
        "cross_stream_waits_per_step": d["cross_stream_waits"] / steps,
        "pocket_parks_per_step": d["pocket_parks"] / steps,
        "pocket_pops_per_step": pops / steps,
        "pocket_refusals_per_step": refused / steps,
        "pop_refusal_share": refused / (pops + refused) if pops + refused else 0.0,
        "tenant_migrations_per_step": tenant_migrations / steps,
        "pressure_slots_per_step": k if case.pressure else 0,
        "pressure_calls_satisfied": pressure_ok if case.pressure else 0,
        "resize_us_median": med, "resize_us_p99": p99,
        "resize_crossing_us_median": cm, "resize_crossing_us_p99": cp,
        "resize_non_crossing_us_median": nm, "resize_non_crossing_us_p99": np99,
        "resize_retire_us_median": rm, "resize_retire_us_p99": rp,
        "resize_flat_us_median": fm, "resize_flat_us_p99": fp,
        "samples": {"crossing": len(cross), "retire": len(retire), "flat": len(flat)},
        "distinct_slots_per_sequence": float(np.mean(distinct)),
        "distinct_slots_per_sequence_max": int(max(distinct)),
        "invariant_violations": violations, "leaks": leaks,
        "seconds": time.perf_counter() - t_begin,
        "config": {
            "tokens_per_block": t, "window": w, "num_sequences": n,
            "slots_per_level": list(cfg.slots_per_level), "max_blocks": cfg.max_blocks,
            "pocket": {"enabled": pocket, "capacity": cfg.pocket.capacity,
                       "policy": cfg.pocket.policy.value},
            "first_history": h0, "warmup_steps": warm, "measured_from_history": start,
            "steps": steps, "commit": "stopped", "backend": backend,
            "gc": "disabled while measuring", "timer": "time.perf_counter_ns around each call",
            "pressure": ({"level": 0, "pool_group": 0, "extra_free_slots_per_step": k}
                         if case.pressure else None),
        },
    }


def run_decode_ab(case: DecodeCase, backend: str) -> list[dict[str, Any]]:
    """Pocket off, then pocket on, for the same configuration."""
    off = run_decode_case(case, False, backend)
    on = run_decode_case(case, True, backend)
    for key in ("resize_us_median", "resize_crossing_us_median", "resize_non_crossing_us_median",
                "resize_us_p99", "resize_crossing_us_p99"):
        on[key.replace("_us_", "_ratio_on_off_")] = (on[key] / off[key]) if off[key] else None
    return [off, on]


# ---- verifier speed -------------------------------------------------------------------
def _quiet() -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    return stack


def bench_fuzz(suite: Suite, out_dir: str) -> list[dict[str, Any]]:
    from .fuzz import CampaignSpec, run_campaign
    from .presets import DEFAULT_PRESET, preset

    rows = []
    workers = [1] + ([os.cpu_count() or 1] if suite.fuzz_all_cores else [])
    for k in workers:
        spec = CampaignSpec(DEFAULT_PRESET, preset(DEFAULT_PRESET), profile="dev",
                            examples=suite.fuzz_examples,
                            minutes=None if suite.fuzz_seconds is None else suite.fuzz_seconds / 60,
                            seed=0, out_dir=str(Path(out_dir) / f"fuzz-{k}"))
        t0 = time.perf_counter()
        with _quiet():
            rep = run_campaign(spec, workers=1, show_progress=False) if k == 1 \
                else _campaign_pool(spec, k)
        rows.append({"config": DEFAULT_PRESET, "profile": "dev", "workers": k,
                     "examples": rep.examples, "steps": rep.steps,
                     "seconds": time.perf_counter() - t0,
                     "steps_per_second": rep.steps_per_second,
                     "failures": len(rep.failures),
                     "budget": ({"examples": suite.fuzz_examples} if suite.fuzz_examples
                                else {"seconds": suite.fuzz_seconds})})
    return rows


def _campaign_pool(spec: Any, workers: int) -> Any:
    """`workers` spawned processes running `fuzz.run_worker`, merged (as `run_campaign`
    does, without its shared progress counter)."""
    import multiprocessing as mp

    from .fuzz import CampaignSpec, merge, run_worker

    per = None if spec.examples is None else max(1, spec.examples // workers)
    specs = [CampaignSpec(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__},
                             "seed": spec.seed + 7919 * i, "examples": per,
                             "out_dir": str(Path(spec.out_dir) / f"w{i}")})
             for i in range(workers)]
    t0 = time.monotonic()
    with mp.get_context("spawn").Pool(workers) as pool:
        reports = pool.map(run_worker, specs)
    return merge(reports, spec, time.monotonic() - t0)


def bench_prove(names: Sequence[str], out_dir: str) -> list[dict[str, Any]]:
    from .prove import DEFAULT_DEPTH, run_prove

    rows = []
    for name in names:
        path = Path(out_dir) / f"prove-{name}.json"
        t0 = time.perf_counter()
        with _quiet():
            rc = run_prove(name, "revalidate", DEFAULT_DEPTH, str(path), str(Path(out_dir) / "prove"))
        secs = time.perf_counter() - t0
        data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        obl = data.get("obligations", [])
        rows.append({"config": name, "policy": "revalidate", "depth": DEFAULT_DEPTH, "rc": rc,
                     "seconds": secs, "obligations": len(obl),
                     "proved": sum(o.get("status") == "proved" for o in obl)})
    return rows


def bench_bmc_unsafe(config_name: str = "gpu-host") -> dict[str, Any]:
    """API-level BMC from Init under `unsafe`: time to the migration-during-park
    counterexample at its minimal depth (every shallower depth is refuted first)."""
    from kvpocket.model.state import Layout

    from .bmc import bmc
    from .prove import PROVE_CONFIGS, UNSAFE_DEPTH

    cfg = PROVE_CONFIGS[config_name].config.with_pocket(True, "unsafe")
    t0 = time.perf_counter()
    r = bmc(Layout(cfg), "api", UNSAFE_DEPTH, timeout_ms=600_000)
    return {"config": config_name, "policy": "unsafe", "layer": "api",
            "max_depth": UNSAFE_DEPTH, "status": r.status, "depth": r.depth, "broken": r.broken,
            "seconds": time.perf_counter() - t0, "solve_seconds": r.seconds,
            "build_seconds": r.build_seconds}


def bench_mutants(json_hint: str | None, budget_s: float = 8.0) -> dict[str, Any]:
    """Mutant time-to-kill through `verify.mutants.run_mutant` (every mutant, `budget_s`
    each); without it, the JSON of a `kvpocket mutants --json` run if present."""
    try:
        from . import mutants as mod
    except ImportError:
        mod = None  # type: ignore[assignment]
    run = getattr(mod, "run_mutant", None) if mod is not None else None
    if run is not None:
        rows = []
        for m in getattr(mod, "MUTANTS", {}).values():
            t0 = time.perf_counter()
            with _quiet(), tempfile.TemporaryDirectory() as td:
                r = run(m, budget_s=budget_s, out_dir=td)
            data = r.to_json()
            data.pop("trace", None)
            data["wall_seconds"] = time.perf_counter() - t0
            rows.append(data)
        return {"source": "verify.mutants.run_mutant", "budget_s": budget_s, "rows": rows}
    for cand in [json_hint, "kvpocket-out/mutants.json", "mutants.json"]:
        if cand and Path(cand).is_file():
            try:
                loaded = json.loads(Path(cand).read_text())
            except (OSError, ValueError):
                continue
            return {"source": cand, "rows": loaded.get("mutants", loaded)
                    if isinstance(loaded, dict) else loaded}
    return {"source": None, "rows": [],
            "note": "verify/mutants.py has no run_mutant and no `kvpocket mutants --json` "
                    "output was found ($KVPOCKET_MUTANTS_JSON, kvpocket-out/mutants.json)"}


# ---- GPU (and, for testing, the simulator) --------------------------------------------
def migration_bandwidth(backend: str, slot_bytes: int = 1 << 20, pages: int = 256,
                        reps: int = 5) -> dict[str, Any]:
    """GPU->host (eviction under pressure) and host->GPU (resume) migration bandwidth of
    `pages` pages of `slot_bytes`, as a ratio to a plain copy of the same bytes between
    the same buffers (one bulk copy, and one copy per slot)."""
    from kvpocket.impl.manager import KVCacheManager

    t = 16
    elems = slot_bytes // 4
    cfg = KVConfig(tokens_per_block=t, life_cycles=(LifeCycle("full"),),
                   slots_per_level=(pages, pages), num_sequences=1, max_blocks=pages)
    mgr = KVCacheManager(cfg, backend=backend, slot_elems=elems)
    kv = mgr.create(0)
    kv.resume()
    kv.stop_committing()
    kv.resize(pages * t, 0)
    gpu, host = mgr.pool(0), mgr.pool(1)
    down: list[float] = []
    up: list[float] = []
    for _ in range(reps):
        mgr.synchronize()
        kv.suspend()
        t0 = time.perf_counter()
        if not mgr.pressure(0, 0, pages):
            raise RuntimeError("migration bench: pressure could not evict")
        mgr.synchronize()
        down.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        if not kv.resume():
            raise RuntimeError("migration bench: resume failed")
        mgr.synchronize()
        up.append(time.perf_counter() - t0)
    migrations = mgr.counters_of().migrations
    plain = _plain_copies(backend, gpu, host, reps)
    kv.close()
    mgr.shutdown()
    nbytes = pages * elems * 4

    def gbps(s: float) -> float:
        return nbytes / s / 1e9

    d, u = float(np.median(down)), float(np.median(up))
    return {
        "backend": backend, "slot_bytes": elems * 4, "pages": pages, "bytes": nbytes,
        "reps": reps, "migrations": migrations,
        "gpu_to_host_GBps": gbps(d), "host_to_gpu_GBps": gbps(u),
        "plain_bulk_gpu_to_host_GBps": gbps(plain["bulk_down"]),
        "plain_bulk_host_to_gpu_GBps": gbps(plain["bulk_up"]),
        "plain_per_slot_gpu_to_host_GBps": gbps(plain["slot_down"]),
        "plain_per_slot_host_to_gpu_GBps": gbps(plain["slot_up"]),
        "gpu_to_host_ratio_vs_bulk": plain["bulk_down"] / d,
        "host_to_gpu_ratio_vs_bulk": plain["bulk_up"] / u,
        "gpu_to_host_ratio_vs_per_slot": plain["slot_down"] / d,
        "host_to_gpu_ratio_vs_per_slot": plain["slot_up"] / u,
        "config": {"life_cycles": "one full-attention", "slots_per_level": [pages, pages],
                   "tokens_per_block": t, "dtype": "int32", "timing": "median of reps, "
                   "wall clock around the API call plus a full synchronize"},
    }


def _plain_copies(backend: str, gpu: Any, host: Any, reps: int) -> dict[str, float]:
    """Median seconds of plain copies between the same two buffers."""
    if backend == "cupy":
        import cupy

        stream = cupy.cuda.Stream(non_blocking=True)

        def bulk_down() -> None:
            gpu.get(stream=stream, out=host)
            stream.synchronize()

        def bulk_up() -> None:
            gpu.set(host, stream=stream)
            stream.synchronize()

        def slot_down() -> None:
            for i in range(gpu.shape[0]):
                gpu[i].get(stream=stream, out=host[i])
            stream.synchronize()

        def slot_up() -> None:
            for i in range(gpu.shape[0]):
                gpu[i].set(host[i], stream=stream)
            stream.synchronize()
    else:
        def bulk_down() -> None:
            np.copyto(host, gpu)

        def bulk_up() -> None:
            np.copyto(gpu, host)

        def slot_down() -> None:
            for i in range(gpu.shape[0]):
                host[i] = gpu[i]

        def slot_up() -> None:
            for i in range(gpu.shape[0]):
                gpu[i] = host[i]

    out: dict[str, float] = {}
    for name, fn in (("bulk_down", bulk_down), ("bulk_up", bulk_up),
                     ("slot_down", slot_down), ("slot_up", slot_up)):
        fn()  # warm
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        out[name] = float(np.median(ts))
    return out


def oracle_throughput(backend: str, batch: int = 64, steps: int = 128, window: int = 128,
                      tpb: int = 32) -> dict[str, Any]:
    """Decode steps (resize + stamp write + window read) per second through the data
    oracle, and token positions verified per second."""
    from kvpocket.impl.manager import KVCacheManager
    from kvpocket.impl.oracle import DecodeOracle

    cfg = decode_config(batch, window, tpb, True, steps + 2)
    mgr = KVCacheManager(cfg, backend=backend, slot_elems=tpb * 4)
    oracle = DecodeOracle(mgr)
    seqs = []
    for sid in range(batch):
        kv = mgr.create(sid)
        kv.resume()
        kv.stop_committing()
        seqs.append(kv)
    t0 = time.perf_counter()
    checked = 0
    for h in range(steps):
        for kv in seqs:
            if not oracle.decode_step(kv, verify=True):
                raise RuntimeError("oracle bench: out of pages")
        checked += batch * min(h + 1, window)
        if (h + 1) % 16 == 0:
            oracle.check()
    oracle.check()
    secs = time.perf_counter() - t0
    bad = len(oracle.mismatches) + len(oracle.missing)
    for kv in seqs:
        kv.close()
    mgr.shutdown()
    return {"backend": backend, "batch": batch, "steps": steps, "window": window,
            "tokens_per_block": tpb, "slot_elems": tpb * 4, "seconds": secs,
            "decode_steps_per_second": batch * steps / secs,
            "verified_positions_per_second": checked / secs, "mismatches": bad,
            "config": {"check_every_steps": 16, "pocket": "on (revalidate)"}}


# ---- CLI ------------------------------------------------------------------------------
def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", default="default", metavar="NAME",
                        help="one of " + ", ".join(SUITES) + " (default default); see --list")
    parser.add_argument("--backend", default=None, metavar="B",
                        help="numpy (default) or cupy for the decode rows (the gpu suite uses cupy)")
    parser.add_argument("--json", dest="json_path", default=None, metavar="FILE",
                        help="write every number, with its configuration, to FILE")
    parser.add_argument("--plots", default=None, metavar="DIR",
                        help="write PNG plots (matplotlib, Agg) to DIR")
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
    if backend == "cupy" or suite.gpu:
        from kvpocket.impl.backend import gpu_available

        if not gpu_available():
            what = "the gpu suite" if suite.gpu else "--backend cupy"
            raise BenchUsageError(f"argument {'--suite' if suite.gpu else '--backend'}: {what} "
                                  "needs CuPy and a usable CUDA GPU; none was found "
                                  "(gpu_available() is False)")
    for opt in ("json_path", "plots"):
        v = getattr(args, opt)
        if v is not None and not str(v).strip():
            name = "--json" if opt == "json_path" else "--plots"
            raise BenchUsageError(f"argument {name}: expected a path, got an empty string")
    return suite, backend


@dataclass
class BenchResult:
    suite: str
    backend: str
    machine: dict[str, Any]
    suite_config: dict[str, Any]
    decode: list[dict[str, Any]] = field(default_factory=list)
    scaling: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    verifier: dict[str, Any] = field(default_factory=dict)
    gpu: dict[str, Any] | None = None
    plots: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"suite": self.suite, "backend": self.backend, "machine": self.machine,
                "config": self.suite_config, "decode": self.decode, "scaling": self.scaling,
                "verifier": self.verifier, "gpu": self.gpu, "plots": self.plots,
                "seconds": self.seconds,
                "regenerate": f"kvpocket bench --suite {self.suite} --backend {self.backend} "
                              "--json FILE --plots DIR"}


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
        res.verifier["mutants"] = bench_mutants(os.environ.get("KVPOCKET_MUTANTS_JSON"))
    if suite.gpu:
        log("gpu: migration bandwidth, oracle throughput")
        res.gpu = {"migration": migration_bandwidth(backend),
                   "oracle": oracle_throughput(backend)}
    res.seconds = time.perf_counter() - t_all
    return res


def _fmt(v: Any, nd: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def print_result(res: BenchResult) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    m = res.machine
    con.print(f"[bold]kvpocket bench[/] suite {res.suite}, backend {res.backend}; python "
              f"{m['python']}, numpy {m['numpy']}, {m['cpu_count']} cpus; {res.seconds:.1f} s")
    if res.decode:
        con.print("decode: lockstep SWA decode, committing stopped, steady state after one block "
                  "period of warm-up; pressure = a tenant asks GPU for max(1, batch/64) more "
                  "free slots per step. Counts per decode step of the batch; times per "
                  "resize() call in µs; ratio = pocket-on / pocket-off.")
        _decode_table(con, Table, "decode A/B (pocket off vs on)", res.decode)
    for name, rows in res.scaling.items():
        _decode_table(con, Table, f"scaling against {name}", rows)
    fz = res.verifier.get("fuzz")
    if fz:
        tb = Table(title="verifier: lockstep fuzz (preset two-level, profile dev)")
        for c in ("workers", "examples", "steps", "seconds", "steps/s", "failures"):
            tb.add_column(c, justify="right")
        for r in fz:
            tb.add_row(str(r["workers"]), str(r["examples"]), str(r["steps"]),
                       _fmt(r["seconds"], 1), _fmt(r["steps_per_second"], 1), str(r["failures"]))
        con.print(tb)
    pv = res.verifier.get("prove")
    if pv:
        tb = Table(title="verifier: prove per configuration (policy revalidate)")
        for c in ("config", "depth", "obligations", "proved", "rc", "seconds"):
            tb.add_column(c, justify="right")
        for r in pv:
            tb.add_row(r["config"], str(r["depth"]), str(r["obligations"]), str(r["proved"]),
                       str(r["rc"]), _fmt(r["seconds"], 1))
        con.print(tb)
    b = res.verifier.get("bmc_unsafe")
    if b:
        con.print(f"verifier: BMC from Init ({b['config']}, policy unsafe, layer {b['layer']}, "
                  f"max depth {b['max_depth']}): {b['status']} at depth {b['depth']} "
                  f"({', '.join(b['broken'])}) in {b['seconds']:.1f} s "
                  f"(unrolling {b['build_seconds']:.1f} s)")
    mu = res.verifier.get("mutants")
    if mu is not None:
        if mu["rows"]:
            tb = Table(title=f"verifier: mutant time-to-kill (from {mu['source']})")
            for c in ("mutant", "layer", "killed", "time to kill s", "detectors"):
                tb.add_column(c)
            for r in mu["rows"]:
                if isinstance(r, dict):
                    tb.add_row(str(r.get("name", "?")), str(r.get("layer", "")),
                               _fmt(r.get("killed")), _fmt(r.get("seconds")),
                               ", ".join(r.get("detectors", [])))
            con.print(tb)
        else:
            con.print(f"verifier: mutant time-to-kill: {mu.get('note')}")
    if res.gpu:
        mg, orc = res.gpu["migration"], res.gpu["oracle"]
        con.print(f"gpu: migration of {mg['pages']} x {mg['slot_bytes']} B: GPU->host "
                  f"{mg['gpu_to_host_GBps']:.2f} GB/s ({mg['gpu_to_host_ratio_vs_bulk']:.2f} of a "
                  f"plain bulk copy, {mg['gpu_to_host_ratio_vs_per_slot']:.2f} of per-slot copies); "
                  f"host->GPU {mg['host_to_gpu_GBps']:.2f} GB/s "
                  f"({mg['host_to_gpu_ratio_vs_bulk']:.2f} / {mg['host_to_gpu_ratio_vs_per_slot']:.2f})")
        con.print(f"gpu: data oracle {orc['batch']} seqs x {orc['steps']} steps: "
                  f"{orc['decode_steps_per_second']:.0f} decode steps/s, "
                  f"{orc['verified_positions_per_second']:.0f} verified positions/s, "
                  f"{orc['mismatches']} mismatches")


def _decode_table(con: Any, table_cls: Any, title: str, rows: list[dict[str, Any]]) -> None:
    head = ("batch", "w/t", "press.", "pocket")

    def key(r: dict[str, Any]) -> list[str]:
        return [str(r["batch"]), f"{r['window']}/{r['tokens_per_block']}", _fmt(r["pressure"]),
                "on" if r["pocket"] else "off"]

    tb = table_cls(title=f"{title}: traffic per decode step (whole batch)")
    for c in (*head, "alloc", "alloc/cross", "releases", "events", "events/cross", "waits",
              "slots/seq", "refused"):
        tb.add_column(c, justify="right")
    for r in rows:
        tb.add_row(*key(r), _fmt(r["allocator_calls_per_step"]),
                   _fmt(r["allocator_calls_per_crossing"]), _fmt(r["releases_per_step"]),
                   _fmt(r["events_per_step"]), _fmt(r["events_per_crossing"]),
                   _fmt(r["cross_stream_waits_per_step"]), _fmt(r["distinct_slots_per_sequence"], 1),
                   f"{r['pop_refusal_share']:.0%}" if r["pocket"] and r["pressure"] else "-")
    con.print(tb)
    tb = table_cls(title=f"{title}: resize() per sequence, µs (ratio: pocket on / off)")
    for c in (*head, "median", "p99", "cross med", "cross p99", "non-cross med", "non-cross p99",
              "ratio med", "ratio cross"):
        tb.add_column(c, justify="right")
    for r in rows:
        tb.add_row(*key(r), _fmt(r["resize_us_median"]), _fmt(r["resize_us_p99"]),
                   _fmt(r["resize_crossing_us_median"]), _fmt(r["resize_crossing_us_p99"]),
                   _fmt(r["resize_non_crossing_us_median"]), _fmt(r["resize_non_crossing_us_p99"]),
                   _fmt(r.get("resize_ratio_on_off_median")),
                   _fmt(r.get("resize_crossing_ratio_on_off_median")))
    con.print(tb)


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

    def log(msg: str) -> None:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)

    with contextlib.ExitStack() as stack:
        out_dir = args.bench_out or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="kvpocket-bench-"))
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        res = run_suite(suite, backend, out_dir, log)
    if args.plots:
        from .bench_plots import write_plots

        res.plots = write_plots(res.to_json(), args.plots)
    print_result(res)
    if args.json_path:
        p = Path(args.json_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(res.to_json(), indent=1) + "\n")
        print(f"wrote {p}")
    if res.plots:
        print("plots: " + ", ".join(res.plots))
    bad = [r for r in res.decode + [x for v in res.scaling.values() for x in v]
           if r["invariant_violations"] or r["leaks"]]
    if bad:
        print(f"kvpocket bench: {len(bad)} rows ended with invariant violations or leaks",
              file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvpocket bench", description=run_bench.__doc__)
    add_bench_arguments(parser)
    return run_bench(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
