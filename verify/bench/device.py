"""Backend throughput: migration copy bandwidth against a plain copy, the data oracle."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from kvpocket.model.config import KVConfig, LifeCycle
from kvpocket.verify.bench.decode import decode_config


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
