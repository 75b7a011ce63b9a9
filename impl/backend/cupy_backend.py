"""CuPy backend for a real GPU (written for an H200; skipped where no GPU is usable).

* Level 0 (GPU): one device array of slots.
* Level 1 (host): pinned host memory (`cupyx.zeros_pinned`), so device<->host
  copies are truly asynchronous DMA on the copy stream.
* Level 2 (disk): a `numpy.memmap` file; host<->disk copies run as host
  callbacks (`Stream.launch_host_func`) on the copy stream, so they are ordered
  by the same events as the device copies. Device<->disk goes through a pinned
  staging buffer, kept alive until an event recorded after its last use completes.

Ordering (the contract in `protocol.py`): pools are zero-filled on a private
stream that is synchronised before `create_pool` returns; every stream this
backend makes is non-blocking; `launch` makes the given stream CuPy's current
stream while `fn` runs; copies are issued on the stream passed in with the raw
async API (`cudaMemcpyAsync` through `MemoryPointer.copy_*_async`: never the
blocking `ndarray.get`). Temporaries a copy allocates (index arrays, device
staging) are allocated while the copy stream is current: CuPy's memory pool
reuses freed blocks only for later work of the same stream, so they cannot be
recycled under an in-flight copy.

Batched copies (`copy_slots`): the pairs are sorted by the host-side slot and
split into runs where both sides are contiguous. Few or long runs: one DMA per
run. Many short runs: the device side goes through a contiguous device staging
buffer (one gather or scatter kernel) and the host side takes one DMA per
contiguous host run. `copy_mode` forces one strategy (for benchmarks).

cupy is imported lazily: constructing this class is the only thing that needs it.
"""

from __future__ import annotations

import os
import tempfile
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .protocol import Access, EventRef, StreamRef

DEV, PINNED, DISK = 0, 1, 2
COPY_MODES = ("auto", "runs", "staged")


def contiguous_runs(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]
                    ) -> list[tuple[int, int, int]]:
    """Maximal runs (a0, b0, n) where a[i:i+n] and b[i:i+n] both count up by one."""
    if a.size == 0:
        return []
    brk = np.nonzero((np.diff(a) != 1) | (np.diff(b) != 1))[0] + 1
    starts = np.concatenate(([0], brk))
    ends = np.concatenate((brk, [a.size]))
    return [(int(a[s]), int(b[s]), int(e - s)) for s, e in zip(starts, ends, strict=True)]


def use_runs(runs: list[tuple[int, int, int]], row_bytes: int, mode: str) -> bool:
    """One DMA per run (True) or a staged gather/scatter (False)."""
    if mode != "auto":
        return mode == "runs"
    if len(runs) <= 8:
        return True
    total = sum(n for _, _, n in runs) * row_bytes
    return total // len(runs) >= 256 << 10  # runs long enough that issue cost is hidden


