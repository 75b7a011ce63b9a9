"""`kvpocket trace record`: run a seeded random workload on the implementation and write
its event log (`KVCacheManager(event_log=...)`, see `impl/eventlog.py`).

The workload mixes what the lockstep campaigns do: decode runs (the pocket's workload),
the park-then-pressure race, growth and shrinking, commits with prefix reuse,
suspend/resume/close, another tenant's pressure, stream completions (the simulator runs
no work until the workload advances a stream), injected faults and a little misuse.
The same seed gives the same log.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from kvpocket.impl.backend.numpy_sim import NumpyBackend
from kvpocket.impl.exceptions import KVPocketError
from kvpocket.impl.kvcache import KVCache
from kvpocket.impl.manager import KVCacheManager
from kvpocket.model.config import KVConfig, SeqStatus
from kvpocket.verify.traces.trace import atomic_output


@dataclass
class RecordStats:
    calls: int = 0
    errors: int = 0
    parked: int = 0
    popped: int = 0
    refused: int = 0
    kinds: dict[str, int] = field(default_factory=dict)


KEPT_SEQUENCES = 256  # handles a workload keeps: closed ones serve misuse and prefix reuse


class Workload:
    """A seeded random client of one manager."""

    def __init__(self, mgr: KVCacheManager, rng: random.Random) -> None:
        self.mgr, self.cfg, self.rng = mgr, mgr.cfg, rng
        self.seqs: dict[int, KVCache] = {}
        self.next_id = 100  # the manager's own ids: any ints, never reused
        self.stats = RecordStats()

    # ---- helpers -----------------------------------------------------------------------
    def _open(self) -> list[KVCache]:
        return [kv for kv in self.seqs.values() if kv.status is not SeqStatus.CLOSED]

    def _pick(self, misuse: float = 0.05) -> KVCache | None:
        pool = list(self.seqs.values()) if self.rng.random() < misuse else self._open()
        return self.rng.choice(pool) if pool else None

    def _call(self, kind: str, fn: object, *args: object) -> object:
        self.stats.calls += 1
        self.stats.kinds[kind] = self.stats.kinds.get(kind, 0) + 1
        try:
            value = fn(*args)  # type: ignore[operator]
        except KVPocketError:
            self.stats.errors += 1
            return None
        for c in self.mgr.last_choices():
            if c[0] == "park":
                self.stats.parked += 1
            elif c[0] == "pop":
                self.stats.popped += 1
            elif c[0] == "refuse":
                self.stats.refused += 1
        return value

    def _decode(self, kv: KVCache) -> None:
        h = min(kv.history + 1, self.cfg.max_capacity - 1)
        self._call("decode", kv.resize, max(kv.capacity, h + 1), h)

    def _close(self, kv: KVCache) -> None:
        """Close a sequence, its stream's outstanding work completed first (as a server
        waits for a request's kernels): a closed stream gets no more work, so the
        simulator can let it go once the manager forgets the handle (bounded memory)."""
        if isinstance(self.mgr.backend, NumpyBackend) \
                and self.mgr.backend.sim.pending(kv.stream.id):
            self._advance(kv.seq_id, kv.stream.id)
        self._call("close", kv.close)

    def _forget_closed(self) -> None:
        """Keep at most KEPT_SEQUENCES handles (the oldest closed ones go first), so a long
        recording runs in bounded memory and time; short ones never reach the bound."""
        if len(self.seqs) <= KEPT_SEQUENCES:
            return
        for sid in [s for s, kv in self.seqs.items() if kv.status is SeqStatus.CLOSED]:
            del self.seqs[sid]
            if len(self.seqs) <= KEPT_SEQUENCES:
                return

    # ---- rules -------------------------------------------------------------------------
    def create(self) -> None:
        if len(self._open()) >= self.cfg.num_sequences:
            victim = self.rng.choice(self._open())
            self._close(victim)
        prompt: list[int] = []
        donors = [kv for kv in self.seqs.values() if kv.committed]
        if donors and self.rng.random() < 0.5:  # reuse a committed prefix
            prompt = list(self.rng.choice(donors).committed)
        prompt += [self.rng.randint(0, 1) for _ in range(self.rng.randint(0, 3))]
        sid, self.next_id = self.next_id, self.next_id + 1
        kv = self._call("create", self.mgr.create, sid, prompt)
        if isinstance(kv, KVCache):
            self.seqs[sid] = kv
            self._forget_closed()
            self._call("resume", kv.resume)

    def step(self) -> None:
        rng = self.rng
        if not self._open() or rng.random() < 0.06:
            self.create()
            return
        r = rng.random()
        kv = self._pick()
        if kv is None:
            return
        if r < 0.35:
            for _ in range(rng.randint(1, 6)):
                self._decode(kv)
        elif r < 0.42:
            self._race(kv)
        elif r < 0.52:
            h = min(kv.history + rng.randint(0, 3), self.cfg.max_capacity)
            cap = max(h, min(kv.capacity + rng.randint(-2, 6), self.cfg.max_capacity))
            self._call("resize", kv.resize, max(cap, 0), h)
        elif r < 0.60:
            room = kv.capacity - len(kv.committed)
            n = rng.randint(1, 4) if room <= 0 else min(room, rng.randint(1, 4))
            self._call("commit", kv.commit, [rng.randint(0, 1) for _ in range(n)])
        elif r < 0.63:
            self._call("stop_committing", kv.stop_committing)
        elif r < 0.68:
            self._call("suspend", kv.suspend)
        elif r < 0.74:
            self._call("resume", kv.resume)
        elif r < 0.77:
            self._close(kv)
        elif r < 0.86:
            level = rng.randint(0, self.cfg.last_level)
            group = rng.randint(0, self.cfg.num_pool_groups - 1)
            self._call("pressure", self.mgr.pressure, level, group, rng.randint(1, 3))
        elif r < 0.96:
            self.advance()
        elif r < 0.98:
            self._call("fail_allocation", self.mgr.inject_allocation_failure)
        else:
            self._call("fail_copy", self.mgr.inject_copy_failure)

    def _race(self, kv: KVCache) -> None:
        """Decode until something is parked, then pressure on its GPU pool, then decode."""
        for _ in range(4 * self.cfg.tokens_per_block + 8):
            if any(kv.pocket) or kv.status is not SeqStatus.ACTIVE:
                break
            self._decode(kv)
        free = self.cfg.slots_per_level[0] - len(self.mgr.storage.allocs[0][0].occupied)
        self._call("pressure", self.mgr.pressure, 0, 0,
                   min(free + 1, self.cfg.slots_per_level[0]))
        self._decode(kv)

    def advance(self) -> None:
        """One stream's outstanding work completes (a sequence's, or the copy stream)."""
        backend = self.mgr.backend
        if not isinstance(backend, NumpyBackend):
            return
        choices: list[int | str] = [kv.seq_id for kv in self._open()] + ["copy"]
        which = self.rng.choice(choices)
        stream = self.mgr.storage.copy_stream if which == "copy" else self.seqs[int(which)].stream
        self._advance(which, stream.id)

    def _advance(self, which: int | str, sid: int) -> None:
        backend = self.mgr.backend
        assert isinstance(backend, NumpyBackend) and self.mgr.events is not None
        backend.sim.advance(sid, 1 << 30)
        self.mgr.events.stream_completed(which)


def record(cfg: KVConfig, steps: int, seed: int, out: str | Path | TextIO) -> RecordStats:
    """Run `steps` workload steps on a fresh manager (NumPy, streams advanced explicitly)
    and write its event log, ended by its end marker, to `out`. A file is written whole
    or not at all: the log goes to a temporary file beside it, renamed over `out` only
    when complete, so an interrupted run leaves any earlier file as it was."""
    if not isinstance(out, (str, Path)):
        return _record(cfg, steps, seed, out)
    with atomic_output(out) as f:
        return _record(cfg, steps, seed, f)


def _record(cfg: KVConfig, steps: int, seed: int, out: TextIO) -> RecordStats:
    mgr = KVCacheManager(cfg, backend="numpy", slot_elems=max(8, cfg.tokens_per_block),
                         backend_options={"eager": False}, event_log=out)
    w = Workload(mgr, random.Random(seed))
    for _ in range(steps):
        w.step()
    assert mgr.events is not None
    mgr.events.close()
    return w.stats
