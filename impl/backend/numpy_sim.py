"""NumPy backend with a deterministic CUDA stream simulator.

Work enqueued on a simulated stream (a closure) runs only when the simulator
advances that stream. Events record a position in their stream's queue and
complete once the stream has executed that far; `wait_event` enqueues a
barrier holding the event's position *at the time of the call* (CUDA
semantics), which blocks the stream until the other stream got there. The
harness picks the interleaving (`advance`, `runnable`, `drain`), so a missing
wait shows up deterministically as wrong data: e.g. a copy that has not run
yet when a consumer's kernel reads the slot.

Modes: `eager=True` (the default) drains all streams in a fixed order (by
stream id) after every enqueue; `eager=False` runs nothing until the harness
says so.

Stream kinds, as CUDA has them:

* non-blocking streams (`cudaStreamNonBlocking`, what `Backend.new_stream` makes):
  ordered with other streams only through events;
* blocking streams (`new_stream(name, blocking=True)`, CUDA's default flag);
* the legacy default stream (`legacy_stream()`, CuPy's "current stream" unless
  code sets another one): work on it waits for all earlier work on blocking
  streams, and work on a blocking stream waits for all earlier legacy work. It
  does **not** synchronise with non-blocking streams. Both implicit rules are
  enqueued as ordinary barriers, so they hold under any interleaving.

Race detection (`race_check=True`): work may declare the pool slots it reads
and writes (`enqueue(..., reads=, writes=)`; copies declare theirs). The
simulator keeps a vector clock per stream (program order, event waits, the
legacy rules above, and what the host has observed complete through
`synchronize`/`query`/`drain`) and raises `RaceError` (a `SimulatorError`) at enqueue
time when an access conflicts with an earlier one (at least one write) that does not
happen before it. That is a race on real hardware *whatever* the interleaving,
so it is caught even in eager mode, where the fixed drain order would hide it.

Device-mirror mode (`NumpyBackend(device_mirror=True)`): `device_table` returns a separate
copy, as an upload to a GPU does, instead of the host array itself. Every table a kernel
reads then goes through the path the CuPy backend takes (a dirty flag, an upload where
CuPy uploads), so a host change that is never uploaded leaves the copy stale on the CPU
too, where the lockstep compares it with the model (`lockstep.py: _mirror_differences`).
"""

from __future__ import annotations

import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..exceptions import RaceError, SimulatorError
from .protocol import Access, EventRef, StreamRef

Clock = dict[int, int]  # stream id -> number of that stream's items known complete


@dataclass(frozen=True)
class _Work:
    fn: Callable[[], None]
    label: str


@dataclass(frozen=True)
class _Wait:
    stream: int
    position: int
    label: str


class _SimStream:
    __slots__ = ("blocking", "clock", "enqueued", "executed", "id", "legacy", "name", "queue")

    def __init__(self, sid: int, name: str, blocking: bool, legacy: bool) -> None:
        self.id = sid
        self.name = name
        self.blocking = blocking
        self.legacy = legacy
        self.queue: deque[_Work | _Wait] = deque()
        self.enqueued = 0  # items ever enqueued
        self.executed = 0  # items ever executed
        self.clock: Clock = {}  # other streams' items every later item here happens after


class _SimEvent:
    __slots__ = ("clock", "position", "stream")

    def __init__(self) -> None:
        self.stream: int | None = None
        self.position = 0
        self.clock: Clock = {}


@dataclass(frozen=True)
class _Touch:
    """One earlier access of a slot: which stream, which item, what it was."""

    stream: int
    item: int
    label: str


def _join(into: Clock, other: Clock) -> None:
    for sid, n in other.items():
        if into.get(sid, 0) < n:
            into[sid] = n


