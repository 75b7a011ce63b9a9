"""Data oracle: a decode engine that stamps every written slot and re-checks history.

Each token position p of sequence s carries a content-addressed stamp per life
cycle: `mix(prefix_hash(tokens[0..p]), lc, p, j)` for the `j`-th of the
elements the position owns in its slot. Two sequences with the same prefix
therefore expect the same stamps (prefix reuse is checked), and different
sequences differ (aliasing is caught).

Layout of a slot (`slot_elems` elements, `t = tokens_per_block` positions):

* `slot_elems >= t`: each position owns `ept = slot_elems // t` elements;
* `slot_elems < t` (e.g. the default 8 with 32 tokens per block): `ppe =
  ceil(t / slot_elems)` consecutive positions share one element, which carries the
  stamp of the group's first position; every write of any position of the group
  writes that same value, so the expected content never depends on write order.

Expected stamps are computed once, when tokens are added, into a table indexed
(sequence row, life cycle, position); a device mirror of it is refreshed
incrementally. A check is one vectorized pass: gather the slots of the blocks in
the window through the page tables (whole rows), compare every in-window position
with the table on the device, count mismatches there, and copy back only the
mismatching positions.

Two ways to read:

* `verify(kv)` enqueues a read of the window on the sequence's own stream (so on the
  simulator it runs exactly when the harness advances that stream: a missing event
  wait shows up as a mismatch); `check()`/`collect()` compare all pending reads in
  one pass.
* `sweep()` checks the current window of every active sequence at once, on the
  oracle's stream ordered after each sequence's stream by an event: the fast path.
  It reuses what did not change since the last sweep: the handles' ids and table
  rows, the block structure (every segment's first block and number of blocks; per
  sweep only the window bounds of each segment's end blocks are worked out, the
  blocks in between are wholly in the window) and the expected rows of those blocks
  (gathered again only for blocks whose stamps were stored since). The page tables,
  histories and capacities are read afresh every time. On NumPy the rows are
  gathered and compared a cache-sized chunk at a time; on an eager simulator with
  nothing queued, no race detector and no trace, the compare runs inline instead of
  as a launch that would run at once anyway.

The same code runs with `xp = numpy` or `xp = cupy`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise, repeat
from operator import attrgetter
from typing import Any

import numpy as np

from kvpocket.impl.backend.numpy_sim import NumpyBackend
from kvpocket.impl.backend.protocol import StreamRef
from kvpocket.impl.kvcache import KVCache
from kvpocket.impl.manager import KVCacheManager
from kvpocket.model.config import BAD_PAGE_INDEX, LifeCycle, SeqStatus, stale_range

_M1 = np.uint32(0x85EBCA6B)
_M2 = np.uint32(0xC2B2AE35)
_GOLD = np.uint32(0x9E3779B1)
_MASK = 0xFFFFFFFF
_STALE_MAX = 1 << 16  # stored blocks remembered for the sweep's expected rows, at most
_ACTIVE = SeqStatus.ACTIVE  # an enum member through its class costs a lookup per access
_SEQ_ID, _HISTORY, _CAPACITY, _INDEX = (attrgetter(a) for a in
                                        ("seq_id", "history", "capacity", "index"))


def mix32(x: Any) -> Any:
    """murmur3 finaliser on uint32 arrays (numpy or cupy; wraps modulo 2**32)."""
    x = x ^ (x >> 16)
    x = x * _M1
    x = x ^ (x >> 13)
    x = x * _M2
    return x ^ (x >> 16)


def mix32_int(x: int) -> int:
    """`mix32` of one value, on Python ints (the same result, without array overhead)."""
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & _MASK
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & _MASK
    return x ^ (x >> 16)


_WIDE = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def _any_last(xp: Any, neq: Any) -> Any:
    """`neq.any(axis=2)` for a contiguous bool (n, t, k) array: for k of 1, 2, 4 or 8 the
    k bytes of a position are read as one integer (a numpy reduction over a tiny last
    axis is about ten times slower than an elementwise compare)."""
    k = neq.shape[2]
    wide = _WIDE.get(k)
    if wide is None:
        return neq.any(axis=2)
    return neq.view(wide).reshape(neq.shape[0], neq.shape[1]) != 0


@dataclass(frozen=True)
class Mismatch:
    seq: int
    lc: int
    block: int
    token: int
    expected: int
    found: int
    slot: int

    def __str__(self) -> str:
        return (f"seq {self.seq} lc {self.lc} block {self.block} token {self.token}: "
                f"expected {self.expected:#010x}, found {self.found:#010x} (slot {self.slot})")


@dataclass
class _Blocks:
    """Block-granular read entries (host integer arrays, one element per block read; slot
    holds the page tables' int32, the others int64)."""

    seq: np.ndarray[Any, Any]
    row: np.ndarray[Any, Any]  # row of the expected-stamp table
    lc: np.ndarray[Any, Any]
    blk: np.ndarray[Any, Any]
    slot: np.ndarray[Any, Any]
    lo: np.ndarray[Any, Any]  # first in-window offset within the block
    hi: np.ndarray[Any, Any]  # one past the last

    def take(self, sel: np.ndarray[Any, Any]) -> _Blocks:
        return _Blocks(self.seq[sel], self.row[sel], self.lc[sel], self.blk[sel],
                       self.slot[sel], self.lo[sel], self.hi[sel])

    @staticmethod
    def concat(parts: Sequence[_Blocks]) -> _Blocks:
        return _Blocks(*(np.concatenate([getattr(p, f) for p in parts])
                         for f in ("seq", "row", "lc", "blk", "slot", "lo", "hi")))

    @property
    def positions(self) -> int:
        return int((self.hi - self.lo).sum())


_Rows = Callable[[int, int, int], Any]
"""rows(pool group, start, end): the compared blocks' rows [start, end), all of one group."""

_Who = tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any],
             np.ndarray[Any, Any]]
