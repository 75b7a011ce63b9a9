"""CuPy backend for a real GPU (written for an H200; skipped where no GPU is usable).

* Level 0 (GPU): one device array of slots.
* Level 1 (host): pinned host memory (`cupyx.zeros_pinned`), so device<->host
  copies are truly asynchronous on the copy stream.
* Level 2 (disk): a `numpy.memmap` file; host<->disk copies run as host
  callbacks (`Stream.launch_host_func`) on the copy stream, so they are ordered
  by the same events as the device copies. Device<->disk goes through a small
  pinned staging row kept alive until the next `synchronize_all`.

cupy is imported lazily: constructing this class is the only thing that needs it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from .protocol import EventRef, StreamRef


class CupyBackend:
    name = "cupy"

    def __init__(self, disk_dir: str | None = None, device: int = 0) -> None:
        import cupy
        import cupyx  # type: ignore[import-untyped]

        self._cp = cupy
        self._cpx = cupyx
        self.xp: Any = cupy
        self._device = cupy.cuda.Device(device)
        self._device.use()
        self._next_stream = 0
        self._next_event = 0
        self._disk_dir = disk_dir
        self._tmpdirs: list[tempfile.TemporaryDirectory[str]] = []
        self._keepalive: list[Any] = []  # staging buffers of in-flight disk copies
        self._streams: list[Any] = []
        self._level_of: dict[int, int] = {}  # id(pool) -> level

    # ---- memory ------------------------------------------------------------------------
    def create_pool(self, level: int, num_slots: int, slot_elems: int, dtype: Any) -> Any:
        shape = (num_slots, slot_elems)
        pool: Any
        if level == 0:
            pool = self._cp.zeros(shape, dtype=dtype)
        elif level == 1:
            pool = self._cpx.zeros_pinned(shape, dtype=dtype)
        else:
            if self._disk_dir is None:
                td = tempfile.TemporaryDirectory(prefix="kvpocket-disk-")
                self._tmpdirs.append(td)
                self._disk_dir = td.name
            n = len(os.listdir(self._disk_dir))
            path = os.path.join(self._disk_dir, f"level{level}-{n}.bin")
            pool = np.memmap(path, dtype=dtype, mode="w+", shape=shape)
        self._level_of[id(pool)] = level
        return pool

    def _on_device(self, pool: Any) -> bool:
        return isinstance(pool, self._cp.ndarray)

    # ---- streams and events ------------------------------------------------------------
    def new_stream(self, name: str) -> StreamRef:
        s = self._cp.cuda.Stream(non_blocking=True)
        self._streams.append(s)
        self._next_stream += 1
        return StreamRef(self._next_stream - 1, name, s)

    def new_event(self) -> EventRef:
        self._next_event += 1
        return EventRef(self._next_event, self._cp.cuda.Event(disable_timing=True))

    def record(self, event: EventRef, stream: StreamRef) -> None:
        event.raw.record(stream.raw)
        event.stream = stream

    def wait_event(self, stream: StreamRef, event: EventRef) -> None:
        if event.stream is None:
            return  # never recorded: CUDA treats it as complete
        stream.raw.wait_event(event.raw)

    def query(self, event: EventRef) -> bool:
        return bool(event.raw.done)

    def synchronize(self, event: EventRef) -> None:
        event.raw.synchronize()

    def synchronize_all(self) -> None:
        for s in self._streams:
            s.synchronize()
        self._device.synchronize()
        self._keepalive.clear()

    def launch(self, stream: StreamRef, fn: Callable[[], None], label: str = "kernel") -> None:
        with stream.raw:
            fn()

    def copy_slot(
        self, stream: StreamRef, dst_pool: Any, dst_slot: int, src_pool: Any, src_slot: int
    ) -> None:
        s = stream.raw
        dst_dev, src_dev = self._on_device(dst_pool), self._on_device(src_pool)
        if dst_dev and src_dev:
            with s:
                dst_pool[dst_slot] = src_pool[src_slot]
        elif src_dev:  # device -> host (pinned: async) or disk (via pinned staging)
            if self._level_of.get(id(dst_pool), 1) == 1:
                src_pool[src_slot].get(stream=s, out=dst_pool[dst_slot])
            else:
                stage = self._cpx.empty_pinned(src_pool.shape[1:], dtype=src_pool.dtype)
                self._keepalive.append(stage)
                src_pool[src_slot].get(stream=s, out=stage)
                self._host_copy(s, dst_pool, dst_slot, stage)
        elif dst_dev:  # host/disk -> device
            if self._level_of.get(id(src_pool), 1) == 1:
                dst_pool[dst_slot].set(src_pool[src_slot], stream=s)
            else:
                stage = self._cpx.empty_pinned(dst_pool.shape[1:], dtype=dst_pool.dtype)
                self._keepalive.append(stage)
                self._host_copy(s, stage, None, src_pool[src_slot])
                dst_pool[dst_slot].set(stage, stream=s)
        else:  # host <-> disk: a host callback ordered on the stream
            self._host_copy(s, dst_pool, dst_slot, src_pool[src_slot])

    def _host_copy(self, s: Any, dst: Any, dst_slot: int | None, src_row: Any) -> None:
        def cb(_arg: object) -> None:  # runs on a CUDA driver thread: no CUDA calls here
            if dst_slot is None:
                np.copyto(dst, src_row)
            else:
                dst[dst_slot] = src_row

        s.launch_host_func(cb, None)

    def to_numpy(self, arr: Any) -> np.ndarray[Any, Any]:
        self.synchronize_all()
        if self._on_device(arr):
            return np.asarray(self._cp.asnumpy(arr))
        return np.array(arr, copy=True)

    def device_table(self, host: np.ndarray[Any, Any]) -> Any:
        return self._cp.asarray(host)

    def close(self) -> None:
        self.synchronize_all()
        for td in self._tmpdirs:
            td.cleanup()
        self._tmpdirs.clear()
