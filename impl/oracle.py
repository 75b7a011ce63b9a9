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

The same code runs with `xp = numpy` or `xp = cupy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpocket.model.config import BAD_PAGE_INDEX, LifeCycle, SeqStatus, stale_range

from .backend.protocol import StreamRef
from .kvcache import KVCache
from .manager import KVCacheManager

_M1 = np.uint32(0x85EBCA6B)
_M2 = np.uint32(0xC2B2AE35)
_GOLD = np.uint32(0x9E3779B1)
_MASK = 0xFFFFFFFF


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


def _any_last(xp: Any, neq: Any) -> Any:
    """`neq.any(axis=2)` for a contiguous bool (n, t, k) array: for k of 1, 2, 4 or 8 the
    k bytes of a position are read as one integer (a numpy reduction over a tiny last
    axis is about ten times slower than an elementwise compare)."""
    k = neq.shape[2]
    wide = {1: xp.uint8, 2: xp.uint16, 4: xp.uint32, 8: xp.uint64}.get(k)
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
    """Block-granular read entries (host int64 arrays, one element per block read)."""

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
        t = self.t = mgr.cfg.tokens_per_block
        se = mgr.slot_elems
        self.ept = max(1, se // t)  # elements per token position
        self.ppe = -(-t // se) if se < t else 1  # token positions per element
        off = np.arange(t, dtype=np.int64)
        # column(s) of each offset in its slot, and the offset whose stamp it carries
        self.cols = ((off // self.ppe) * self.ept)[:, None] + np.arange(self.ept)[None, :]
        self.rep = (off // self.ppe) * self.ppe
        self._jsalt = [(j * 0xC2B2AE35 + 7) & _MASK for j in range(self.ept)]
        self._nlc = mgr.cfg.num_life_cycles
        self._pools = [mgr.pool(0, g) for g in range(mgr.cfg.num_pool_groups)]
        self._wins = [(lc.window, lc.sink_tokens) for lc in mgr.cfg.life_cycles]
        self._group_of_lc = np.array([mgr.cfg.pool_group_of(i) for i in range(self._nlc)])
        self.tokens: dict[int, list[int]] = {}
        self.ph: dict[int, list[int]] = {}  # prefix hash per position
        self._row: dict[int, int] = {}  # sequence id -> row of the expected-stamp table
        self._exp = np.zeros((0, self._nlc, 0, self.ept), dtype=np.uint32)
        self._mirror: Any = None  # device copy of `_exp` (CuPy only)
        self._dirty: tuple[int, int] | None = None  # positions changed since the upload
        self._consts: Any = None  # device copies of cols / rep / masks
        self._masks: np.ndarray[Any, Any] | None = None
        self._pending: list[_Read] = []
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
        rows, _, width, _ = self._exp.shape
        need_w = -(-b // self.t) * self.t
        if row >= rows or need_w > width:
            grown = np.zeros((max(rows, 2 * rows, row + 1), self._nlc,
                              max(width, 2 * width, need_w), self.ept), dtype=np.uint32)
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

    def _device_consts(self) -> tuple[Any, Any, Any, Any]:
        """(expected table, cols, rep, window masks) as arrays of the backend's module; on
        CuPy the table upload runs on the current stream (the oracle's)."""
        xp = self.xp
        if self._masks is None:  # [lo * (t + 1) + hi, o] = lo <= o < hi
            lo_hi = np.arange(self.t + 1)
            o = np.arange(self.t)
            m = ((o[None, None, :] >= lo_hi[:, None, None])
                 & (o[None, None, :] < lo_hi[None, :, None]))
            self._masks = m.reshape(-1, self.t)
        if xp is np:
            return self._exp, self.cols, self.rep, self._masks
        if self._mirror is None:
            self._mirror = xp.asarray(self._exp)
        elif self._dirty is not None:
            lo, hi = self._dirty
            self._mirror[:, :, lo:hi] = xp.asarray(np.ascontiguousarray(self._exp[:, :, lo:hi]))
        self._dirty = None
        if self._consts is None:
            self._consts = (xp.asarray(self.cols), xp.asarray(self.rep), xp.asarray(self._masks))
        cols, rep, masks = self._consts
        return self._mirror, cols, rep, masks

    # ---- planning: which blocks, which slots -------------------------------------------
    def _written(self, kv: KVCache) -> int:
        return min(kv.history + 1, len(self.tokens.get(kv.seq_id, [])), kv.capacity)

    def window_positions(self, kv: KVCache, lc: int) -> np.ndarray[Any, Any]:
        """Token positions attention reads at history h: sink tokens plus [h+1-w, h]."""
        segs = window_segments(self.mgr.cfg.life_cycles[lc], kv.history, self._written(kv))
        if not segs:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in segs])

    def _plan(self, kvs: Sequence[KVCache]) -> _Blocks:
        """The blocks of every in-window position of every life cycle of `kvs`, with the
        slot each one's page table gives now (BAD_PAGE_INDEX where there is no page).
        Vectorized over sequences: per life cycle one segment per sequence (two with
        sink tokens apart from the window), expanded to blocks with one `repeat`."""
        t = self.t
        z = np.zeros(0, dtype=np.int64)
        if not kvs:
            return _Blocks(z, z, z, z, z, z, z)
        tokens, rowmap = self.tokens, self._row
        info = np.array([(kv.history, kv.capacity, len(tokens.get(kv.seq_id, ())),
                          rowmap.get(kv.seq_id, -1), kv.seq_id) for kv in kvs], dtype=np.int64)
        hist, written = info[:, 0], np.minimum(np.minimum(info[:, 0] + 1, info[:, 2]),
                                               info[:, 1])
        zero = np.zeros_like(written)
        segs: list[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []  # (lc, a, b)
        for lc, (window, sink_tokens) in enumerate(self._wins):
            if window is None:
                segs.append((lc, zero, written))
                continue
            lo = np.maximum(hist + 1 - window, 0)
            if sink_tokens:
                sink = np.minimum(sink_tokens, written)
                apart = lo > sink  # else sink and window touch: one segment from 0
                segs.append((lc, zero, np.where(apart, sink, 0)))
                lo = np.where(apart, lo, 0)
            segs.append((lc, lo, written))
        k = np.concatenate([np.arange(len(kvs))] * len(segs))
        lcs = np.repeat(np.array([lc for lc, _, _ in segs], dtype=np.int64), len(kvs))
        a = np.concatenate([x for _, x, _ in segs])
        b = np.concatenate([x for _, _, x in segs])
        keep = b > a
        if not keep.all():
            k, lcs, a, b = k[keep], lcs[keep], a[keep], b[keep]
        if k.size == 0:
            return _Blocks(z, z, z, z, z, z, z)
        first = a // t
        n = (b - 1) // t - first + 1
        which = np.repeat(np.arange(k.size), n)
        blk = first[which] + np.arange(which.size) - np.repeat(np.cumsum(n) - n, n)
        base = blk * t
        kk, ll = k[which], lcs[which]
        tables = np.concatenate([kv.index for kv in kvs])  # (K * L, max_blocks)
        slot = tables[kk * self._nlc + ll, blk].astype(np.int64)
        return _Blocks(info[kk, 4], info[kk, 3], ll, blk, slot,
                       np.maximum(a[which], base) - base, np.minimum(b[which], base + t) - base)

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
        row = self._row[kv.seq_id]
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

            backend.launch(kv.stream, run, "oracle write", writes=((pool, slots.tolist()),))

    # ---- stream-ordered reads ----------------------------------------------------------
    def verify(self, kv: KVCache) -> None:
        """Enqueue a read of every in-window position of every life cycle on the
        sequence's stream (compared later by `check`/`collect`). Positions whose block
        has no locked page are reported as missing now."""
        if kv.status is not SeqStatus.ACTIVE:
            return
        plan = self._split_missing(self._plan([kv]), [kv])
        if plan.slot.size == 0:
            return
        xp = self.xp
        parts: list[tuple[_Blocks, list[Any]]] = []
        for g, part in self._by_group(plan):
            pool, slots = self._pools[g], part.slot
            box: list[Any] = []

            def run(pool: Any = pool, slots: Any = slots, box: list[Any] = box) -> None:
                box.append(xp.take(pool, xp.asarray(slots), axis=0))  # a copy, made now

            self.backend.launch(kv.stream, run, "oracle read",
                                reads=((pool, slots.tolist()),))
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
        found = self._run_compare(lambda: xp.concatenate(got) if len(got) > 1 else got[0],
                                  plan)
        return found

    # ---- one-pass check of every active sequence ---------------------------------------
    def sweep(self, kvs: Sequence[KVCache] | None = None) -> list[Mismatch]:
        """Check the current window of every active sequence (default: all of the
        manager's) in one vectorized pass on the oracle's stream, ordered after each
        sequence's stream; returns (and accumulates) mismatches."""
        seqs = [kv for kv in (self.mgr.seqs.values() if kvs is None else kvs)
                if kv.status is SeqStatus.ACTIVE]
        plan = self._split_missing(self._plan(seqs), seqs)
        if plan.slot.size == 0:
            return []
        backend = self.backend
        ostream = self._oracle_stream()
        # order the oracle stream after each sequence's work so far
        backend.wait_streams(ostream, [kv.stream for kv in seqs])
        groups = self._by_group(plan)
        xp = self.xp

        def gather() -> Any:
            rows = [xp.take(self._pools[g], xp.asarray(part.slot), axis=0) for g, part in groups]
            return xp.concatenate(rows) if len(rows) > 1 else rows[0]

        ordered = groups[0][1] if len(groups) == 1 else _Blocks.concat([p for _, p in groups])
        reads = tuple((self._pools[g], part.slot.tolist()) for g, part in groups)
        return self._run_compare(gather, ordered, reads=reads)

    def _oracle_stream(self) -> StreamRef:
        if self._stream is None:
            self._stream = self.backend.new_stream("oracle")
        return self._stream

    # ---- the vectorized compare --------------------------------------------------------
    def _run_compare(self, rows_fn: Any, plan: _Blocks,
                     reads: tuple[tuple[Any, list[int]], ...] = ()) -> list[Mismatch]:
        """On the oracle stream: rows = rows_fn() (block rows, in `plan` order), compare
        with the expected stamps on the device, count mismatches there; then copy back
        only the mismatching positions."""
        xp, backend, t = self.xp, self.backend, self.t
        ept, ppe = self.ept, self.ppe
        _, nlc, width, _ = self._exp.shape
        # per block: its (row, lc, block) chunk of the expected table, and its window mask
        # as an index into the table of all (lo, hi) masks; one upload for both on CuPy
        meta = np.stack([(plan.row * nlc + plan.lc) * (width // t) + plan.blk,
                         plan.lo * (t + 1) + plan.hi])
        box: list[Any] = []

        def run() -> None:
            exp, cols, rep, masks = self._device_consts()
            eidx, code = meta if xp is np else xp.asarray(meta)
            got = rows_fn().view(xp.uint32)
            # (blocks, t, ept): a view when each position owns its elements, else a gather
            vals = got[:, :t * ept].reshape(-1, t, ept) if ppe == 1 else got[:, cols]
            want = xp.take(exp.reshape(-1, t * ept), eidx, axis=0).reshape(-1, t, ept)
            if ppe > 1:
                want = want[:, rep]
            neq = vals != want
            bad = _any_last(xp, neq) & xp.take(masks, code, axis=0)
            box.extend((xp.count_nonzero(bad), bad, neq, vals, want))

        if xp is np and not reads:
            run()  # simulator, rows already read: compare now, run no stream (see collect)
        else:
            ostream = self._oracle_stream()
            backend.launch(ostream, run, "oracle compare", reads=reads)
            done = backend.new_event()
            backend.record(done, ostream)
            backend.synchronize(done)
        self.verified_positions += plan.positions
        count, bad, neq, vals, want = box
        if int(count) == 0:
            return []
        e, o = xp.nonzero(bad)
        j = neq[e, o].argmax(axis=1)
        host = [np.asarray(backend.to_numpy(a)) for a in (e, o, vals[e, o, j], want[e, o, j])]
        e_h, o_h, found_h, want_h = host
        out = [Mismatch(int(plan.seq[i]), int(plan.lc[i]), int(plan.blk[i]),
                        int(plan.blk[i]) * t + int(oo), int(w), int(f), int(plan.slot[i]))
               for i, oo, f, w in zip(e_h, o_h, found_h, want_h, strict=True)]
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