"""Per block compared: sequence, life cycle, block and slot (what a mismatch reports)."""


def _who(plan: _Blocks) -> _Who:
    return plan.seq, plan.lc, plan.blk, plan.slot


@dataclass
class _Shape:
    """The block structure of a sweep, valid while the same handles are swept, every
    segment keeps its first block and number of blocks (`key`), and the expected-stamp
    table keeps its width. Per block arrays are in the compare's order: the blocks at
    either end of a segment first (their window bounds change with the history; the others
    are wholly in the window), then by pool group, then in plan order."""

    key: bytes  # per segment: first block, end block (exclusive) and whether not empty
    width: int
    sid: np.ndarray[Any, Any]  # per sequence swept: its id
    seqix: np.ndarray[Any, Any]  # per block: its sequence's index in `sid`
    segix: np.ndarray[Any, Any]  # per block: its segment among its sequence's
    row: np.ndarray[Any, Any]
    lc: np.ndarray[Any, Any]
    blk: np.ndarray[Any, Any]
    flat: np.ndarray[Any, Any]  # index into the handles' page tables, concatenated, flattened
    eidx: np.ndarray[Any, Any]  # chunk of the expected table, (row, lc, block)
    spans: tuple[tuple[int, int, int], ...]  # (pool group, start, end): one gather each
    # rank in the order mismatches are reported in (pool group, then plan order; None:
    # the compare's order is that order)
    rank: np.ndarray[Any, Any] | None
    # the first len(eseg) blocks (the segments' end blocks): segment, and the terms of
    # the window mask's code (`_masks`) lo * (t + 1) + hi = a * ca + b * cb + c, where
    # [a, b) is the segment's window (lo = a - base for a first block, else 0; hi = b -
    # base for a last block, else t)
    eseg: np.ndarray[Any, Any]
    ca: np.ndarray[Any, Any]
    cb: np.ndarray[Any, Any]
    c: np.ndarray[Any, Any]
    nrows: int  # rows of the expected-stamp table when made
    _where: np.ndarray[Any, Any] | None = None

    @property
    def size(self) -> int:
        return int(self.blk.size)

    def who(self, slot: np.ndarray[Any, Any]) -> _Who:
        return self.sid.take(self.seqix), self.lc, self.blk, slot

    def where(self, max_blocks: int, segments: int) -> np.ndarray[Any, Any]:
        """(row * max_blocks + block, segment of the sequence) -> the block's index here
        (-1: not swept), for the rows the table had when the structure was made."""
        if self._where is None:
            where = np.full((self.nrows * max_blocks, segments), -1, dtype=np.int64)
            where[self.row * max_blocks + self.blk, self.segix] = np.arange(self.size)
            self._where = where
        return self._where


class _SweepCache:
    """What `sweep` planned and gathered last time, reused while it stays the same: the
    handles (with their seq ids, stamp-table rows and streams), the block structure, and
    the expected rows of that structure's blocks."""

    def __init__(self) -> None:
        self.kvs: list[KVCache] = []
        self.nrows = -1  # len(oracle._row) when `rows` was read (-1: never)
        self.sid: np.ndarray[Any, Any] = np.zeros(0, dtype=np.int64)
        self.rows: np.ndarray[Any, Any] = self.sid
        self.streams: list[StreamRef] = []
        self.shape: _Shape | None = None
        # (blocks, t * ept) expected rows of `want_shape`'s blocks, gathered from the table
        # `want_exp` (the host table, or its device mirror; a new one means a full gather)
        self.want: Any = None
        self.want_shape: _Shape | None = None
        self.want_exp: Any = None


@dataclass
class _Read:
    """A `verify` read in flight: per pool group, its entries and the gathered rows."""

    parts: list[tuple[_Blocks, list[Any]]]

    def ran(self) -> bool:
        return all(box for _, box in self.parts)


def window_segments(lcfg: LifeCycle, h: int, written: int) -> list[tuple[int, int]]:
    """Token position ranges [a, b) attention reads at history h: sink tokens plus
    [h+1-w, h], limited to the `written` positions."""
    if written <= 0:
        return []
    if lcfg.window is None:
        return [(0, written)]
    lo = max(0, h + 1 - lcfg.window)
    sink = min(lcfg.sink_tokens, written)
    if lo <= sink:
        return [(0, written)]
    segs = [(0, sink)] if sink > 0 else []
    if written > lo:
        segs.append((lo, written))
    return segs


