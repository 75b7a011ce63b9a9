"""The backend interface: memory for every cache level, streams, events, copies.

The manager never touches CUDA or the simulator directly; it speaks this
protocol. `StreamRef`/`EventRef` are thin handles around the backend's raw
objects so the manager can ask "was this event recorded on that stream?"
(a same-stream dependency needs no wait: streams execute in order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np


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

    def create_pool(self, level: int, num_slots: int, slot_elems: int, dtype: Any) -> Any:
        """Slot storage for one (level, pool group): shape (num_slots, slot_elems).

        Level 0 lives on the device; level 1 in (pinned) host memory; level 2 in a
        `numpy.memmap` disk file.
        """
        ...

    def new_stream(self, name: str) -> StreamRef: ...

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

    def launch(self, stream: StreamRef, fn: Callable[[], None]) -> None:
        """Run `fn` (array work on pools) ordered on `stream`."""
        ...

    def copy_slot(
        self, stream: StreamRef, dst_pool: Any, dst_slot: int, src_pool: Any, src_slot: int
    ) -> None:
        """Asynchronously copy one slot between pools (any levels) on `stream`."""
        ...

    def to_numpy(self, arr: Any) -> np.ndarray[Any, Any]:
        """A host copy of `arr` (blocking, after the work that wrote it has run)."""
        ...

    def device_table(self, host: np.ndarray[Any, Any]) -> Any:
        """A device-resident copy of a host int32 index table (the same array on NumPy)."""
        ...

    def close(self) -> None: ...
