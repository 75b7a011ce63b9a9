"""Decode A/B: pocket off vs on under one SWA life cycle, per-step counts and resize times.

Under pressure the pocket runs twice, once per `evict_parked` setting: `migrate` copies an
evicted parked page to host (device-to-host bytes spent on data nobody reads again, since
the next pop refuses it), `drop` releases its slot without a copy. The rows count
device-to-host copies per decode step, all of them and those of parked pages."""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvpocket.impl.manager import KVCacheManager
from kvpocket.model.config import EvictParked, KVConfig, LifeCycle, PocketConfig, stale_range
from kvpocket.verify.bench.cases import (
    DecodeCase,
)


# ---- decode A/B -----------------------------------------------------------------------
def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def pressure_slots(batch: int) -> int:
    """The tenant's demand per decode step: 1/64 of the batch (at least 1 slot)."""
    return max(1, batch // 64)


def decode_config(batch: int, window: int, tpb: int, pocket: bool, total_tokens: int,
                  evict_parked: EvictParked | str = EvictParked.DROP) -> KVConfig:
    """GPU + host; GPU sized for every sequence's window plus slack, host for the
    tenant's evictions. The same pools with the pocket off and on."""
    per_seq = _ceil(window, tpb) + 4  # in-window blocks + straddle + pocket
    return KVConfig(
        tokens_per_block=tpb,
        life_cycles=(LifeCycle("swa", window=window, priority=20),),
        slots_per_level=(batch * per_seq + 16, batch * 2 + 16),
        num_sequences=batch, max_blocks=_ceil(total_tokens, tpb) + 1,
        pocket=PocketConfig(enabled=pocket, evict_parked=EvictParked.parse(evict_parked)),
    )


class _Traffic:
    """Device-to-host copies and parked drops, read off each call's choice record."""

    def __init__(self, mgr: Any) -> None:
        self.mgr = mgr
        self.d2h = 0  # migrations GPU -> host
        self.d2h_parked = 0  # ... of pages parked in a pocket (data nobody reads again)
        self.parked_drops = 0

    def add(self) -> None:
        pages = self.mgr.storage.pages
        for c in self.mgr.last_choices():
            if c[0] == "migrate" and c[2] == 0 and c[3] == 1:
                self.d2h += 1
                page = pages.get(c[1])  # no pop follows an eviction within one call
                self.d2h_parked += page is not None and page.pocket_owner is not None
            elif c[0] == "drop_parked":
                self.parked_drops += 1


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


def run_decode_case(case: DecodeCase, pocket: bool, backend: str = "numpy",
                    evict_parked: EvictParked | str = EvictParked.DROP) -> dict[str, Any]:
    """One decode row (see the module docstring)."""
    n, w, t, steps = case.batch, case.window, case.tokens_per_block, case.steps
    h0 = w + t  # first measured-ish history: every window block exists
    warm = t + 1  # one retire and one crossing: the pocket is primed
    start = h0 + warm
    cfg = decode_config(n, w, t, pocket, start + steps + 1, evict_parked)
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
    traffic = _Traffic(mgr)
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
                traffic.add()  # (outside the timed call)
            if is_cross:
                crossings += n
                for kv, s in zip(seqs, slots, strict=True):
                    s.add(int(kv.index[0, kv.num_blocks - 1]))
            if case.pressure and mgr.pressure(0, 0, alloc0.num_free + k):
                pressure_ok += 1
            traffic.add()
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
    slot_bytes = int(mgr.slot_elems * mgr.dtype.itemsize)
    return {
        "pocket": pocket, "evict_parked": cfg.pocket.evict_parked.value if pocket else None,
        "batch": n, "window": w, "tokens_per_block": t,
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
        "slot_bytes": slot_bytes,
        "d2h_copies_per_step": traffic.d2h / steps,
        "d2h_bytes_per_step": traffic.d2h * slot_bytes / steps,
        "d2h_parked_copies_per_step": traffic.d2h_parked / steps,
        "d2h_parked_bytes_per_step": traffic.d2h_parked * slot_bytes / steps,
        "parked_drops_per_step": traffic.parked_drops / steps,
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
                       "policy": cfg.pocket.policy.value,
                       "evict_parked": cfg.pocket.evict_parked.value},
            "slot_bytes": slot_bytes,
            "first_history": h0, "warmup_steps": warm, "measured_from_history": start,
            "steps": steps, "commit": "stopped", "backend": backend,
            "gc": "disabled while measuring", "timer": "time.perf_counter_ns around each call",
            "pressure": ({"level": 0, "pool_group": 0, "extra_free_slots_per_step": k}
                         if case.pressure else None),
        },
    }


def run_decode_ab(case: DecodeCase, backend: str) -> list[dict[str, Any]]:
    """Pocket off, then pocket on, for the same configuration: under pressure with
    evict_parked=migrate and then drop (the default); without pressure nothing is evicted,
    so only the default runs."""
    off = run_decode_case(case, False, backend)
    settings = (EvictParked.MIGRATE, EvictParked.DROP) if case.pressure else (EvictParked.DROP,)
    rows = [off]
    for evict in settings:
        on = run_decode_case(case, True, backend, evict)
        for key in ("resize_us_median", "resize_crossing_us_median",
                    "resize_non_crossing_us_median", "resize_us_p99", "resize_crossing_us_p99"):
            on[key.replace("_us_", "_ratio_on_off_")] = (on[key] / off[key]) if off[key] else None
        rows.append(on)
    return rows