class DecodeOracle:
    def __init__(self, mgr: KVCacheManager) -> None:
        if mgr.dtype != np.int32 and mgr.dtype != np.uint32:
            raise ValueError("the data oracle needs an int32/uint32 slot pool")
        self.mgr = mgr
        self.backend = mgr.backend
        self.xp = mgr.backend.xp
        backend = self.backend
        # the stream simulator (None on a GPU), and whether its launch is the plain one
        self._sim = backend.sim if isinstance(backend, NumpyBackend) else None
        self._plain_launch = type(backend).launch is NumpyBackend.launch
        t = self.t = mgr.cfg.tokens_per_block
        se = mgr.slot_elems
        self.ept = max(1, se // t)  # elements per token position
        self.ppe = -(-t // se) if se < t else 1  # token positions per element
        off = np.arange(t, dtype=np.int64)
        # column(s) of each offset in its slot, and the offset whose stamp it carries
        self.cols = ((off // self.ppe) * self.ept)[:, None] + np.arange(self.ept)[None, :]
        self.rep = (off // self.ppe) * self.ppe
        # whole rows with an even number of elements per position: compare them two at a
        # time (uint64 views of the uint32 rows)
        self._unit = ("uint64" if self.ppe == 1 and self.ept % 2 == 0 and se == t * self.ept
                      else None)
        self._jsalt = [(j * 0xC2B2AE35 + 7) & _MASK for j in range(self.ept)]
        self._nlc = mgr.cfg.num_life_cycles
        self._max_blocks = mgr.cfg.max_blocks
        self._pools = [mgr.pool(0, g) for g in range(mgr.cfg.num_pool_groups)]
        self._wins = [(lc.window, lc.sink_tokens) for lc in mgr.cfg.life_cycles]
        self._group_of_lc = np.array([mgr.cfg.pool_group_of(i) for i in range(self._nlc)])
        # the plan's segments, in order: per life cycle the sink tokens apart from the
        # window (if it has both), then the window (or everything, without a window)
        self._seg_lc = np.array([lc for lc, (w, sink) in enumerate(self._wins)
                                 for _ in range(2 if w is not None and sink else 1)],
                                dtype=np.int64)
        self.tokens: dict[int, list[int]] = {}
        self.ph: dict[int, list[int]] = {}  # prefix hash per position
        self._row: dict[int, int] = {}  # sequence id -> row of the expected-stamp table
        # tokens known per row; longer than the rows in use, so that row -1 (a sequence
        # without tokens) reads 0
        self._ntok = np.zeros(1, dtype=np.int64)
        # blocks (row * max_blocks + block) whose stamps were stored since the sweep's
        # expected rows were last brought up to date (None: too many to list)
        self._stale: list[int] | None = []
        self._exp = np.zeros((0, self._nlc, 0, self.ept), dtype=np.uint32)
        self._mirror: Any = None  # device copy of `_exp` (where `backend.device_copies`)
        self._dirty: tuple[int, int] | None = None  # positions changed since the upload
        self._consts: Any = None  # device copies of cols / rep
        # window masks: [lo * (t + 1) + hi, o] = lo <= o < hi
        lo_hi, o = np.arange(t + 1), np.arange(t)
        self._masks = ((o[None, None, :] >= lo_hi[:, None, None])
                       & (o[None, None, :] < lo_hi[None, :, None])).reshape(-1, t)
        self._pending: list[_Read] = []
        self._sweep_cache = _SweepCache()
        self._chunk = max(1, (1 << 17) // (4 * se))  # blocks gathered at a time (NumPy)
        z = np.zeros(0, dtype=np.int64)
        self._empty = _Blocks(z, z, z, z, z.astype(np.int32), z, z)
        self._stream: StreamRef | None = None
        self.mismatches: list[Mismatch] = []
        self.missing: list[str] = []
        self.verified_positions = 0  # positions compared by check/collect/sweep so far

    # ---- tokens and stamps -------------------------------------------------------------
    def token_for(self, seq: int, pos: int) -> int:
        return mix32_int((seq * 0x01000193 + pos * 0x9E37) & _MASK) % 50000

    def add_tokens(self, seq: int, tokens: list[int]) -> None:
        toks = self.tokens.setdefault(seq, [])
        ph = self.ph.setdefault(seq, [])
        start = len(toks)
        for tok in tokens:
            prev = ph[-1] if ph else 0x811C9DC5
            ph.append(mix32_int(((prev * 0x01000193) ^ tok ^ (len(toks) << 7)) & _MASK))
            toks.append(tok)
        if len(toks) > start:
            self._store_stamps(seq, start, len(toks))
            self._ntok[self._row[seq]] = len(toks)

    def stamps(self, seq: int, lc: int, positions: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """uint32 array (len(positions), ept) of expected values."""
        ph = np.asarray(self.ph[seq], dtype=np.uint32)[positions]
        base = mix32(ph ^ np.uint32(((lc + 1) * 0x9E3779B1) & _MASK))
        j = np.arange(self.ept, dtype=np.uint32)
        out: np.ndarray[Any, Any] = mix32(base[:, None] ^ (j[None, :] * _M2 + np.uint32(7)))
        return out

    def _store_stamps(self, seq: int, a: int, b: int) -> None:
        """Fill the expected-stamp table for positions [a, b) of `seq`."""
        row = self._row.get(seq)
        if row is None:
            row = self._row[seq] = len(self._row)
            if row + 1 >= self._ntok.size:  # keep one spare entry (row -1)
                self._ntok = np.concatenate([self._ntok,
                                             np.zeros(self._ntok.size + 1, dtype=np.int64)])
        rows, _, width, _ = self._exp.shape
        need_w = -(-b // self.t) * self.t
        if row >= rows or need_w > width:  # grow what is short (doubling), keep the rest
            grown = np.zeros((rows if row < rows else max(2 * rows, row + 1), self._nlc,
                              width if need_w <= width else max(2 * width, need_w), self.ept),
                             dtype=np.uint32)
            grown[:rows, :, :width] = self._exp
            self._exp = grown
            self._mirror = None  # re-upload whole
        if b - a <= 4:  # a decode step: Python ints beat array overhead
            ph = self.ph[seq]
            for lc in range(self._nlc):
                salt = ((lc + 1) * 0x9E3779B1) & _MASK
                for p in range(a, b):
                    base = mix32_int(ph[p] ^ salt)
                    self._exp[row, lc, p] = [mix32_int(base ^ js) for js in self._jsalt]
        else:
            pos = np.arange(a, b)
            for lc in range(self._nlc):
                self._exp[row, lc, a:b] = self.stamps(seq, lc, pos)
        lo, hi = self._dirty if self._dirty is not None else (a, b)
        self._dirty = (min(lo, a), max(hi, b))
        stale = self._stale
        if stale is not None:
            mb, first = self._max_blocks, a // self.t
            last = min((b - 1) // self.t, mb - 1)  # blocks past max_blocks are never read
            if len(stale) + last - first >= _STALE_MAX:
                self._stale = None
            elif last == first:  # a decode step
                stale.append(row * mb + first)
            else:
                stale.extend(range(row * mb + first, row * mb + last + 1))

    def _device_consts(self) -> tuple[Any, Any, Any]:
        """(expected table, cols, rep) as arrays of the backend's module; on CuPy the table
        upload runs on the current stream (the oracle's). On the simulator's device-mirror
        mode the same path keeps a separate copy (a missed upload then shows on the CPU)."""
        xp = self.xp
        if not self.backend.device_copies:
            return self._exp, self.cols, self.rep
        upload: Callable[[Any], Any] = np.array if xp is np else xp.asarray  # np: a copy
        if self._mirror is None:
            self._mirror = upload(self._exp)
        elif self._dirty is not None:
            lo, hi = self._dirty
            self._mirror[:, :, lo:hi] = upload(np.ascontiguousarray(self._exp[:, :, lo:hi]))
        self._dirty = None
        if self._consts is None:
            self._consts = (upload(self.cols), upload(self.rep))
        cols, rep = self._consts
        return self._mirror, cols, rep

    # ---- planning: which blocks, which slots -------------------------------------------
    def _written(self, kv: KVCache) -> int:
        return min(kv.history + 1, len(self.tokens.get(kv.seq_id, [])), kv.capacity)

    def _bounds(self, kvs: Sequence[KVCache],
                rows: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Per segment, segment-major then sequence (see `_seg_lc`): the token range [a, b)
        that attention reads now, limited to the written positions (a >= b: none).
        `rows`: the sequences' rows of the expected-stamp table (-1: no tokens)."""
        n = len(kvs)
        h1 = np.fromiter(map(_HISTORY, kvs), np.int64, n)
        h1 += 1
        written = self._ntok.take(rows)
        np.minimum(written, h1, out=written)
        np.minimum(written, np.fromiter(map(_CAPACITY, kvs), np.int64, n), out=written)
        segs: list[tuple[np.ndarray[Any, Any] | None, np.ndarray[Any, Any]]] = []  # None: 0
        for window, sink_tokens in self._wins:
            if window is None:
                segs.append((None, written))
                continue
            lo = h1 - window
            np.maximum(lo, 0, out=lo)
            if sink_tokens:
                sink = np.minimum(sink_tokens, written)
                apart = lo > sink  # else sink and window touch: one segment from 0
                segs.append((None, np.where(apart, sink, 0)))
                lo = np.where(apart, lo, 0)
            segs.append((lo, written))
        if len(segs) == 1:
            a = segs[0][0]
            return (np.zeros(n, dtype=np.int64) if a is None else a), segs[0][1]
        zero = np.zeros(n, dtype=np.int64)
        return (np.concatenate([zero if x is None else x for x, _ in segs]),
                np.concatenate([x for _, x in segs]))

    def _extent(self, a: np.ndarray[Any, Any],
                b: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Per segment [a, b): its first block and number of blocks (0: empty)."""
        t = self.t
        first = a // t
        nb = (b + (t - 1)) // t - first
        nb *= b > a
        return first, nb

    @staticmethod
    def _expand(first: np.ndarray[Any, Any],
                nb: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Per block of the segments (first block, number of blocks), in order: its segment,
        and the block."""
        which = np.repeat(np.arange(nb.size), nb)
        return which, np.arange(which.size) + (first - (np.cumsum(nb) - nb))[which]

    def _plan(self, kvs: Sequence[KVCache]) -> _Blocks:
        """The blocks of every in-window position of every life cycle of `kvs`, with the
        slot each one's page table gives now (BAD_PAGE_INDEX where there is no page), in
        plan order: segment-major (see `_seg_lc`), then sequence, then block. Vectorized
        over sequences: one range of positions per segment and sequence, expanded to
        blocks with one `repeat`."""
        t, n = self.t, len(kvs)
        if n == 0:
            return self._empty
        sid = np.fromiter(map(_SEQ_ID, kvs), np.int64, n)
        rows = np.fromiter(map(self._row.get, sid.tolist(), repeat(-1, n)), np.int64, n)
        a, b = self._bounds(kvs, rows)
        which, blk = self._expand(*self._extent(a, b))
        if which.size == 0:
            return self._empty
        base = blk * t
        kk, ll = which % n, self._seg_lc[which // n]
        slot = np.concatenate([kv.index for kv in kvs])[kk * self._nlc + ll, blk]
        return _Blocks(sid[kk], rows[kk], ll, blk, slot, np.maximum(a[which] - base, 0),
                       np.minimum(b[which] - base, t))

    def _sweep_plan(self, kvs: list[KVCache]) -> tuple[
            _Shape, np.ndarray[Any, Any], np.ndarray[Any, Any], int] | None:
        """The sweep's plan of `kvs` (None: no blocks): the block structure, each block's
        slot now (in the structure's order), the window mask of its first blocks (the
        segments' end blocks; the others are wholly in the window), and the number of
        positions. The handles' ids and rows and the structure come from the last sweep
        while they stay the same: a decode step's sweep reads the handles' history,
        capacity and page tables, and works out the window bounds per segment."""
        cache, t, n = self._sweep_cache, self.t, len(kvs)
        if n == 0:
            return None
        if cache.nrows != len(self._row) or cache.kvs != kvs:
            sid = np.fromiter(map(_SEQ_ID, kvs), np.int64, n)
            cache.rows = np.fromiter(map(self._row.get, sid.tolist(), repeat(-1, n)),
                                     np.int64, n)
            cache.kvs, cache.nrows, cache.sid = list(kvs), len(self._row), sid
            cache.streams = [kv.stream for kv in kvs]
            cache.shape = None
        a, b = self._bounds(kvs, cache.rows)
        first, end, full = a // t, (b + (t - 1)) // t, b > a
        key, width, shape = (first.tobytes() + end.tobytes() + full.tobytes(),
                             self._exp.shape[2], cache.shape)
        if shape is None or shape.key != key or shape.width != width:
            shape = cache.shape = self._sweep_shape(first, (end - first) * full, key, width,
                                                    cache.sid, cache.rows)
        if shape.size == 0:
            return None
        code = a.take(shape.eseg)
        code *= shape.ca
        code += shape.c
        hi = b.take(shape.eseg)
        hi *= shape.cb
        code += hi
        mask = self._masks.take(code, axis=0)
        positions = int(np.count_nonzero(mask)) + (shape.size - mask.shape[0]) * t
        slot = np.concatenate([kv.index for kv in kvs]).take(shape.flat)
        return shape, slot, mask, positions

    def _sweep_shape(self, first: np.ndarray[Any, Any], nb: np.ndarray[Any, Any], key: bytes,
                     width: int, sid: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]) -> _Shape:
        """The sweep's block structure for segments (first block, number of blocks)."""
        n, t, nlc, mb = sid.size, self.t, self._nlc, self._max_blocks
        which = np.repeat(np.arange(nb.size), nb)  # per block, in plan order: its segment
        k = np.arange(which.size) - (np.cumsum(nb) - nb).take(which)  # index in the segment
        isfirst, islast = k == 0, k == (nb - 1).take(which)
        edge = isfirst | islast
        ne, size = int(np.count_nonzero(edge)), which.size
        if len(self._pools) == 1:  # end blocks first, else in plan order
            order = np.concatenate((np.flatnonzero(edge), np.flatnonzero(~edge)))
            rank = None if ne == size else order  # plan order is the report order
            spans: tuple[tuple[int, int, int], ...] = ((0, 0, size),)
        else:  # end blocks first, then by pool group, else in plan order
            group = self._group_of_lc.take(self._seg_lc.take(which // n))
            order = np.lexsort((group, ~edge))
            ref = np.argsort(group, kind="stable")  # the report order: by group
            rank = np.empty_like(order)
            rank[ref] = np.arange(size)
            rank = rank.take(order)
            cgroup = group.take(order)
            cuts = [0, *(np.flatnonzero(np.diff(cgroup)) + 1).tolist(), size]
            spans = tuple((int(cgroup[s]), s, e) for s, e in pairwise(cuts) if e > s)
        wo, e = which.take(order), order[:ne]
        ko, so = wo % n, wo // n  # sequence, and its segment
        bo = (k + first.take(which)).take(order)
        lc, row = self._seg_lc.take(so), rows.take(ko)
        ca, cb = isfirst.take(e) * (t + 1), islast.take(e) * 1
        return _Shape(key=key, width=width, sid=sid, seqix=ko, segix=so, row=row, lc=lc, blk=bo,
                      flat=(ko * nlc + lc) * mb + bo, eidx=(row * nlc + lc) * (width // t) + bo,
                      spans=spans, rank=rank, eseg=wo[:ne], ca=ca, cb=cb,
                      c=(t - cb * t) - (ca + cb) * (bo[:ne] * t), nrows=len(self._row))

    def _split_missing(self, plan: _Blocks, kvs: Sequence[KVCache]) -> _Blocks:
        """Report positions whose block has no page; return the entries that have one."""
        bad = plan.slot == BAD_PAGE_INDEX
        if not bad.any():
            return plan
        by_seq = {kv.seq_id: kv for kv in kvs}
        lcs = self.mgr.cfg.life_cycles
        for i in np.nonzero(bad)[0]:
            kv, lc, blk = by_seq[int(plan.seq[i])], int(plan.lc[i]), int(plan.blk[i])
            s, e = stale_range(lcs[lc], kv.history, self.t)
            for q in range(blk * self.t + int(plan.lo[i]), blk * self.t + int(plan.hi[i])):
                self.missing.append(f"seq {kv.seq_id} lc {lc} token {q}: block {blk} "
                                    f"has no page (stale range {s}..{e})")
        return plan.take(~bad)

    def _by_group(self, plan: _Blocks) -> list[tuple[int, _Blocks]]:
        if len(self._pools) == 1:
            return [(0, plan)]
        groups = self._group_of_lc[plan.lc]
        return [(int(g), plan.take(groups == g)) for g in np.unique(groups)]

    # ---- writing -----------------------------------------------------------------------
    def write(self, kv: KVCache, positions: np.ndarray[Any, Any] | list[int]) -> None:
        """Enqueue the stamps of `positions` (tokens must be known) into their slots, for
        every life cycle whose block has a locked page."""
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if pos.size == 0:
            return
        xp, backend, t = self.xp, self.backend, self.t
        row, declare = self._row[kv.seq_id], self._declares_footprints()
        blk, off = pos // t, pos % t
        for lc in range(self._nlc):
            slots = kv.index[lc][blk].astype(np.int64)
            ok = slots != BAD_PAGE_INDEX
            if not ok.all():
                if not ok.any():
                    continue
                slots, o, b = slots[ok], off[ok], blk[ok]
            else:
                o, b = off, blk
            pool = self._pools[int(self._group_of_lc[lc])]
            cc = self.cols[o]  # (n, ept)
            rr = np.repeat(slots, self.ept).reshape(cc.shape)
            vals = self._exp[row, lc, b * t + self.rep[o]].view(np.int32)
            vals = vals.astype(pool.dtype, copy=False)

            # Host->device conversion inside `run`, i.e. on the sequence's stream.
            def run(pool: Any = pool, rr: Any = rr, cc: Any = cc, vals: Any = vals) -> None:
                pool[xp.asarray(rr), xp.asarray(cc)] = xp.asarray(vals)

            backend.launch(kv.stream, run, "oracle write",
                           writes=((pool, slots.tolist()),) if declare else ())

    # ---- stream-ordered reads ----------------------------------------------------------
    def verify(self, kv: KVCache) -> None:
        """Enqueue a read of every in-window position of every life cycle on the
        sequence's stream (compared later by `check`/`collect`). Positions whose block
        has no locked page are reported as missing now."""
        if kv.status is not _ACTIVE:
            return
        plan = self._split_missing(self._plan([kv]), [kv])
        if plan.slot.size == 0:
            return
        xp = self.xp
        declare = self._declares_footprints()
        parts: list[tuple[_Blocks, list[Any]]] = []
        for g, part in self._by_group(plan):
            pool, slots = self._pools[g], part.slot
            box: list[Any] = []

            def run(pool: Any = pool, slots: Any = slots, box: list[Any] = box) -> None:
                box.append(xp.take(pool, xp.asarray(slots), axis=0))  # a copy, made now

            self.backend.launch(kv.stream, run, "oracle read",
                                reads=((pool, slots.tolist()),) if declare else ())
            parts.append((part, box))
        self._pending.append(_Read(parts))

    def check(self) -> list[Mismatch]:
        """Synchronise, compare every pending read; returns (and accumulates) mismatches."""
        self.backend.synchronize_all()
        for r in self._pending:
            if not r.ran():
                seqs = sorted({int(s) for part, _ in r.parts for s in part.seq})
                self.missing.append(f"seq {seqs}: a verification read never ran")
        return self._compare_reads([r for r in self._pending if r.ran()], keep=[])

    def collect(self) -> list[Mismatch]:
        """Compare the reads that have already run, without running anything: a harness
        that chooses the stream order checks data after every step and keeps its
        interleaving."""
        ran = [r.ran() for r in self._pending]
        done = [r for r, ok in zip(self._pending, ran, strict=True) if ok]
        return self._compare_reads(done, keep=[r for r, ok in zip(self._pending, ran, strict=True)
                                               if not ok])

    def _compare_reads(self, reads: list[_Read], keep: list[_Read]) -> list[Mismatch]:
        self._pending = keep
        if not reads:
            return []
        parts = [part for r in reads for part, _ in r.parts]
        got = [box[0] for r in reads for _, box in r.parts]
        plan = _Blocks.concat(parts)
        xp = self.xp
        eidx = self._eidx(plan)
        allrows = xp.concatenate(got) if len(got) > 1 else got[0]
        # On NumPy the rows are host copies already: compare now, on no stream.
        return self._run_compare(lambda g, s, e: allrows[s:e], ((0, 0, plan.slot.size),),
                                 lambda exp: self._gather_want(exp, eidx), lambda: _who(plan),
                                 self._window_mask(plan), plan.positions,
                                 on_stream=xp is not np)

    # ---- one-pass check of every active sequence ---------------------------------------
    def sweep(self, kvs: Sequence[KVCache] | None = None) -> list[Mismatch]:
        """Check the current window of every active sequence (default: all of the
        manager's) in one vectorized pass on the oracle's stream, ordered after each
        sequence's stream; returns (and accumulates) mismatches.

        The block structure and the expected rows of the last sweep are reused while they
        stay the same (`_sweep_plan`, `_cached_want`); if some in-window block has no page,
        the sweep takes the plain path (`_sweep_plain`), which reports those positions."""
        seqs = [kv for kv in (self.mgr.seqs.values() if kvs is None else kvs)
                if kv.status is _ACTIVE]
        planned = self._sweep_plan(seqs)
        if planned is None:
            return []
        shape, slot, mask, positions = planned
        if np.minimum.reduce(slot) <= BAD_PAGE_INDEX:  # a block without a page (or corrupt)
            return self._sweep_plain(seqs)
        cache = self._sweep_cache
        self.backend.wait_streams(self._oracle_stream(), cache.streams)
        return self._run_compare(
            self._gatherer(slot), shape.spans, lambda exp: self._cached_want(exp, shape),
            lambda: shape.who(slot), mask, positions, rank=shape.rank,
            reads=self._reads(shape.spans, slot))

    def _sweep_plain(self, seqs: list[KVCache]) -> list[Mismatch]:
        """`sweep` from a plan made afresh, blocks without a page reported and left out."""
        plan = self._split_missing(self._plan(seqs), seqs)
        if plan.slot.size == 0:
            return []
        self.backend.wait_streams(self._oracle_stream(), [kv.stream for kv in seqs])
        parts = self._by_group(plan)
        ordered = parts[0][1] if len(parts) == 1 else _Blocks.concat([p for _, p in parts])
        ends = np.cumsum([p.slot.size for _, p in parts]).tolist()
        spans = tuple((g, e - p.slot.size, e) for (g, p), e in zip(parts, ends, strict=True))
        eidx = self._eidx(ordered)
        return self._run_compare(
            self._gatherer(ordered.slot), spans, lambda exp: self._gather_want(exp, eidx),
            lambda: _who(ordered), self._window_mask(ordered), ordered.positions,
            reads=self._reads(spans, ordered.slot))

    def _gatherer(self, slot: np.ndarray[Any, Any]) -> _Rows:
        """rows(g, s, e): the rows of slots slot[s:e] of pool group g (a copy, made when
        called: on the oracle's stream)."""
        xp, pools = self.xp, self._pools

        def rows(g: int, s: int, e: int) -> Any:
            return pools[g].take(slot[s:e] if xp is np else xp.asarray(slot[s:e]), axis=0)

        return rows

    def _reads(self, spans: tuple[tuple[int, int, int], ...],
               slot: np.ndarray[Any, Any]) -> tuple[tuple[Any, list[int]], ...]:
        """The compare's declared reads, if the backend looks at them."""
        if not self._declares_footprints():
            return ()
        return tuple((self._pools[g], slot[s:e].tolist()) for g, s, e in spans)

    def _oracle_stream(self) -> StreamRef:
        if self._stream is None:
            self._stream = self.backend.new_stream("oracle")
        return self._stream

    def _declares_footprints(self) -> bool:
        """Whether a launch's `reads=`/`writes=` are looked at: only the simulator's race
        detector uses them (a GPU backend ignores them), so the slot lists are built only
        then."""
        sim = self._sim
        return sim.race_check if sim is not None else self.backend.name != "cupy"

    def _launch_runs_now(self) -> bool:
        """Whether a launch on the oracle stream would run at once and leave no trace: an
        eager simulator with nothing queued (so `wait_streams` enqueued nothing either),
        no race detector, no trace kept, and `launch` not overridden. The compare then
        runs inline, without the enqueue, drain, event and synchronize around it."""
        sim = self._sim
        return (sim is not None and self._plain_launch and sim.eager and not sim.race_check
                and not sim.keep_trace and sim.queued == 0)

    def _window_mask(self, plan: _Blocks) -> np.ndarray[Any, Any]:
        """(blocks, t): whether each position of each block is in the window."""
        out: np.ndarray[Any, Any] = self._masks.take(plan.lo * (self.t + 1) + plan.hi, axis=0)
        return out

    # ---- expected rows -----------------------------------------------------------------
    def _eidx(self, plan: _Blocks) -> np.ndarray[Any, Any]:
        """Each block's chunk of the expected-stamp table (as it is now)."""
        _, nlc, width, _ = self._exp.shape
        out: np.ndarray[Any, Any] = (plan.row * nlc + plan.lc) * (width // self.t) + plan.blk
        return out

    def _gather_want(self, exp: Any, eidx: np.ndarray[Any, Any]) -> Any:
        """(blocks, t * ept) expected rows: chunks `eidx` of the expected table `exp`."""
        xp = self.xp
        return exp.reshape(-1, self.t * self.ept).take(eidx if xp is np else xp.asarray(eidx),
                                                        axis=0)

    def _cached_want(self, exp: Any, shape: _Shape) -> Any:
        """The expected rows of `shape`'s blocks: the last sweep's, with the blocks whose
        stamps were stored since gathered again; gathered whole for a new structure or
        table (grown, or its mirror uploaded again), or when many blocks changed."""
        xp, cache, stale = self.xp, self._sweep_cache, self._stale
        want = cache.want
        if (want is None or cache.want_shape is not shape or cache.want_exp is not exp
                or stale is None or 4 * self._nlc * len(stale) >= shape.size):
            want = cache.want = self._gather_want(exp, shape.eidx)
            cache.want_shape, cache.want_exp = shape, exp
        elif stale:
            sel = shape.where(self._max_blocks, self._seg_lc.size).take(np.array(stale), axis=0)
            sel = sel[sel >= 0]
            if sel.size:
                want[sel if xp is np else xp.asarray(sel)] = self._gather_want(exp,
                                                                               shape.eidx[sel])
        self._stale = []
        return want

    # ---- the vectorized compare --------------------------------------------------------
    def _run_compare(self, rows: _Rows, spans: tuple[tuple[int, int, int], ...], want_fn: Any,
                     who: Callable[[], _Who], mask: np.ndarray[Any, Any], positions: int,
                     rank: np.ndarray[Any, Any] | None = None,
                     reads: tuple[tuple[Any, list[int]], ...] = (),
                     on_stream: bool = True) -> list[Mismatch]:
        """Compare the blocks' rows (`rows` of each (pool group, start, end) span, in `who`
        order) with want_fn(expected table) (their expected rows) on the device and count
        the mismatches there; then copy back only the mismatching positions. The first
        len(mask) blocks are masked by `mask` ((blocks, t): in the window), the others are
        wholly in the window. `on_stream`: run on the oracle stream (declaring `reads`),
        else now. Mismatches are reported in `who` order, or by `rank` of the block.

        On NumPy the rows are gathered and compared a chunk at a time (`_chunk` blocks), so
        each chunk is compared while it is still in cache, and gathered again only to
        report mismatches."""
        xp, backend, t = self.xp, self.backend, self.t
        ept, ppe, unit, ne = self.ept, self.ppe, self._unit, mask.shape[0]
        step = self._chunk if xp is np else 1 << 62
        box: list[Any] = []

        def gathered() -> Any:  # every block's row, as uint32
            parts = [rows(g, s, e) for g, s, e in spans]
            return (xp.concatenate(parts) if len(parts) > 1 else parts[0]).view(xp.uint32)

        def run() -> None:
            exp, cols, rep = self._device_consts()
            want = want_fn(exp)  # (blocks, t * ept)
            if ppe == 1:  # each position owns ept elements: compare the rows as they are
                width = t * ept
                wants = want.view(unit) if unit is not None else want
                kept: list[Any] = []  # the rows, where not gathered again (CuPy)
                pieces = [(g, c, min(c + step, e)) for g, s, e in spans for c in range(s, e, step)]
                neq: Any
                if len(pieces) > 1 and unit is not None and xp is np:  # whole rows, 2 at a time
                    neq = np.empty(wants.shape, dtype=bool)
                    for g, c, d in pieces:
                        np.not_equal(rows(g, c, d).view(unit), wants[c:d], out=neq[c:d])
                else:
                    neq = None if len(pieces) == 1 else xp.empty(wants.shape, dtype=bool)
                    for g, c, d in pieces:
                        got = rows(g, c, d).view(xp.uint32)
                        if xp is not np:
                            kept.append(got)
                        vals = got if got.shape[1] == width else got[:, :width]
                        if unit is not None:
                            vals = vals.view(unit)
                        if neq is None:
                            neq = vals != wants
                        else:
                            xp.not_equal(vals, wants[c:d], out=neq[c:d])
                k = neq.shape[1] // t  # bools per position
                wide = _WIDE.get(k)

                def pos_of(x: Any) -> Any:
                    return x.view(wide) != 0 if wide is not None else x.reshape(-1, t, k).any(2)

                def vals_of() -> Any:
                    got = xp.concatenate(kept) if len(kept) > 1 else kept[0]
                    return got if got.shape[1] == width else got[:, :width]
            else:  # positions share elements: (blocks, t, ept) gathers
                vals, want = gathered()[:, cols], want.reshape(-1, t, ept)[:, rep]
                neq = _any_last(xp, vals != want)

                def pos_of(x: Any) -> Any:
                    return x

                def vals_of() -> Any:
                    return vals
            edges = pos_of(neq[:ne]) & (mask if xp is np else xp.asarray(mask))
            count = xp.count_nonzero(edges)
            if ne < neq.shape[0]:
                count = count + xp.count_nonzero(neq[ne:])
            if xp is np and ppe == 1 and count:  # the rows compared, for the report
                again = gathered()[:, :t * ept]

                def vals_of() -> Any:
                    return again
            box.extend((count, lambda: xp.concatenate([edges, pos_of(neq[ne:])]), vals_of, want))

        if not on_stream or (xp is np and not reads and self._launch_runs_now()):
            run()
        else:
            ostream = self._oracle_stream()
            backend.launch(ostream, run, "oracle compare", reads=reads)
            done = backend.new_event()
            backend.record(done, ostream)
            backend.synchronize(done)
        self.verified_positions += positions
        count, bad_fn, vals_of, want = box
        if int(count) == 0:
            return []
        e, o = xp.nonzero(bad_fn())
        vals = vals_of()
        v, w = vals.reshape(-1, t, ept)[e, o], want.reshape(-1, t, ept)[e, o]  # (k, ept)
        j = (v != w).argmax(axis=1)
        ix = xp.arange(j.size)
        host = [np.asarray(backend.to_numpy(a)) for a in (e, o, v[ix, j], w[ix, j])]
        e_h, o_h, found_h, want_h = host
        if rank is not None:
            by = np.lexsort((o_h, rank[e_h]))
            e_h, o_h, found_h, want_h = e_h[by], o_h[by], found_h[by], want_h[by]
        seq, lc, blk, slot = who()
        out = [Mismatch(int(seq[i]), int(lc[i]), int(blk[i]), int(blk[i]) * t + int(oo),
                        int(wv), int(f), int(slot[i]))
               for i, oo, f, wv in zip(e_h, o_h, found_h, want_h, strict=True)]
        self.mismatches.extend(out)
        return out

    # ---- convenience: one decode step --------------------------------------------------
    def prefill(self, kv: KVCache, prompt: list[int], reused: int = 0) -> None:
        """Register the prompt tokens; write positions [reused, len(prompt)) (the first
        `reused` come from the radix tree)."""
        self.add_tokens(kv.seq_id, prompt)
        if len(prompt) > reused:
            self.write(kv, list(range(reused, len(prompt))))

    def decode_step(self, kv: KVCache, verify: bool = True) -> bool:
        """resize(h+1, h), write the token at position h, verify the window.
        Returns resize()'s result (False: out of pages, nothing written)."""
        h = len(self.tokens.get(kv.seq_id, []))
        if not kv.resize(max(kv.capacity, h + 1), h):
            return False
        self.add_tokens(kv.seq_id, [self.token_for(kv.seq_id, h)])
        self.write(kv, [h])
        if verify:
            self.verify(kv)
        return True
