"""`trace check` at real geometry: header-only start-up, events per second, peak memory.

A real manager declares 10^4 to 10^6 slots per level and uses a few at a time. The
model's state is sparse (`model/sparse.py`), its choices and invariant checks look at
what is in use or what changed (`model/fastcheck.py`), so `trace check` should cost in
proportion to what a log uses, not to what its header declares. This job measures it:

* start-up: a log with a header and its end marker only, at `startup_slots` slots per
  level, read and checked in this process (the interpreter's own start and imports not
  counted);
* throughput: `trace record`'s seeded workload on the implementation, at `slots` slots
  per level, until the log has at least `events` events; then the log is checked from
  its file, streamed as `kvpocket trace check` does, in a fresh child process whose
  peak resident memory is reported with its events per second.
"""

from __future__ import annotations

import json
import multiprocessing
import resource
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvpocket.model.config import KVConfig
from kvpocket.model.sparse import SparseArray
from kvpocket.verify.presets import preset
from kvpocket.verify.traces.record import record
from kvpocket.verify.traces.trace import EVENTS_KIND, open_events, with_end_marker
from kvpocket.verify.traces.tracecheck import EventChecker, check_events

EVENTS_PER_STEP = 2.0  # fewer than the recorder's workload writes per step (about 2.5)


@dataclass(frozen=True)
class GeometryCase:
    startup_slots: int  # slots per level of the header-only log
    slots: int  # slots per level of the recorded log
    events: int  # at least this many events are recorded and checked
    seed: int = 0


def geometry_config(slots_per_level: int) -> KVConfig:
    """The `two-level` preset's life cycles (SWA + full attention, one pool group) with
    8 sequences of up to 32 blocks and `slots_per_level` slots at GPU and at host."""
    return replace(preset("two-level"), slots_per_level=(slots_per_level, slots_per_level),
                   num_sequences=8, max_blocks=32, max_pages=0)


def header_only_startup(slots_per_level: int) -> dict[str, Any]:
    """Seconds to read and check a header-only log, and what the model stores for it."""
    cfg = geometry_config(slots_per_level)
    header = json.dumps({"kvpocket_trace": 1, "kind": EVENTS_KIND, "config": cfg.to_json(),
                         "source": "kvpocket bench", "policy": cfg.pocket.policy.value})
    with tempfile.TemporaryDirectory(prefix="kvpocket-geometry-") as tmp:
        path = Path(tmp) / "header-only.jsonl"
        path.write_text("\n".join(with_end_marker([header])) + "\n")
        t0, c0 = time.perf_counter(), time.process_time()
        verdict = check_events(open_events(path), name=str(path))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    state = EventChecker(cfg).model.state
    stored = sum(len(v.used()) for v in vars(state).values() if isinstance(v, SparseArray))
    return {"slots_per_level": slots_per_level, "total_slots": 2 * slots_per_level,
            "page_records": cfg.max_pages, "seconds": seconds, "cpu_seconds": cpu,
            "ok": verdict.ok,
            "stored_positions": stored}


def recorded_log(case: GeometryCase, path: Path) -> int:
    """Record the workload at `case.slots` per level into `path`; its number of events."""
    steps = max(1, int(case.events / EVENTS_PER_STEP))
    record(geometry_config(case.slots), steps, case.seed, path)
    with path.open() as f:
        return sum(1 for _ in f) - 2  # the header and the end marker


def _check_in_child(path: str) -> dict[str, Any]:
    """Runs in a fresh interpreter: check the log, report time and peak memory."""
    t0, c0 = time.perf_counter(), time.process_time()
    verdict = check_events(open_events(path), name=path)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"events": verdict.events, "seconds": seconds, "cpu_seconds": cpu, "ok": verdict.ok,
            "line": verdict.line, "kind": verdict.kind, "peak_rss_mb": peak_kib / 1024}


def check_throughput(case: GeometryCase) -> dict[str, Any]:
    """Record a log at real geometry, then check it in a child process."""
    with tempfile.TemporaryDirectory(prefix="kvpocket-geometry-") as tmp:
        path = Path(tmp) / "events.jsonl"
        t0 = time.perf_counter()
        events = recorded_log(case, path)
        record_seconds = time.perf_counter() - t0
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            out: dict[str, Any] = pool.apply(_check_in_child, (str(path),))
    return {"slots_per_level": case.slots, "total_slots": 2 * case.slots,
            "events_recorded": events, "record_seconds": record_seconds, **out,
            "events_per_second": out["events"] / out["seconds"] if out["seconds"] else 0.0,
            # on a machine shared with other jobs, CPU time is the steadier figure
            "events_per_cpu_second": out["events"] / out["cpu_seconds"]
            if out["cpu_seconds"] else 0.0}


def bench_geometry(case: GeometryCase) -> dict[str, Any]:
    return {"startup": header_only_startup(case.startup_slots),
            "throughput": check_throughput(case)}
