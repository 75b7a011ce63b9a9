"""The backend interface: memory for every cache level, streams, events, copies.

The manager never touches CUDA or the simulator directly; it speaks this
protocol. `StreamRef`/`EventRef` are thin handles around the backend's raw
objects so the manager can ask "was this event recorded on that stream?"
(a same-stream dependency needs no wait: streams execute in order).

Ordering contract (which stream every access to a pool is ordered on):

* `create_pool` returns a pool whose initial contents (zeros) are complete: no
  stream has to wait for its initialisation.
* Every stream `new_stream` makes is **non-blocking**: it is ordered with other
  streams only through `record`/`wait_event`, never implicitly, and in particular
  not with the legacy default stream.
* A migration's copy (`copy_slot`/`copy_slots`) is ordered on the stream passed in
  (the manager's copy stream); a sequence's kernels that read or write its slots
  are ordered on that sequence's stream (`launch`). The manager issues no other
  pool access.
* Anything else is *external*: a pool written outside `launch`, e.g. `pool[i] = x`
  in a test, or a framework kernel. It runs on the caller's current stream
  (`current_stream()`: on CuPy the legacy default stream unless code made another one
  current), which no backend stream is ordered with. Before any backend stream may
  touch data written that way, call `join_current()`; before the host reads pool
  data, call `synchronize_all()` (or `to_numpy`, which does).
* `device_table` returns a device copy whose upload is complete (or, given a stream,
  ordered on that stream). Where it is a separate copy (`device_copies`: CuPy, and the
  simulator's device-mirror mode) a table the host changes must be uploaded again before a
  kernel reads it: the caller keeps a dirty flag (`KVCache.page_table`).

On the simulator, `NumpyBackend(race_check=True)` reports a violation of this
contract (an access not ordered after a conflicting one) as `SimulatorError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

Access = tuple[Any, Sequence[int] | None]
"""A declared access footprint: (pool, slot indices), or (pool, None) for all slots."""


class StreamRef:
    """A stream handle. `id` is unique per backend; `raw` is the backend object."""

    __slots__ = ("id", "name", "raw")

    def __init__(self, sid: int, name: str, raw: Any) -> None:
        self.id = sid
        self.name = name
        self.raw = raw

    def __repr__(self) -> str:
        return f"StreamRef({self.id}, {self.name!r})"


class EventRef:
    """An event handle; `stream` is the stream it was last recorded on (None: never)."""

    __slots__ = ("id", "raw", "stream")

    def __init__(self, eid: int, raw: Any) -> None:
        self.id = eid
        self.raw = raw
        self.stream: StreamRef | None = None

    def __repr__(self) -> str:
        where = self.stream.name if self.stream is not None else "-"
        return f"EventRef({self.id}@{where})"


@runtime_checkable
class Backend(Protocol):
    """Memory + ordering primitives with CUDA stream/event semantics."""

    name: str
    xp: Any  # numpy or cupy: the array module kernels use
    # True when `device_table` returns a separate copy (a GPU; the simulator with
    # `device_mirror=True`), False when it returns the host array itself.
    device_copies: bool

    def create_pool(self, level: int, num_slots: int, slot_elems: int, dtype: Any) -> Any:
        """Slot storage for one (level, pool group): shape (num_slots, slot_elems).

        Level 0 lives on the device; level 1 in (pinned) host memory; level 2 in a
        `numpy.memmap` disk file.
        """
        ...

    def new_stream(self, name: str) -> StreamRef:
        """A new **non-blocking** stream (see the ordering contract above)."""
        ...

    def current_stream(self) -> StreamRef:
        """The stream external array work runs on (CuPy's current stream; the
        simulator's legacy default stream). Not ordered with any backend stream."""
        ...

    def join_current(self, streams: Sequence[StreamRef] | None = None) -> None:
        """Order `streams` (default: every stream this backend made) after all work
        issued so far on `current_stream()`: one event recorded there, one wait each."""
        ...

    def wait_streams(self, stream: StreamRef, others: Sequence[StreamRef]) -> None:
        """Order work enqueued on `stream` after this call after all work enqueued so far
        on each of `others` (an event per other stream; the simulator skips idle ones)."""
        ...

    def new_event(self) -> EventRef: ...

    def record(self, event: EventRef, stream: StreamRef) -> None:
        """Event completes once all work enqueued on `stream` so far has run."""
        ...

    def wait_event(self, stream: StreamRef, event: EventRef) -> None:
        """Work enqueued on `stream` after this call runs only after `event` completed
        (as last recorded at the time of this call; a never-recorded event is a no-op)."""
        ...

    def query(self, event: EventRef) -> bool: ...

    def synchronize(self, event: EventRef) -> None: ...

    def synchronize_all(self) -> None: ...

    def launch(self, stream: StreamRef, fn: Callable[[], None], label: str = "kernel",
               reads: Sequence[Access] = (), writes: Sequence[Access] = ()) -> None:
        """Run `fn` (array work on pools) ordered on `stream`: every array operation
        `fn` issues goes to `stream`. `reads`/`writes` declare the pool slots it touches
        (used by the simulator's race detector; ignored on a GPU)."""
        ...

    def copy_slot(
        self, stream: StreamRef, dst_pool: Any, dst_slot: int, src_pool: Any, src_slot: int
    ) -> None:
        """Asynchronously copy one slot between pools (any levels) on `stream`."""
        ...

    def copy_slots(self, stream: StreamRef, dst_pool: Any, dst_slots: Sequence[int],
                   src_pool: Any, src_slots: Sequence[int]) -> None:
        """Asynchronously copy `src_pool[src_slots[i]]` to `dst_pool[dst_slots[i]]` for
        every i, on `stream`, as few transfers as the layout allows (one per contiguous
        run, or a gather/scatter through a staging buffer). Preconditions: the pools
        differ and the destination slots are distinct, so the copies are independent
        and the result equals `copy_slot` called for each pair in order."""
        ...

    def to_numpy(self, arr: Any) -> np.ndarray[Any, Any]:
        """A host copy of `arr` (blocking, after the work that wrote it has run)."""
        ...

    def device_table(self, host: np.ndarray[Any, Any], stream: StreamRef | None = None) -> Any:
        """A device-resident copy of a host int32 index table (the same array on NumPy,
        unless `device_copies`).

        With `stream`: uploaded and allocated on that stream, ordered before the work
        enqueued there next, with no host wait (what a consumer on one stream wants).
        Without: uploaded on a private stream and complete when this returns; the caller
        must keep the result referenced until every kernel reading it has completed."""
        ...

    def close(self) -> None: ...