class StreamSimulator:
    """Deterministic executor of per-stream work queues."""

    def __init__(self, eager: bool = True, race_check: bool = False) -> None:
        self.eager = eager
        self.race_check = race_check
        # Live streams by id (ids are never reused); a retired stream (`retire`) is gone:
        # its work all ran, so an event recorded on it is complete and a wait is a no-op.
        self._streams: dict[int, _SimStream] = {}
        self._next_sid = 0
        self._retiring: set[int] = set()  # retire once their queue is empty
        # Race detector: the final clock of each stream dropped since the last
        # synchronize_all (an event recorded on it later, or that synchronisation, orders
        # later work after all its work)
        self._dropped: dict[int, Clock] = {}
        self._legacy: int | None = None
        self.trace: list[tuple[int, str]] = []  # (stream id, label) in execution order
        self.keep_trace = False
        self.host_clock: Clock = {}  # what the host has observed complete
        self._writes: dict[tuple[int, int], _Touch] = {}  # (buffer id, slot) -> last write
        self._reads: dict[tuple[int, int], list[_Touch]] = {}  # reads since that write
        self._names: dict[int, str] = {}  # buffer id -> name, for reports
        self.queued = 0  # items enqueued and not yet executed, over all streams

    # ---- construction ------------------------------------------------------------------
    def new_stream(self, name: str, blocking: bool = False) -> int:
        sid = self._next_sid
        self._next_sid += 1
        self._streams[sid] = _SimStream(sid, name, blocking, legacy=False)
        return sid

    def legacy_stream(self) -> int:
        """The legacy default stream (created on first use)."""
        if self._legacy is None:
            self._legacy = self._next_sid
            self._next_sid += 1
            self._streams[self._legacy] = _SimStream(self._legacy, "legacy-default", True,
                                                     legacy=True)
        return self._legacy

    def stream_name(self, sid: int) -> str:
        s = self._streams.get(sid)
        return s.name if s is not None else f"retired stream {sid}"

    def name_buffer(self, buf: Any, name: str) -> None:
        """A readable name for a buffer in race reports."""
        self._names[id(buf)] = name

    @property
    def num_streams(self) -> int:
        """Streams ever created (ids 0 to num_streams - 1; retired ones included)."""
        return self._next_sid

    @property
    def live_streams(self) -> int:
        """Streams not retired: what the simulator holds."""
        return len(self._streams)

    def retire(self, sid: int) -> None:
        """A stream that will get no more work (its sequence closed and was forgotten):
        dropped now if its queue is empty, else as soon as it is. Memory and the cost of
        every drain then depend on the live streams only, not on all ever created."""
        s = self._streams.get(sid)
        if s is None or s.legacy:
            return
        self._retiring.add(sid)
        self._run_retiring()

    def _run_retiring(self) -> None:
        """Run what retired streams still hold as far as it can go (no one else will
        advance them: the hardware finishing a forgotten request's work); drop each one
        whose queue is empty."""
        progressed = True
        while progressed and self._retiring:
            progressed = False
            for sid in sorted(self._retiring):
                s = self._streams[sid]
                if s.queue and self._head_runnable(s):
                    self.advance(sid, len(s.queue))
                    progressed = True
                if not s.queue:
                    self._drop(sid)

    def _drop(self, sid: int) -> None:
        if self.race_check:  # its work is done: what it ordered, and itself, as a clock
            s = self._streams[sid]
            self._dropped[sid] = {**s.clock, sid: s.enqueued}
        del self._streams[sid]
        self._retiring.discard(sid)

    # ---- enqueue -------------------------------------------------------------------------
    def enqueue(self, sid: int, fn: Callable[[], None], label: str = "work",
                reads: Iterable[Access] = (), writes: Iterable[Access] = ()) -> None:
        s = self._streams[sid]
        self._implicit_legacy_sync(s)
        if self.race_check:
            _join(s.clock, self.host_clock)
            self._check_and_note(s, label, reads, writes)
        s.queue.append(_Work(fn, label))
        s.enqueued += 1
        self.queued += 1
        if self.eager:
            self.drain()

    def _implicit_legacy_sync(self, s: _SimStream) -> None:
        """CUDA's legacy default stream rules, as barriers (and clock joins)."""
        if self._legacy is None or not s.blocking:
            return
        others = ([b for b in self._streams.values() if b.blocking and not b.legacy]
                  if s.legacy else [self._streams[self._legacy]])
        for o in others:
            if o.id == s.id or o.enqueued == 0:
                continue
            s.queue.append(_Wait(o.id, o.enqueued, f"implicit wait {o.name}"))
            s.enqueued += 1
            self.queued += 1
            if self.race_check:  # clocks serve the race detector only
                _join(s.clock, o.clock)
                _join(s.clock, {o.id: o.enqueued})

    def record(self, ev: _SimEvent, sid: int) -> None:
        s = self._streams.get(sid)
        if s is None:  # a retired stream: all its work ran, the event is complete (and
            # orders what waits on it after that work; after a synchronize_all the host
            # clock already does)
            ev.stream, ev.position = None, 0
            ev.clock = dict(self._dropped.get(sid, {})) if self.race_check else {}
            return
        ev.stream = sid
        ev.position = s.enqueued
        if self.race_check:  # clocks serve the race detector only (kept off, they grow
            ev.clock = dict(s.clock)  # with every stream a long run ever waited on)
            ev.clock[sid] = s.enqueued

    def wait_event(self, sid: int, ev: _SimEvent, label: str = "wait") -> None:
        if ev.stream is None or ev.stream not in self._streams:
            # CUDA: waiting on a never-recorded (or a complete) event is a no-op; the
            # work before a complete one (a retired stream's: it all ran) still happens
            # before what this stream runs next
            if self.race_check and ev.clock:
                _join(self._streams[sid].clock, ev.clock)
            return
        s = self._streams[sid]
        s.queue.append(_Wait(ev.stream, ev.position, label))
        s.enqueued += 1
        self.queued += 1
        if self.race_check:
            _join(s.clock, ev.clock)
        if self.eager:
            self.drain()

    # ---- race detection ------------------------------------------------------------------
    def _ordered(self, t: _Touch, s: _SimStream) -> bool:
        return t.stream == s.id or s.clock.get(t.stream, 0) > t.item

    def _race(self, kind: str, buf: int, slot: int, s: _SimStream, label: str,
              other: _Touch, other_kind: str) -> RaceError:
        name = self._names.get(buf, f"buffer@{buf:#x}")
        o_name = self.stream_name(other.stream)
        o = self._streams.get(other.stream)
        legacy = s.legacy or (o is not None and o.legacy)
        return RaceError(
            f"race on {name}[{slot}]: {kind} by {label!r} on stream {s.name!r} is not ordered "
            f"after the {other_kind} by {other.label!r} on stream {o_name!r} (no event/wait "
            f"chain or host synchronisation between them; "
            f"{'legacy default vs non-blocking stream' if legacy else 'cross-stream'})")

    @staticmethod
    def _keys(accesses: Iterable[Access]) -> list[tuple[int, int]]:
        keys: list[tuple[int, int]] = []
        for buf, slots in accesses:
            rows = range(len(buf)) if slots is None else slots
            keys.extend((id(buf), int(r)) for r in rows)
        return keys

    def _check_and_note(self, s: _SimStream, label: str, reads: Iterable[Access],
                        writes: Iterable[Access]) -> None:
        item = s.enqueued
        rkeys, wkeys = self._keys(reads), self._keys(writes)
        for key in rkeys:
            w = self._writes.get(key)
            if w is not None and not self._ordered(w, s):
                raise self._race("read", key[0], key[1], s, label, w, "write")
        for key in wkeys:
            w = self._writes.get(key)
            if w is not None and not self._ordered(w, s):
                raise self._race("write", key[0], key[1], s, label, w, "write")
            for r in self._reads.get(key, ()):
                if not self._ordered(r, s):
                    raise self._race("write", key[0], key[1], s, label, r, "read")
        me = _Touch(s.id, item, label)
        for key in rkeys:
            self._reads.setdefault(key, []).append(me)
        for key in wkeys:
            self._writes[key] = me
            self._reads.pop(key, None)

    def _host_observed(self, clock: Clock) -> None:
        if self.race_check:
            _join(self.host_clock, clock)

    # ---- queries -------------------------------------------------------------------------
    def event_done(self, ev: _SimEvent) -> bool:
        s = self._streams.get(ev.stream) if ev.stream is not None else None
        if s is None:  # never recorded, or on a retired stream (all its work ran)
            self._host_observed(ev.clock)  # the host has seen it complete all the same
            return True
        done = s.executed >= ev.position
        if done:
            self._host_observed(ev.clock)  # a successful query orders later host work
        return done

    def pending(self, sid: int) -> int:
        s = self._streams.get(sid)
        return len(s.queue) if s is not None else 0

    def _head_runnable(self, s: _SimStream) -> bool:
        if not s.queue:
            return False
        head = s.queue[0]
        if isinstance(head, _Wait):
            other = self._streams.get(head.stream)
            return other is None or other.executed >= head.position
        return True

    def runnable(self) -> list[int]:
        """Ids of streams whose next item can execute now."""
        return [s.id for s in self._streams.values() if self._head_runnable(s)]

    def idle(self) -> bool:
        return self.queued == 0

    # ---- execution -----------------------------------------------------------------------
    def advance(self, sid: int, n: int = 1) -> int:
        """Execute up to `n` items of stream `sid`; stops at a blocked wait. Returns count."""
        s = self._streams.get(sid)
        if s is None:  # retired: nothing left to run
            return 0
        done = 0
        while done < n and self._head_runnable(s):
            item = s.queue.popleft()
            if isinstance(item, _Work):
                item.fn()
            s.executed += 1
            self.queued -= 1
            done += 1
            if self.keep_trace:
                self.trace.append((sid, item.label))
        if done and self._retiring and sid not in self._retiring:
            self._run_retiring()  # this stream's progress may unblock a retired one
        return done

    def drain(self) -> None:
        """Run everything, streams visited in id order, until all queues are empty."""
        if self.queued == 0:
            return
        progressed = True
        while progressed:
            progressed = False
            for s in list(self._streams.values()):
                if self._head_runnable(s):
                    self.advance(s.id, len(s.queue))
                    progressed = True
        if not self.idle():
            blocked = [s.name for s in self._streams.values() if s.queue]
            raise SimulatorError(f"stream simulator deadlock: streams {blocked} are blocked")

    def synchronize_all(self) -> None:
        """Host blocks until every stream is idle (`drain`), and knows it: all work so far
        happens before anything the host enqueues next. (An eager drain after an enqueue
        is not that: it models fast hardware, not a host that waited.)"""
        self.drain()
        if self.race_check:  # every stream's work, the retired ones' included
            for final in self._dropped.values():
                self._host_observed(final)
            self._dropped.clear()
            self._host_observed({s.id: s.enqueued for s in self._streams.values()})

    def synchronize(self, ev: _SimEvent) -> None:
        """Host blocks until `ev` completes: progress streams in fixed order until it has."""
        while not self.event_done(ev):
            ready = self.runnable()
            if not ready:
                raise SimulatorError("synchronize on an event that can never complete")
            self.advance(ready[0], 1)


