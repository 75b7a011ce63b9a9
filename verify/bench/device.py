"""Backend throughput: migration and batched-copy bandwidth against a plain bulk copy of
the same bytes, and the data oracle's verified positions per second.

Every function runs on the simulator too (`backend="numpy"`: host memcpy, so its
bandwidth figures say nothing about a GPU; the smoke test runs them tiny so the code
is exercised). On CuPy the copies are the real DMA paths of `CupyBackend`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kvpocket.impl.backend import make_backend
from kvpocket.impl.manager import KVCacheManager
from kvpocket.model.config import KVConfig, LifeCycle
from kvpocket.verify.bench.decode import decode_config
from kvpocket.verify.oracles.data import DecodeOracle


def _median(ts: list[float]) -> float:
    return float(np.median(ts))


def _gbps(nbytes: int, s: float) -> float:
    return nbytes / s / 1e9


# ---- plain copies (the reference) ------------------------------------------------------
def _plain_copies(backend: str, gpu: Any, host: Any, reps: int) -> dict[str, float]:
    """Median seconds of plain copies between the same two buffers: one bulk copy, and
    one copy per slot, each direction (CuPy: raw async DMA on a non-blocking stream, then
    one synchronize)."""
    fns: dict[str, Callable[[], None]]
    if backend == "cupy":
        # optional: CuPy exists only on a GPU machine
        import cupy

        stream = cupy.cuda.Stream(non_blocking=True)
        rb = gpu.shape[1] * gpu.dtype.itemsize
        hp = int(host.ctypes.data)

        def bulk_down() -> None:
            gpu.data.copy_to_host_async(hp, gpu.nbytes, stream)
            stream.synchronize()

        def bulk_up() -> None:
            gpu.data.copy_from_host_async(hp, gpu.nbytes, stream)
            stream.synchronize()

        def slot_down() -> None:
            for i in range(gpu.shape[0]):
                gpu[i].data.copy_to_host_async(hp + i * rb, rb, stream)
            stream.synchronize()

        def slot_up() -> None:
            for i in range(gpu.shape[0]):
                gpu[i].data.copy_from_host_async(hp + i * rb, rb, stream)
            stream.synchronize()

        fns = {"bulk_down": bulk_down, "bulk_up": bulk_up, "slot_down": slot_down,
               "slot_up": slot_up}
    else:
        def np_bulk_down() -> None:
            np.copyto(host, gpu)

        def np_bulk_up() -> None:
            np.copyto(gpu, host)

        def np_slot_down() -> None:
            for i in range(gpu.shape[0]):
                host[i] = gpu[i]

        def np_slot_up() -> None:
            for i in range(gpu.shape[0]):
                gpu[i] = host[i]

        fns = {"bulk_down": np_bulk_down, "bulk_up": np_bulk_up, "slot_down": np_slot_down,
               "slot_up": np_slot_up}
    out: dict[str, float] = {}
    for name, fn in fns.items():
        fn()  # warm
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        out[name] = _median(ts)
    return out


# ---- migration through the manager -----------------------------------------------------
def migration_bandwidth(backend: str, slot_bytes: int = 1 << 20, pages: int = 256,
                        reps: int = 5, copy_mode: str = "auto") -> dict[str, Any]:
    """GPU->host (eviction under pressure: one `pressure` call) and host->GPU (one
    `resume`) migration bandwidth of `pages` pages of `slot_bytes`, as a ratio to a plain
    bulk copy of the same bytes between the same buffers (and to one copy per slot).

    Timed end to end: the API call (the manager's bookkeeping, then the batched copies
    it enqueues when the operation commits) plus a full synchronize. `*_api_ms` is the
    API call alone; the copies only start at its end, so `wall - api` is the copy
    phase, reported as `*_copy_phase_ratio_vs_bulk` (bookkeeping excluded)."""
    t = 16
    elems = slot_bytes // 4
    cfg = KVConfig(tokens_per_block=t, life_cycles=(LifeCycle("full"),),
                   slots_per_level=(pages, pages), num_sequences=1, max_blocks=pages)
    options = {"copy_mode": copy_mode} if backend == "cupy" else {}
    mgr = KVCacheManager(cfg, backend=backend, slot_elems=elems, backend_options=options)
    kv = mgr.create(0)
    kv.resume()
    kv.stop_committing()
    kv.resize(pages * t, 0)
    gpu, host = mgr.pool(0), mgr.pool(1)
    down: list[float] = []
    up: list[float] = []
    down_api: list[float] = []
    up_api: list[float] = []
    for _ in range(reps + 1):  # the first round warms up (kernels, pinned pool, caches)
        mgr.synchronize()
        kv.suspend()
        t0 = time.perf_counter()
        if not mgr.pressure(0, 0, pages):
            raise RuntimeError("migration bench: pressure could not evict")
        t1 = time.perf_counter()
        mgr.synchronize()
        t2 = time.perf_counter()
        if not kv.resume():
            raise RuntimeError("migration bench: resume failed")
        t3 = time.perf_counter()
        mgr.synchronize()
        t4 = time.perf_counter()
        down.append(t2 - t0)
        down_api.append(t1 - t0)
        up.append(t4 - t2)
        up_api.append(t3 - t2)
    down, down_api, up, up_api = down[1:], down_api[1:], up[1:], up_api[1:]
    counts = mgr.counters_of()
    plain = _plain_copies(backend, gpu, host, reps)
    kv.close()
    mgr.shutdown()
    nbytes = pages * elems * 4
    d, u = _median(down), _median(up)
    # After the API call returns, only the copies it enqueued at commit are left: the
    # wall time after the call is the copy phase (bookkeeping excluded).
    d_copy = _median([w - a for w, a in zip(down, down_api, strict=True)])
    u_copy = _median([w - a for w, a in zip(up, up_api, strict=True)])
    return {
        "backend": backend, "copy_mode": copy_mode, "slot_bytes": elems * 4, "pages": pages,
        "bytes": nbytes, "reps": reps, "migrations": counts.migrations,
        "copy_events": counts.events_recorded,
        "gpu_to_host_GBps": _gbps(nbytes, d), "host_to_gpu_GBps": _gbps(nbytes, u),
        "gpu_to_host_api_ms": 1e3 * _median(down_api),
        "host_to_gpu_api_ms": 1e3 * _median(up_api),
        "plain_bulk_gpu_to_host_GBps": _gbps(nbytes, plain["bulk_down"]),
        "plain_bulk_host_to_gpu_GBps": _gbps(nbytes, plain["bulk_up"]),
        "plain_per_slot_gpu_to_host_GBps": _gbps(nbytes, plain["slot_down"]),
        "plain_per_slot_host_to_gpu_GBps": _gbps(nbytes, plain["slot_up"]),
        "gpu_to_host_ratio_vs_bulk": plain["bulk_down"] / d,
        "host_to_gpu_ratio_vs_bulk": plain["bulk_up"] / u,
        "gpu_to_host_copy_phase_ratio_vs_bulk": plain["bulk_down"] / d_copy,
        "host_to_gpu_copy_phase_ratio_vs_bulk": plain["bulk_up"] / u_copy,
        "gpu_to_host_ratio_vs_per_slot": plain["slot_down"] / d,
        "host_to_gpu_ratio_vs_per_slot": plain["slot_up"] / u,
        "config": {"life_cycles": "one full-attention", "slots_per_level": [pages, pages],
                   "tokens_per_block": t, "dtype": "int32", "timing": "median of reps after "
                   "one warm-up round, wall clock around the API call plus a full synchronize"},
    }


# ---- the backend's batched copy alone --------------------------------------------------
def copy_slots_bandwidth(backend: str, slot_bytes: int = 1 << 20, pages: int = 256,
                         reps: int = 5, pattern: str = "contiguous", copy_mode: str = "auto",
                         seed: int = 0) -> dict[str, Any]:
    """`Backend.copy_slots` of `pages` slots GPU->host and host->GPU on one stream, as a
    ratio to one plain bulk copy of the same bytes. `pattern`: "contiguous" (slot i to
    slot i), "scattered" (a random permutation on both sides: the worst layout)."""
    if pattern not in ("contiguous", "scattered"):
        raise ValueError(f"pattern must be contiguous or scattered, got {pattern!r}")
    be = make_backend(backend, **({"copy_mode": copy_mode} if backend == "cupy" else {}))
    elems = slot_bytes // 4
    gpu = be.create_pool(0, pages, elems, np.int32)
    host = be.create_pool(1, pages, elems, np.int32)
    stream = be.new_stream("copy")
    rng = np.random.default_rng(seed)
    if pattern == "contiguous":
        src = dst = np.arange(pages)
    else:
        src, dst = rng.permutation(pages), rng.permutation(pages)

    def run(dst_pool: Any, src_pool: Any) -> float:
        ev = be.new_event()
        t0 = time.perf_counter()
        be.copy_slots(stream, dst_pool, dst.tolist(), src_pool, src.tolist())
        be.record(ev, stream)
        be.synchronize(ev)
        return time.perf_counter() - t0

    stamp = be.create_pool(1, pages, elems, np.int32)  # row i holds i everywhere
    stamp[:] = np.arange(pages, dtype=np.int32)[:, None]
    out: dict[str, list[float]] = {"down": [], "up": []}
    for i in range(reps + 1):
        be.copy_slots(stream, gpu, list(range(pages)), stamp, list(range(pages)))
        for name, d_pool, s_pool in (("down", host, gpu), ("up", gpu, host)):
            dt = run(d_pool, s_pool)
            if i:
                out[name].append(dt)
    # the last round: gpu (row i = i) -> host, then host -> gpu, through the same pairs
    want = np.arange(pages)
    down_once = np.empty(pages, dtype=np.int64)
    down_once[dst] = want[src]
    up_once = np.empty(pages, dtype=np.int64)
    up_once[dst] = down_once[src]
    got = be.to_numpy(gpu)
    if not ((got[:, 0] == up_once).all() and (got == got[:, :1]).all()):
        raise RuntimeError("copy_slots bench: the copies moved the wrong rows")
    plain = _plain_copies(backend, gpu, host, reps)
    be.close()
    nbytes = pages * elems * 4
    d, u = _median(out["down"]), _median(out["up"])
    return {"backend": backend, "pattern": pattern, "copy_mode": copy_mode, "pages": pages,
            "slot_bytes": elems * 4, "bytes": nbytes,
            "gpu_to_host_GBps": _gbps(nbytes, d), "host_to_gpu_GBps": _gbps(nbytes, u),
            "gpu_to_host_ratio_vs_bulk": plain["bulk_down"] / d,
            "host_to_gpu_ratio_vs_bulk": plain["bulk_up"] / u}


# ---- the data oracle -------------------------------------------------------------------
def _decoding_batch(mgr: Any, oracle: Any, batch: int, prefill: int) -> list[Any]:
    """`batch` sequences decoding (committing stopped), each prefilled with `prefill`
    tokens the oracle knows."""
    seqs = []
    for sid in range(batch):
        kv = mgr.create(sid)
        kv.resume()
        kv.stop_committing()
        if prefill:
            if not kv.resize(prefill, prefill - 1):
                raise RuntimeError("oracle bench: out of pages in the prefill")
            oracle.prefill(kv, [oracle.token_for(sid, p) for p in range(prefill)])
        seqs.append(kv)
    return seqs


def oracle_throughput(backend: str, batch: int | None = None, steps: int | None = None,
                      window: int | None = None, tpb: int = 32, prefill: int | None = None,
                      check_every: int | None = None, mode: str = "sweep",
                      slot_elems: int | None = None) -> dict[str, Any]:
    """Verified token positions per second of the data oracle, timed over the oracle's
    own work (the checks), next to the decode loop's steps per second.

    A decode loop (`resize` + stamp write per sequence and step) after an optional
    prefill of `prefill` tokens per sequence; every `check_every` steps the oracle
    checks every sequence's window: `mode="sweep"` (one vectorized pass over all
    sequences) or `mode="reads"` (a `verify` read per sequence and step on its own
    stream, compared by `check`). Defaults: on NumPy 64 sequences, window 128, 128
    steps, a check every 16 (the configuration of the before/after figure); on CuPy a
    real batch: 256 sequences with 4096-token windows, prefilled, 32 steps, a sweep
    every 4 (a million positions per sweep). The first check is a warm-up, untimed."""
    if mode not in ("sweep", "reads"):
        raise ValueError(f"mode must be sweep or reads, got {mode!r}")
    big = backend == "cupy"
    batch = batch if batch is not None else (256 if big else 64)
    window = window if window is not None else (4096 if big else 128)
    steps = steps if steps is not None else (32 if big else 128)
    prefill = prefill if prefill is not None else (window if big else 0)
    check_every = check_every if check_every is not None else (4 if big else 16)
    cfg = decode_config(batch, window, tpb, True, prefill + steps + 2)
    mgr = KVCacheManager(cfg, backend=backend, slot_elems=slot_elems or tpb * 4)
    oracle = DecodeOracle(mgr)
    seqs = _decoding_batch(mgr, oracle, batch, prefill)
    check_secs = 0.0
    checks = 0
    warm_positions = 0
    t_all = time.perf_counter()
    for h in range(steps):
        for kv in seqs:
            if not oracle.decode_step(kv, verify=False):
                raise RuntimeError("oracle bench: out of pages")
            if mode == "reads":
                t0 = time.perf_counter()
                oracle.verify(kv)
                check_secs += time.perf_counter() - t0 if checks else 0.0
        if (h + 1) % check_every == 0 or h == steps - 1:
            before = oracle.verified_positions
            t0 = time.perf_counter()
            if mode == "sweep":
                oracle.sweep()
            else:
                oracle.check()
            dt = time.perf_counter() - t0
            if checks:
                check_secs += dt
            else:
                warm_positions = oracle.verified_positions - before
            checks += 1
    secs = time.perf_counter() - t_all
    bad = len(oracle.mismatches) + len(oracle.missing)
    positions = oracle.verified_positions - warm_positions
    for kv in seqs:
        kv.close()
    mgr.shutdown()
    return {"backend": backend, "mode": mode, "batch": batch, "steps": steps,
            "window": window, "tokens_per_block": tpb, "prefill": prefill,
            "slot_elems": slot_elems or tpb * 4, "checks": checks, "seconds": secs,
            "check_seconds": check_secs, "verified_positions": positions,
            "decode_steps_per_second": batch * steps / secs,
            "verified_positions_per_second": positions / check_secs if check_secs else 0.0,
            "mismatches": bad,
            "config": {"check_every_steps": check_every, "pocket": "on (revalidate)",
                       "timing": "oracle work only (verify reads + checks, or sweeps); "
                                 "the first check is an untimed warm-up"}}


def oracle_ab(old_oracle: str, batch: int = 64, window: int = 128, steps: int = 128,
              prefill: int = 0, reps: int = 3) -> dict[str, Any]:
    """Before/after of the NumPy data oracle, like for like: the `DecodeOracle` of the file
    `old_oracle` (e.g. `git show REV:verify/oracles/data.py > old.py`) against the current one on
    the same decode loop and the same verified positions. Oracle CPU time only
    (`time.process_time`, so other jobs on the machine do not count); best of `reps`
    interleaved runs. Rows: "old reads" (`verify` per sequence and step, `check` every 16
    steps), "new reads" (the same calls), "new sweep" (`sweep()` every step)."""
    spec = importlib.util.spec_from_file_location("kvpocket.impl._oracle_before", old_oracle)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load {old_oracle!r}")
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old  # dataclasses resolve their module
    spec.loader.exec_module(old)

    def run(cls: Any, sweep: bool) -> tuple[float, int]:
        cfg = decode_config(batch, window, 32, True, prefill + steps + 2)
        mgr = KVCacheManager(cfg, backend="numpy", slot_elems=128)
        o = cls(mgr)
        seqs = _decoding_batch(mgr, o, batch, prefill)
        secs, positions = 0.0, 0
        for h in range(steps):
            for kv in seqs:
                if not o.decode_step(kv, verify=False):
                    raise RuntimeError("oracle A/B: out of pages")
                if not sweep:
                    t0 = time.process_time()
                    o.verify(kv)
                    secs += time.process_time() - t0
            positions += batch * min(prefill + h + 1, window)
            if sweep or (h + 1) % 16 == 0:
                t0 = time.process_time()
                o.sweep() if sweep else o.check()
                secs += time.process_time() - t0
        t0 = time.process_time()
        o.check()
        secs += time.process_time() - t0
        if o.mismatches or o.missing:
            raise RuntimeError("oracle A/B: the oracle reported a mismatch")
        mgr.shutdown()
        return positions / secs, positions

    best: dict[str, float] = {}
    positions = 0
    for _ in range(reps):
        for name, cls, sweep in (("old reads", old.DecodeOracle, False),
                                 ("new reads", DecodeOracle, False),
                                 ("new sweep", DecodeOracle, True)):
            rate, positions = run(cls, sweep)
            best[name] = max(best.get(name, 0.0), rate)
    return {"positions": positions, "positions_per_cpu_second": best,
            "sweep_speedup": best["new sweep"] / best["old reads"],
            "reads_speedup": best["new reads"] / best["old reads"],
            "config": {"batch": batch, "window": window, "steps": steps, "prefill": prefill,
                       "tokens_per_block": 32, "slot_elems": 128, "reps": reps}}


# ---- scripts/gpu_suite.sh helpers (testable on the simulator) ---------------------------
TARGET_MIGRATION_RATIO = 0.9
TARGET_ORACLE_POSITIONS_PER_S = 1e8


def suite_extras(out_dir: str, backend: str = "cupy", small: bool = False) -> dict[str, Any]:
    """Step 2 of the GPU suite: migration bandwidth per copy strategy (`auto` is the bench
    suite's own measurement, run here first so the targets are measured even if the
    decode A/B runs out of time), the oracle's sweep at the target configuration, the
    batched copy alone on contiguous and scattered slots, the oracle's stream-read path;
    written to `out_dir/device-extras.json` after each measurement (a timeout keeps what
    is done). `small`: tiny sizes, for a simulator dry run."""
    size = {"slot_bytes": 4096, "pages": 16} if small else {}
    res: dict[str, Any] = {}
    path = Path(out_dir) / "device-extras.json"

    def save() -> None:
        path.write_text(json.dumps(res, indent=1))

    for mode in ("auto", "runs", "staged"):
        res[f"migration_{mode}"] = migration_bandwidth(backend, reps=3, copy_mode=mode, **size)
        save()
    res["oracle_sweep"] = (oracle_throughput(backend, batch=8, window=64, steps=8, prefill=64,
                                             check_every=2) if small
                           else oracle_throughput(backend))  # the target configuration
    save()
    for pattern in ("contiguous", "scattered"):
        for mode in ("auto", "staged"):
            res[f"copy_slots_{pattern}_{mode}"] = copy_slots_bandwidth(
                backend, pattern=pattern, copy_mode=mode, reps=3, **size)
            save()
    res["oracle_reads"] = oracle_throughput(backend, batch=8 if small else 64, window=128,
                                            steps=32 if small else 64, prefill=0,
                                            check_every=16, mode="reads")
    save()
    return res


def suite_summary(out_dir: str, runs: int, passed: int) -> dict[str, Any]:
    """The last step of the GPU suite: per-test pass counts from the runs' JUnit files, the
    bench suite's migration and oracle figures, the extras, and the targets met or
    missed; written to `out_dir/gpu-summary.json`."""
    out = Path(out_dir)
    per_test: dict[str, int] = {}
    for path in sorted(out.glob("gpu-tests-*.xml")):
        for case in ET.parse(path).getroot().iter("testcase"):
            tid = f"{case.get('classname')}::{case.get('name')}"
            ok = not any(c.tag in ("failure", "error", "skipped") for c in case)
            per_test[tid] = per_test.get(tid, 0) + int(ok)
    chain = [v for k, v in per_test.items()
             if k.endswith("test_copy_slot_all_level_pairs_and_events")]

    def load(name: str) -> dict[str, Any]:
        p = out / name
        data: dict[str, Any] = json.loads(p.read_text()) if p.exists() else {}
        return data

    gpu = load("bench-gpu.json").get("gpu") or {}
    extras = load("device-extras.json")
    # the bench suite's figures; the extras' own run of the same calls if it did not finish
    mig = gpu.get("migration") or extras.get("migration_auto", {})
    orc = gpu.get("oracle") or extras.get("oracle_sweep", {})
    down = mig.get("gpu_to_host_ratio_vs_bulk") or 0.0
    up = mig.get("host_to_gpu_ratio_vs_bulk") or 0.0
    rate = orc.get("verified_positions_per_second") or 0.0
    summary: dict[str, Any] = {
        "test_runs": runs, "test_runs_passed": passed, "per_test_passes": per_test,
        "copy_chain_passes": chain[0] if chain else 0,
        "migration": {k: mig.get(k) for k in (
            "gpu_to_host_GBps", "host_to_gpu_GBps", "plain_bulk_gpu_to_host_GBps",
            "plain_bulk_host_to_gpu_GBps", "gpu_to_host_ratio_vs_bulk",
            "host_to_gpu_ratio_vs_bulk", "gpu_to_host_copy_phase_ratio_vs_bulk",
            "host_to_gpu_copy_phase_ratio_vs_bulk", "gpu_to_host_api_ms",
            "host_to_gpu_api_ms")},
        "oracle_verified_positions_per_second": orc.get("verified_positions_per_second"),
        "extras": extras,
    }
    summary["targets"] = {
        "tests 10/10": passed == 10 and summary["copy_chain_passes"] == 10,
        f"migration GPU->host >= {TARGET_MIGRATION_RATIO} of bulk":
            down >= TARGET_MIGRATION_RATIO,
        f"migration host->GPU >= {TARGET_MIGRATION_RATIO} of bulk":
            up >= TARGET_MIGRATION_RATIO,
        "oracle >= 1e8 positions/s": rate >= TARGET_ORACLE_POSITIONS_PER_S,
    }
    (out / "gpu-summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    """`python -m kvpocket.verify.bench.device extras OUT [--backend B] [--small]` or
    `... summary OUT RUNS PASSED` (exit 1 when a target is missed)."""
    p = argparse.ArgumentParser(prog="kvpocket.verify.bench.device")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extras")
    e.add_argument("out")
    e.add_argument("--backend", default="cupy", choices=("cupy", "numpy"))
    e.add_argument("--small", action="store_true")
    s = sub.add_parser("summary")
    s.add_argument("out")
    s.add_argument("runs", type=int)
    s.add_argument("passed", type=int)
    args = p.parse_args(argv)
    if args.cmd == "extras":
        suite_extras(args.out, args.backend, args.small)
        print(f"extras written to {args.out}/device-extras.json")
        return 0
    summary = suite_summary(args.out, args.runs, args.passed)
    print(f"gpu tests: {args.passed}/{args.runs} runs passed; copy chain "
          f"{summary['copy_chain_passes']}/10")
    for k, v in summary["migration"].items():
        print(f"migration {k}: {v}")
    print(f"oracle verified positions/s: {summary['oracle_verified_positions_per_second']}")
    for k, ok in summary["targets"].items():
        print(f"target {k}: {'met' if ok else 'MISSED'}")
    return 0 if all(summary["targets"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
