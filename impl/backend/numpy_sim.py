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
"""

from __future__ import annotations

import os
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..exceptions import SimulatorError
from .protocol import EventRef, StreamRef


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
    __slots__ = ("enqueued", "executed", "id", "name", "queue")

    def __init__(self, sid: int, name: str) -> None:
        self.id = sid
        self.name = name
        self.queue: deque[_Work | _Wait] = deque()
        self.enqueued = 0  # items ever enqueued
        self.executed = 0  # items ever executed


class _SimEvent:
    __slots__ = ("position", "stream")

    def __init__(self) -> None:
        self.stream: int | None = None
        self.position = 0


class StreamSimulator:
    """Deterministic executor of per-stream work queues."""

    def __init__(self, eager: bool = True) -> None:
        self.eager = eager
        self._streams: list[_SimStream] = []
        self.trace: list[tuple[int, str]] = []  # (stream id, label) in execution order
        self.keep_trace = False

    # ---- construction ------------------------------------------------------------------
    def new_stream(self, name: str) -> int:
        sid = len(self._streams)
        self._streams.append(_SimStream(sid, name))
        return sid

    def stream_name(self, sid: int) -> str:
        return self._streams[sid].name

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    # ---- enqueue -------------------------------------------------------------------------
    def enqueue(self, sid: int, fn: Callable[[], None], label: str = "work") -> None:
        s = self._streams[sid]
        s.queue.append(_Work(fn, label))
        s.enqueued += 1
        if self.eager:
            self.drain()

    def record(self, ev: _SimEvent, sid: int) -> None:
        ev.stream = sid
        ev.position = self._streams[sid].enqueued

    def wait_event(self, sid: int, ev: _SimEvent, label: str = "wait") -> None:
        if ev.stream is None:
            return  # CUDA: waiting on a never-recorded event is a no-op
        s = self._streams[sid]
        s.queue.append(_Wait(ev.stream, ev.position, label))
        s.enqueued += 1
        if self.eager:
            self.drain()

    # ---- queries -------------------------------------------------------------------------
    def event_done(self, ev: _SimEvent) -> bool:
        if ev.stream is None:
            return True
        return self._streams[ev.stream].executed >= ev.position

    def pending(self, sid: int) -> int:
        return len(self._streams[sid].queue)

    def _head_runnable(self, s: _SimStream) -> bool:
        if not s.queue:
            return False
        head = s.queue[0]
        if isinstance(head, _Wait):
            return self._streams[head.stream].executed >= head.position
        return True

    def runnable(self) -> list[int]:
        """Ids of streams whose next item can execute now."""
        return [s.id for s in self._streams if self._head_runnable(s)]

    def idle(self) -> bool:
        return all(not s.queue for s in self._streams)

    # ---- execution -----------------------------------------------------------------------
    def advance(self, sid: int, n: int = 1) -> int:
        """Execute up to `n` items of stream `sid`; stops at a blocked wait. Returns count."""
        s = self._streams[sid]
        done = 0
        while done < n and self._head_runnable(s):
            item = s.queue.popleft()
            if isinstance(item, _Work):
                item.fn()
            s.executed += 1
            done += 1
            if self.keep_trace:
                self.trace.append((sid, item.label))
        return done

    def drain(self) -> None:
        """Run everything, streams visited in id order, until all queues are empty."""
        progressed = True
        while progressed:
            progressed = False
            for s in self._streams:
                if self._head_runnable(s):
                    self.advance(s.id, len(s.queue))
                    progressed = True
        if not self.idle():
            blocked = [s.name for s in self._streams if s.queue]
            raise SimulatorError(f"stream simulator deadlock: streams {blocked} are blocked")

    def synchronize(self, ev: _SimEvent) -> None:
        """Host blocks until `ev` completes: progress streams in fixed order until it has."""
        while not self.event_done(ev):
            ready = self.runnable()
            if not ready:
                raise SimulatorError("synchronize on an event that can never complete")
            self.advance(ready[0], 1)


class NumpyBackend:
    """CPU arrays for every level plus the stream simulator."""

    name = "numpy"
    xp: Any = np

    def __init__(self, eager: bool = True, disk_dir: str | None = None) -> None:
        self.sim = StreamSimulator(eager=eager)
        self._next_event = 0
        self._disk_dir = disk_dir
        self._tmpdirs: list[tempfile.TemporaryDirectory[str]] = []

    def create_pool(self, level: int, num_slots: int, slot_elems: int, dtype: Any) -> Any:
        if level < 2:
            return np.zeros((num_slots, slot_elems), dtype=dtype)
        if self._disk_dir is None:
            td = tempfile.TemporaryDirectory(prefix="kvpocket-disk-")
            self._tmpdirs.append(td)
            self._disk_dir = td.name
        path = os.path.join(self._disk_dir, f"level{level}-{len(os.listdir(self._disk_dir))}.bin")
        return np.memmap(path, dtype=dtype, mode="w+", shape=(num_slots, slot_elems))

    def new_stream(self, name: str) -> StreamRef:
        sid = self.sim.new_stream(name)
        return StreamRef(sid, name, sid)

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
        self.sim.drain()

    def launch(self, stream: StreamRef, fn: Callable[[], None], label: str = "kernel") -> None:
        self.sim.enqueue(stream.id, fn, label)

    def copy_slot(
        self, stream: StreamRef, dst_pool: Any, dst_slot: int, src_pool: Any, src_slot: int
    ) -> None:
        def run() -> None:
            dst_pool[dst_slot] = src_pool[src_slot]

        self.sim.enqueue(stream.id, run, f"copy ->{dst_slot} <-{src_slot}")

    def to_numpy(self, arr: Any) -> np.ndarray[Any, Any]:
        return np.array(arr, copy=True)

    def device_table(self, host: np.ndarray[Any, Any]) -> Any:
        return host

    def close(self) -> None:
        for td in self._tmpdirs:
            td.cleanup()
        self._tmpdirs.clear()
