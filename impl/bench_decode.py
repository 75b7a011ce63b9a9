"""Steady-state decode benchmark, pocket off vs on (NumPy backend by default).

`run_decode_bench()` returns a plain dict; the CLI is wired elsewhere.
Per decode step and per sequence it reports allocator calls, events recorded
and cross-stream waits, and the wall time of `resize()` split into
boundary-crossing and non-crossing steps (median and p99, microseconds).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from kvpocket.model.config import KVConfig, LifeCycle, PocketConfig

from .manager import KVCacheManager


def _config(n: int, window: int, tpb: int, pocket: bool, steps: int, warmup: int) -> KVConfig:
    per_seq = -(-window // tpb) + 4  # in-window blocks + straddle + pocket
    total_tokens = warmup + steps + 1
    return KVConfig(
        tokens_per_block=tpb,
        life_cycles=(LifeCycle("swa", window=window, priority=20),),
        slots_per_level=(n * per_seq + 16,),
        num_sequences=n, max_blocks=-(-total_tokens // tpb) + 1,
        pocket=PocketConfig(enabled=pocket),
    )


def _run_one(n: int, window: int, tpb: int, pocket: bool, steps: int, warmup: int,
             backend: str) -> dict[str, Any]:
    mgr = KVCacheManager(_config(n, window, tpb, pocket, steps, warmup), backend=backend)
    seqs = []
    for sid in range(n):
        kv = mgr.create(sid)
        if not kv.resume():
            raise RuntimeError("bench config too small")
        kv.stop_committing()
        seqs.append(kv)
    h0 = warmup
    for kv in seqs:  # jump straight into the steady state, then warm the pocket
        if not kv.resize(h0 + 1, h0):
            raise RuntimeError("bench config too small")
    for h in range(h0 + 1, h0 + 2 * tpb):
        for kv in seqs:
            kv.resize(h + 1, h)
    start = h0 + 2 * tpb
    c0 = mgr.counters_of()
    cross: list[int] = []
    flat: list[int] = []
    clock = time.perf_counter_ns
    for h in range(start, start + steps):
        for kv in seqs:
            nb = kv.num_blocks
            t0 = clock()
            ok = kv.resize(h + 1, h)
            dt = clock() - t0
            if not ok:
                raise RuntimeError("out of pages during the benchmark")
            (cross if kv.num_blocks != nb else flat).append(dt)
    mgr.synchronize()
    c1 = mgr.counters_of()
    denom = steps * n

    def stats(xs: list[int]) -> dict[str, float]:
        if not xs:
            return {"count": 0, "median_us": 0.0, "p99_us": 0.0}
        a = np.asarray(xs, dtype=np.float64) / 1000.0
        return {"count": len(xs), "median_us": float(np.median(a)),
                "p99_us": float(np.percentile(a, 99))}

    out = {
        "pocket": pocket,
        "alloc_calls_per_step": (c1.alloc_calls - c0.alloc_calls) / denom,
        "releases_per_step": (c1.releases - c0.releases) / denom,
        "events_recorded_per_step": (c1.events_recorded - c0.events_recorded) / denom,
        "cross_stream_waits_per_step": (c1.cross_stream_waits - c0.cross_stream_waits) / denom,
        "pocket_pops_per_step": (c1.pocket_pops - c0.pocket_pops) / denom,
        "resize_crossing": stats(cross),
        "resize_non_crossing": stats(flat),
        "invariant_violations": len(mgr.check_invariants()),
    }
    for kv in seqs:
        kv.close()
    leaks = mgr.shutdown()
    out["leaks"] = bool(leaks)
    return out


def run_decode_bench(
    num_seqs: int = 256, window: int = 128, tokens_per_block: int = 32, steps: int = 128,
    backend: str = "numpy",
) -> dict[str, Any]:
    """Steady-state decode of `num_seqs` sequences; pocket off and on in one run."""
    warmup = window + tokens_per_block
    res = {
        "config": {"num_seqs": num_seqs, "window": window,
                   "tokens_per_block": tokens_per_block, "steps": steps, "backend": backend},
        "pocket_off": _run_one(num_seqs, window, tokens_per_block, False, steps, warmup,
                               backend),
        "pocket_on": _run_one(num_seqs, window, tokens_per_block, True, steps, warmup,
                              backend),
    }
    return res