class CupyBackend:
    name = "cupy"
    device_copies = True

    def __init__(self, disk_dir: str | None = None, device: int = 0,
                 copy_mode: str = "auto") -> None:
        import cupy
        import cupyx

        if copy_mode not in COPY_MODES:
            raise ValueError(f"copy_mode must be one of {COPY_MODES}, got {copy_mode!r}")
        self._cp = cupy
        self._cpx = cupyx
        self.xp: Any = cupy
        self.copy_mode = copy_mode
        self._device = cupy.cuda.Device(device)
        self._device.use()
        self._next_event = 0
        self._disk_dir = disk_dir
        self._tmpdirs: list[tempfile.TemporaryDirectory[str]] = []
        self._inflight: deque[tuple[Any, Any]] = deque()  # (event, pinned staging) in use
        self._refs: list[StreamRef] = []
        self._kind: dict[int, tuple[int, Any]] = {}  # id(pool) -> (DEV/PINNED/DISK, pool)
        self._setup = cupy.cuda.Stream(non_blocking=True)  # pool init, table uploads
        self._current_ref: StreamRef | None = None

    # ---- memory ------------------------------------------------------------------------
    def create_pool(self, level: int, num_slots: int, slot_elems: int, dtype: Any) -> Any:
        shape = (num_slots, slot_elems)
        pool: Any
        if level == 0:
            with self._setup:
                pool = self._cp.zeros(shape, dtype=dtype)
            self._setup.synchronize()  # the zero fill is complete: no stream races it
            kind = DEV
        elif level == 1:
            pool = self._cpx.zeros_pinned(shape, dtype=dtype)  # zeroed by the host
            kind = PINNED
        else:
            if self._disk_dir is None:
                td = tempfile.TemporaryDirectory(prefix="kvpocket-disk-")
                self._tmpdirs.append(td)
                self._disk_dir = td.name
            n = len(os.listdir(self._disk_dir))
            path = os.path.join(self._disk_dir, f"level{level}-{n}.bin")
            pool = np.memmap(path, dtype=dtype, mode="w+", shape=shape)
            kind = DISK
        self._kind[id(pool)] = (kind, pool)  # the reference keeps the id from being reused
        return pool

    def _kind_of(self, pool: Any) -> int:
        if isinstance(pool, self._cp.ndarray):
            return DEV
        known = self._kind.get(id(pool))
        return known[0] if known is not None else DISK  # unknown host memory: pageable

    # ---- streams and events ------------------------------------------------------------
    def new_stream(self, name: str) -> StreamRef:
        ref = StreamRef(len(self._refs), name, self._cp.cuda.Stream(non_blocking=True))
        self._refs.append(ref)
        return ref

    def current_stream(self) -> StreamRef:
        raw = self._cp.cuda.get_current_stream()
        if self._current_ref is None or self._current_ref.raw is not raw:
            self._current_ref = StreamRef(-1, "current", raw)
        return self._current_ref

    def join_current(self, streams: Sequence[StreamRef] | None = None) -> None:
        ev = self._cp.cuda.Event(disable_timing=True)
        ev.record(self._cp.cuda.get_current_stream())
        for s in self._refs if streams is None else streams:
            s.raw.wait_event(ev)

    def wait_streams(self, stream: StreamRef, others: Sequence[StreamRef]) -> None:
        for o in others:
            if o.raw is not stream.raw:
                ev = self._cp.cuda.Event(disable_timing=True)
                ev.record(o.raw)
                stream.raw.wait_event(ev)

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
        for r in self._refs:
            r.raw.synchronize()
        self._device.synchronize()
        self._inflight.clear()

    def launch(self, stream: StreamRef, fn: Callable[[], None], label: str = "kernel",
               reads: Sequence[Access] = (), writes: Sequence[Access] = ()) -> None:
        with stream.raw:
            fn()

    # ---- copies ------------------------------------------------------------------------
    def copy_slot(
        self, stream: StreamRef, dst_pool: Any, dst_slot: int, src_pool: Any, src_slot: int
    ) -> None:
        self.copy_slots(stream, dst_pool, (dst_slot,), src_pool, (src_slot,))

    def copy_slots(self, stream: StreamRef, dst_pool: Any, dst_slots: Sequence[int],
                   src_pool: Any, src_slots: Sequence[int]) -> None:
        dst = np.asarray(dst_slots, dtype=np.int64).reshape(-1)
        src = np.asarray(src_slots, dtype=np.int64).reshape(-1)
        if dst.shape != src.shape:
            raise ValueError(f"copy_slots: {dst.size} destination and {src.size} source slots")
        if dst_pool is src_pool:
            raise ValueError("copy_slots: source and destination must be different pools")
        if dst.size == 0:
            return
        if np.unique(dst).size != dst.size:
            raise ValueError("copy_slots: destination slots must be distinct")
        if dst_pool.dtype != src_pool.dtype or dst_pool.shape[1:] != src_pool.shape[1:]:
            raise ValueError("copy_slots: pools differ in dtype or slot size")
        s = stream.raw
        sk, dk = self._kind_of(src_pool), self._kind_of(dst_pool)
        if sk == DEV and dk == DEV:
            self._dev_to_dev(s, dst_pool, dst, src_pool, src)
        elif sk == DEV:
            self._dev_to_host(s, dst_pool, dst, src_pool, src, dk)
        elif dk == DEV:
            self._host_to_dev(s, dst_pool, dst, src_pool, src, sk)
        else:  # host <-> disk: a host callback ordered on the stream
            self._host_func(s, _row_copy(dst_pool, dst, src_pool, src))
        self._retire()

    @staticmethod
    def _row_bytes(pool: Any) -> int:
        return int(pool.shape[1]) * int(pool.dtype.itemsize)

    def _dev_to_dev(self, s: Any, dst_pool: Any, dst: Any, src_pool: Any, src: Any) -> None:
        rb = self._row_bytes(src_pool)
        order = np.argsort(dst, kind="stable")
        runs = contiguous_runs(dst[order], src[order])
        with s:
            if use_runs(runs, rb, self.copy_mode):
                for d0, s0, n in runs:
                    dst_pool[d0:d0 + n].data.copy_from_device_async(
                        src_pool[s0:s0 + n].data, n * rb, s)
            else:
                cp = self._cp
                dst_pool[cp.asarray(dst)] = src_pool[cp.asarray(src)]

    def _dev_to_host(self, s: Any, host: Any, dst: Any, dev: Any, src: Any, kind: int) -> None:
        rb = self._row_bytes(dev)
        order = np.argsort(dst, kind="stable")
        dst, src = dst[order], src[order]
        runs = contiguous_runs(dst, src)
        if kind == PINNED and use_runs(runs, rb, self.copy_mode):
            for d0, s0, n in runs:  # one DMA per contiguous run, straight into the pool
                dev[s0:s0 + n].data.copy_to_host_async(_row_ptr(host, d0), n * rb, s)
            return
        with s:  # gather into contiguous device staging (allocated on the copy stream)
            stage = dev[self._cp.asarray(src)] if len(runs) > 1 else dev[runs[0][1]:][:dst.size]
        if kind == PINNED:
            for k, d0, n in host_runs(dst):  # one DMA per contiguous host run
                stage[k:k + n].data.copy_to_host_async(_row_ptr(host, d0), n * rb, s)
            return
        pinned = self._cpx.empty_pinned(stage.shape, dtype=stage.dtype)
        stage.data.copy_to_host_async(pinned.ctypes.data, dst.size * rb, s)
        self._host_func(s, _row_scatter(host, dst, pinned))
        self._keep(s, pinned)

    def _host_to_dev(self, s: Any, dev: Any, dst: Any, host: Any, src: Any, kind: int) -> None:
        rb = self._row_bytes(dev)
        order = np.argsort(src, kind="stable")
        dst, src = dst[order], src[order]
        runs = contiguous_runs(src, dst)
        if kind == PINNED and use_runs(runs, rb, self.copy_mode):
            for s0, d0, n in runs:  # one DMA per contiguous run, straight into the pool
                dev[d0:d0 + n].data.copy_from_host_async(_row_ptr(host, s0), n * rb, s)
            return
        cp = self._cp
        with s:
            stage = cp.empty((dst.size, *dev.shape[1:]), dtype=dev.dtype)
        if kind == PINNED:
            for k, s0, n in host_runs(src):  # one DMA per contiguous host run
                stage[k:k + n].data.copy_from_host_async(_row_ptr(host, s0), n * rb, s)
        else:
            pinned = self._cpx.empty_pinned(stage.shape, dtype=stage.dtype)
            self._host_func(s, _row_gather(pinned, host, src))
            stage.data.copy_from_host_async(pinned.ctypes.data, dst.size * rb, s)
            self._keep(s, pinned)
        with s:  # scatter from the staging buffer (one kernel)
            dev[cp.asarray(dst)] = stage

    def _host_func(self, s: Any, fn: Callable[[], None]) -> None:
        def cb(_arg: object) -> None:  # runs on a CUDA driver thread: no CUDA calls here
            fn()

        s.launch_host_func(cb, None)

    def _keep(self, s: Any, buf: Any) -> None:
        """Keep pinned staging alive until the stream is past its last use."""
        ev = self._cp.cuda.Event(disable_timing=True)
        ev.record(s)
        self._inflight.append((ev, buf))

    def _retire(self) -> None:
        while self._inflight and self._inflight[0][0].done:
            self._inflight.popleft()

    # ---- host access -------------------------------------------------------------------
    def to_numpy(self, arr: Any) -> np.ndarray[Any, Any]:
        self.synchronize_all()
        if isinstance(arr, self._cp.ndarray):
            return np.asarray(self._cp.asnumpy(arr))
        return np.array(arr, copy=True)

    def device_table(self, host: np.ndarray[Any, Any], stream: StreamRef | None = None) -> Any:
        if stream is not None:  # allocated and uploaded in the consumer's stream order
            with stream.raw:
                return self._cp.asarray(host)
        with self._setup:
            out = self._cp.asarray(host)
        self._setup.synchronize()  # the upload is complete when this returns
        return out

    def close(self) -> None:
        self.synchronize_all()
        for td in self._tmpdirs:
            td.cleanup()
        self._tmpdirs.clear()


def _row_ptr(host: Any, row: int) -> int:
    return int(host.ctypes.data) + row * int(host.strides[0])


def host_runs(slots: np.ndarray[Any, Any]) -> list[tuple[int, int, int]]:
    """(offset into the batch, first slot, length) of each run of consecutive `slots`."""
    out: list[tuple[int, int, int]] = []
    k = 0
    for a0, _, n in contiguous_runs(slots, slots):
        out.append((k, a0, n))
        k += n
    return out


def _row_copy(dst_pool: Any, dst: Any, src_pool: Any, src: Any) -> Callable[[], None]:
    def run() -> None:
        dst_pool[dst] = src_pool[src]
    return run


def _row_scatter(dst_pool: Any, dst: Any, rows: Any) -> Callable[[], None]:
    def run() -> None:
        dst_pool[dst] = rows
    return run


def _row_gather(out: Any, src_pool: Any, src: Any) -> Callable[[], None]:
    def run() -> None:
        np.take(src_pool, src, axis=0, out=out)
    return run
