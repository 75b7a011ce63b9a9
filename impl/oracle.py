"""Data oracle: a decode engine that stamps every written slot and re-checks history.

Each token position p of sequence s carries a content-addressed stamp per life
cycle: `mix(prefix_hash(tokens[0..p]), lc, p, j)` for the `j`-th of the
`slot_elems // tokens_per_block` elements the position owns in its slot. Two
sequences with the same prefix therefore expect the same stamps (prefix reuse
is checked), and different sequences differ (aliasing is caught).

Writes and checks are enqueued on the sequence's compute stream through the
backend (`launch`), so on the simulator they run exactly when the harness
advances that stream; a missing event wait shows up as a mismatch. The same
code runs with `xp = numpy` or `xp = cupy`; gathered values are compared
after `check()` synchronises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpocket.model.config import BAD_PAGE_INDEX, SeqStatus, stale_range

from .kvcache import KVCache
from .manager import KVCacheManager

_M1 = np.uint32(0x85EBCA6B)
_M2 = np.uint32(0xC2B2AE35)
_GOLD = np.uint32(0x9E3779B1)


def mix32(x: Any) -> Any:
    """murmur3 finaliser on uint32 arrays (numpy or cupy; wraps modulo 2**32)."""
    x = x ^ (x >> 16)
    x = x * _M1
    x = x ^ (x >> 13)
    x = x * _M2
    return x ^ (x >> 16)


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


class DecodeOracle:
    def __init__(self, mgr: KVCacheManager) -> None:
        if mgr.dtype != np.int32 and mgr.dtype != np.uint32:
            raise ValueError("the data oracle needs an int32/uint32 slot pool")
        self.mgr = mgr
        self.xp = mgr.backend.xp
        self.t = mgr.cfg.tokens_per_block
        self.ept = max(1, mgr.slot_elems // self.t)  # elements per token position
        if self.ept * self.t > mgr.slot_elems:
            raise ValueError("slot_elems must be >= tokens_per_block")
        self.tokens: dict[int, list[int]] = {}
        self.ph: dict[int, list[int]] = {}  # prefix hash per position
        self._pending: list[tuple[int, int, np.ndarray[Any, Any], np.ndarray[Any, Any],
                                  np.ndarray[Any, Any], list[Any]]] = []
        self.mismatches: list[Mismatch] = []
        self.missing: list[str] = []

    # ---- tokens and stamps -------------------------------------------------------------
    def token_for(self, seq: int, pos: int) -> int:
        v = np.array([(seq * 0x01000193 + pos * 0x9E37) & 0xFFFFFFFF], dtype=np.uint32)
        return int(mix32(v)[0]) % 50000

    def add_tokens(self, seq: int, tokens: list[int]) -> None:
        toks = self.tokens.setdefault(seq, [])
        ph = self.ph.setdefault(seq, [])
        for tok in tokens:
            prev = ph[-1] if ph else 0x811C9DC5
            v = np.array([((prev * 0x01000193) ^ tok ^ (len(toks) << 7)) & 0xFFFFFFFF],
                         dtype=np.uint32)
            ph.append(int(mix32(v)[0]))
            toks.append(tok)

    def stamps(self, seq: int, lc: int, positions: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """uint32 array (len(positions), ept) of expected values."""
        ph = np.asarray(self.ph[seq], dtype=np.uint32)[positions]
        base = mix32(ph ^ np.uint32(((lc + 1) * 0x9E3779B1) & 0xFFFFFFFF))
        j = np.arange(self.ept, dtype=np.uint32)
        out: np.ndarray[Any, Any] = mix32(base[:, None] ^ (j[None, :] * _M2 + np.uint32(7)))
        return out

    # ---- engine ------------------------------------------------------------------------
    def _rows_cols(self, kv: KVCache, lc: int, positions: np.ndarray[Any, Any]
                   ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        table = kv.index[lc]
        slots = table[positions // self.t].astype(np.int64)
        cols = ((positions % self.t) * self.ept)[:, None] + np.arange(self.ept)[None, :]
        return slots, cols, positions

    def write(self, kv: KVCache, positions: np.ndarray[Any, Any] | list[int]) -> None:
        """Enqueue the stamps of `positions` (tokens must be known) into their slots, for
        every life cycle whose block has a locked page."""
        pos = np.asarray(positions, dtype=np.int64)
        xp, backend = self.xp, self.mgr.backend
        for lc in range(self.mgr.cfg.num_life_cycles):
            slots, cols, p = self._rows_cols(kv, lc, pos)
            ok = slots != BAD_PAGE_INDEX
            if not ok.any():
                continue
            pool = self.mgr.pool(0, self.mgr.cfg.pool_group_of(lc))
            vals = self.stamps(kv.seq_id, lc, p[ok]).view(np.int32).astype(pool.dtype)
            rows = np.ascontiguousarray(np.broadcast_to(slots[ok][:, None], cols[ok].shape))
            cc = cols[ok]

            # Host->device conversion inside `run`, i.e. on the sequence's stream.
            def run(pool: Any = pool, rows: Any = rows, cc: Any = cc, vals: Any = vals) -> None:
                pool[xp.asarray(rows), xp.asarray(cc)] = xp.asarray(vals)

            backend.launch(kv.stream, run)

    def window_positions(self, kv: KVCache, lc: int) -> np.ndarray[Any, Any]:
        """Token positions attention reads at history h: sink tokens plus [h+1-w, h]."""
        h = kv.history
        written = min(h + 1, len(self.tokens.get(kv.seq_id, [])), kv.capacity)
        lcfg = self.mgr.cfg.life_cycles[lc]
        if lcfg.window is None:
            return np.arange(written, dtype=np.int64)
        lo = max(0, h + 1 - lcfg.window)
        sink = np.arange(min(lcfg.sink_tokens, written), dtype=np.int64)
        return np.union1d(sink, np.arange(lo, written, dtype=np.int64))

    def verify(self, kv: KVCache) -> None:
        """Enqueue a read of every in-window position of every life cycle (checked later
        by `check`). Positions whose block has no locked page are reported as missing."""
        if kv.status is not SeqStatus.ACTIVE:
            return
        xp, backend = self.xp, self.mgr.backend
        for lc in range(self.mgr.cfg.num_life_cycles):
            pos = self.window_positions(kv, lc)
            if pos.size == 0:
                continue
            slots, cols, p = self._rows_cols(kv, lc, pos)
            bad = slots == BAD_PAGE_INDEX
            s, e = stale_range(self.mgr.cfg.life_cycles[lc], kv.history, self.t)
            for q in p[bad]:
                self.missing.append(f"seq {kv.seq_id} lc {lc} token {int(q)}: block "
                                    f"{int(q) // self.t} has no page (stale range {s}..{e})")
            slots, cols, p = slots[~bad], cols[~bad], p[~bad]
            if p.size == 0:
                continue
            pool = self.mgr.pool(0, self.mgr.cfg.pool_group_of(lc))
            rows = np.ascontiguousarray(np.broadcast_to(slots[:, None], cols.shape))
            cc = cols
            box: list[Any] = []

            def run(pool: Any = pool, rows: Any = rows, cc: Any = cc, box: list[Any] = box
                    ) -> None:
                # fancy indexing copies: the value when the stream runs this
                box.append(pool[xp.asarray(rows), xp.asarray(cc)])

            backend.launch(kv.stream, run)
            self._pending.append((kv.seq_id, lc, p, slots, self.stamps(kv.seq_id, lc, p), box))

    def check(self) -> list[Mismatch]:
        """Synchronise, compare every pending read; returns (and accumulates) mismatches."""
        self.mgr.backend.synchronize_all()
        return self._compare(drain=True)

    def collect(self) -> list[Mismatch]:
        """Compare the reads that have already run, without running anything: a harness
        that chooses the stream order checks data after every step and keeps its
        interleaving."""
        return self._compare(drain=False)

    def _compare(self, drain: bool) -> list[Mismatch]:
        found_now: list[Mismatch] = []
        still_pending = []
        for item in self._pending:
            seq, lc, p, slots, expected, box = item
            if not box:
                if drain:
                    self.missing.append(f"seq {seq} lc {lc}: a verification read never ran")
                else:
                    still_pending.append(item)
                continue
            got = self.mgr.backend.to_numpy(box[0]).astype(np.int32).view(np.uint32)
            bad_rows = np.nonzero((got != expected).any(axis=1))[0]
            for r in bad_rows:
                j = int(np.nonzero(got[r] != expected[r])[0][0])
                found_now.append(Mismatch(seq, lc, int(p[r]) // self.t, int(p[r]),
                                          int(expected[r, j]), int(got[r, j]), int(slots[r])))
        self._pending = still_pending
        self.mismatches.extend(found_now)
        return found_now

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