def _slots(x: Sequence[int] | np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.asarray(x, dtype=np.int64).reshape(-1)


class NumpyBackend:
    """CPU arrays for every level plus the stream simulator.

    `race_check=True` turns on the simulator's race detector: copies declare their
    slots, and `launch` takes `reads=`/`writes=` declarations (see the module doc).
    `device_mirror=True`: `device_table` returns a separate copy (the module doc).
    """

    name = "numpy"
    xp: Any = np

    def __init__(self, eager: bool = True, disk_dir: str | None = None,
                 race_check: bool = False, device_mirror: bool = False) -> None:
        self.sim = StreamSimulator(eager=eager, race_check=race_check)
        self.device_copies = device_mirror
        self._next_event = 0
        self._disk_dir = disk_dir
        self._tmpdirs: list[tempfile.TemporaryDirectory[str]] = []
        self._streams: dict[int, StreamRef] = {}  # live ones (`release_stream`)
        self._current: StreamRef | None = None
        self._npools = 0

    def create_pool(self, level: int, num_slots: int, slot_elems: int, dtype: Any) -> Any:
        pool: Any
        if level < 2:
            pool = np.zeros((num_slots, slot_elems), dtype=dtype)
        else:
            if self._disk_dir is None:
                td = tempfile.TemporaryDirectory(prefix="kvpocket-disk-")
                self._tmpdirs.append(td)
                self._disk_dir = td.name
            path = os.path.join(self._disk_dir,
                                f"level{level}-{len(os.listdir(self._disk_dir))}.bin")
            pool = np.memmap(path, dtype=dtype, mode="w+", shape=(num_slots, slot_elems))
        self.sim.name_buffer(pool, f"pool{self._npools}(level {level})")
        self._npools += 1
        return pool

    def new_stream(self, name: str) -> StreamRef:
        sid = self.sim.new_stream(name)
        ref = StreamRef(sid, name, sid)
        self._streams[sid] = ref
        return ref

    def release_stream(self, stream: StreamRef) -> None:
        """The stream gets no more work (its sequence is closed and forgotten): the
        simulator drops it once its queued work has run."""
        self._streams.pop(stream.id, None)
        self.sim.retire(stream.id)

    def current_stream(self) -> StreamRef:
        if self._current is None:
            sid = self.sim.legacy_stream()
            self._current = StreamRef(sid, self.sim.stream_name(sid), sid)
        return self._current

    def join_current(self, streams: Sequence[StreamRef] | None = None) -> None:
        cur = self.current_stream()
        ev = self.new_event()
        self.record(ev, cur)
        for s in list(self._streams.values()) if streams is None else streams:
            self.wait_event(s, ev)

    def wait_streams(self, stream: StreamRef, others: Sequence[StreamRef]) -> None:
        if self.sim.idle() and not self.sim.race_check:
            return  # nothing is queued anywhere: every stream's work has run
        for o in others:
            # An idle stream orders nothing (data-wise); the race detector still wants the
            # edge, as a GPU would: the host has not observed that work complete.
            if o.id != stream.id and (self.sim.race_check or self.sim.pending(o.id)):
                ev = self.new_event()
                self.record(ev, o)
                self.wait_event(stream, ev)

    def new_event(self) -> EventRef:
        self._next_event += 1
        return EventRef(self._next_event, _SimEvent())

    def record(self, event: EventRef, stream: StreamRef) -> None:
        self.sim.record(event.raw, stream.id)
        event.stream = stream

    def wait_event(self, stream: StreamRef, event: EventRef) -> None:
        self.sim.wait_event(stream.id, event.raw, f"wait e{event.id}")

    def query(self, event: EventRef) -> bool:
        return self.sim.event_done(event.raw)

    def synchronize(self, event: EventRef) -> None:
        self.sim.synchronize(event.raw)

    def synchronize_all(self) -> None:
        self.sim.synchronize_all()

    def launch(self, stream: StreamRef, fn: Callable[[], None], label: str = "kernel",
               reads: Sequence[Access] = (), writes: Sequence[Access] = ()) -> None:
        self.sim.enqueue(stream.id, fn, label, reads, writes)

    def copy_slot(
        self, stream: StreamRef, dst_pool: Any, dst_slot: int, src_pool: Any, src_slot: int
    ) -> None:
        def run() -> None:
            dst_pool[dst_slot] = src_pool[src_slot]

        self.sim.enqueue(stream.id, run, f"copy ->{dst_slot} <-{src_slot}",
                         reads=((src_pool, (src_slot,)),), writes=((dst_pool, (dst_slot,)),))

    def copy_slots(self, stream: StreamRef, dst_pool: Any, dst_slots: Sequence[int],
                   src_pool: Any, src_slots: Sequence[int]) -> None:
        dst, src = _slots(dst_slots), _slots(src_slots)
        if dst.shape != src.shape:
            raise ValueError(f"copy_slots: {dst.size} destination and {src.size} source slots")
        if dst_pool is src_pool:
            raise ValueError("copy_slots: source and destination must be different pools")
        if np.unique(dst).size != dst.size:
            raise ValueError("copy_slots: destination slots must be distinct")
        if dst.size == 0:
            return

        def run() -> None:
            dst_pool[dst] = src_pool[src]

        self.sim.enqueue(stream.id, run, f"copy {dst.size} slots",
                         reads=((src_pool, src.tolist()),), writes=((dst_pool, dst.tolist()),))

    def to_numpy(self, arr: Any) -> np.ndarray[Any, Any]:
        return np.array(arr, copy=True)

    def device_table(self, host: np.ndarray[Any, Any], stream: StreamRef | None = None) -> Any:
        # The upload is complete at once: the simulator runs no kernel between host and copy.
        return np.array(host, copy=True) if self.device_copies else host

    def close(self) -> None:
        for td in self._tmpdirs:
            td.cleanup()
        self._tmpdirs.clear()
