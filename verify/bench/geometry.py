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
  peak resident memory is reported with its events per second;
* the floor under that figure, in the same child after the check: the same file only
  read (`open_events`: JSON, validation, the digest; no model), and only `json.loads`
  of each line, in events per CPU second, with the model's page actions per event. A
  checker cannot beat its reader: these say how much of the time the model takes;
* the same log under a header that declares a real manager's sequences and blocks
  (`DECLARED`: 1,024 sequences of 8,192 blocks, 16.7 M block entries) while it uses the
  same few: its events per CPU second should be those of the log as recorded;
* a full pool (`full_pool_throughput`), a real server's steady state: sequence after
  sequence prefills 30 blocks, commits them and closes, so the GPU pool fills with cached
  pages and, after the first `slots / 60` sequences, every allocation evicts.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import resource
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvpocket.impl.manager import KVCacheManager
from kvpocket.model.config import KVConfig
from kvpocket.model.sparse import SparseArray
from kvpocket.verify.presets import preset
from kvpocket.verify.traces.record import record
from kvpocket.verify.traces.trace import EVENTS_KIND, open_events, with_end_marker
from kvpocket.verify.traces.tracecheck import EventChecker, check_events

EVENTS_PER_STEP = 2.0  # fewer than the recorder's workload writes per step (about 2.5)
# sequences and blocks per sequence a real manager declares (vLLM: max_num_seqs up to
# 1,024; a 128k-token context in blocks of 16 tokens)
DECLARED = {"num_sequences": 1024, "max_blocks": 8192}


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
    """Runs in a fresh interpreter: check the log, report time and peak memory, then the
    reading floor (`_read_only`)."""
    t0, c0 = time.perf_counter(), time.process_time()
    verdict = check_events(open_events(path), name=path)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"events": verdict.events, "seconds": seconds, "cpu_seconds": cpu, "ok": verdict.ok,
            "line": verdict.line, "kind": verdict.kind, "peak_rss_mb": peak_kib / 1024,
            "page_actions": verdict.page_actions, **_read_only(path)}


def _read_only(path: str) -> dict[str, Any]:
    """Events per CPU second of reading the log without checking it: through the event
    reader (parse, validate, digest), and through `json.loads` alone."""
    c0 = time.process_time()
    read = sum(1 for _ in open_events(path))
    reader_cpu = time.process_time() - c0
    with open(path) as f:
        lines = f.read().splitlines()[1:-1]  # the events: not the header, not the end
    c0 = time.process_time()
    for line in lines:
        json.loads(line)
    json_cpu = time.process_time() - c0
    return {"reader_events": read, "reader_cpu_seconds": reader_cpu,
            "reader_events_per_cpu_second": read / reader_cpu if reader_cpu else 0.0,
            "json_events_per_cpu_second": len(lines) / json_cpu if json_cpu else 0.0}


def check_throughput(case: GeometryCase) -> dict[str, Any]:
    """Record a log at real geometry, then check it in a child process."""
    with tempfile.TemporaryDirectory(prefix="kvpocket-geometry-") as tmp:
        path = Path(tmp) / "events.jsonl"
        t0 = time.perf_counter()
        events = recorded_log(case, path)
        record_seconds = time.perf_counter() - t0
        declared = Path(tmp) / "declared.jsonl"
        redeclare(path, declared, DECLARED)
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            out: dict[str, Any] = pool.apply(_check_in_child, (str(path),))
        with ctx.Pool(1) as pool:
            big: dict[str, Any] = pool.apply(_check_in_child, (str(declared),))
    return {"slots_per_level": case.slots, "total_slots": 2 * case.slots,
            "events_recorded": events, "record_seconds": record_seconds, **out,
            "events_per_second": out["events"] / out["seconds"] if out["seconds"] else 0.0,
            # on a machine shared with other jobs, CPU time is the steadier figure
            "events_per_cpu_second": _rate(out),
            "declared": {**DECLARED, "events": big["events"], "ok": big["ok"],
                         "kind": big["kind"], "cpu_seconds": big["cpu_seconds"],
                         "events_per_cpu_second": _rate(big),
                         "peak_rss_mb": big["peak_rss_mb"]}}


def _rate(out: dict[str, Any]) -> float:
    return out["events"] / out["cpu_seconds"] if out["cpu_seconds"] else 0.0


def redeclare(src: Path, dst: Path, config: dict[str, int]) -> None:
    """`src` with these configuration fields changed in its header (and its end marker
    made anew): the same events, checked against another declared geometry."""
    with src.open() as f:
        lines = f.read().splitlines()[:-1]  # the end marker is made anew
    header = json.loads(lines[0])
    header["config"].update(config)
    dst.write_text("\n".join(with_end_marker([json.dumps(header), *lines[1:]])) + "\n")


def bench_geometry(case: GeometryCase) -> dict[str, Any]:
    return {"startup": header_only_startup(case.startup_slots),
            "throughput": check_throughput(case)}


FULL_POOL_TOKENS = 60  # each sequence's prompt: 30 blocks of the `two-level` life cycles


def full_pool_log(slots: int, sequences: int, path: Path, seed: int = 0) -> int:
    """The full-pool log at `slots` GPU slots (twice as many at host): `sequences`
    sequences each created, grown to FULL_POOL_TOKENS tokens, committed and closed; its
    number of events."""
    cfg = replace(geometry_config(slots), slots_per_level=(slots, 2 * slots), max_pages=0)
    rng = random.Random(seed)
    with path.open("w") as f:
        mgr = KVCacheManager(cfg, backend="numpy", slot_elems=8,
                             backend_options={"eager": False}, event_log=f)
        for sid in range(sequences):
            kv = mgr.create(sid, [])
            kv.resume()
            kv.resize(FULL_POOL_TOKENS, 0)
            kv.commit([rng.randrange(1 << 16) for _ in range(FULL_POOL_TOKENS)])
            kv.close()
        assert mgr.events is not None
        mgr.events.close()
    with path.open() as f:
        return sum(1 for _ in f) - 2


def full_pool_throughput(slots: int, sequences: int) -> dict[str, Any]:
    """Check the full-pool log in a child process: events per CPU second, peak memory."""
    with tempfile.TemporaryDirectory(prefix="kvpocket-full-pool-") as tmp:
        path = Path(tmp) / "full-pool.jsonl"
        events = full_pool_log(slots, sequences, path)
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            out: dict[str, Any] = pool.apply(_check_in_child, (str(path),))
    return {"slots_per_level": slots, "sequences": sequences, "events_recorded": events,
            **out, "events_per_cpu_second": _rate(out),
            "page_actions_per_event": out["page_actions"] / out["events"]
            if out["events"] else 0.0}
