"""Attention oracle: paged sliding-window attention through the page-index table
equals dense sliding-window attention over the unpaged history.

Slot layout (float32 pool, `slot_elems = 2 * tokens_per_block * head_dim`):
`[tokens_per_block, 2 (K, V), head_dim]`. K/V of each position are seeded by
(seq, lc, position), so the dense reference needs no storage from the pool.
torch runs on CPU over NumPy memory (`torch.from_numpy`) or on CUDA over CuPy
memory via DLPack, with the same code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvpocket.impl.kvcache import KVCache
from kvpocket.impl.manager import KVCacheManager
from kvpocket.model.config import BAD_PAGE_INDEX


def kv_vectors(seq: int, lc: int, positions: np.ndarray[Any, Any], d: int
               ) -> np.ndarray[Any, Any]:
    """Deterministic K/V for positions: shape (len, 2, d), float32."""
    out = np.empty((len(positions), 2, d), dtype=np.float32)
    for r, p in enumerate(positions):
        rng = np.random.default_rng([seq, lc, int(p)])
        out[r] = rng.standard_normal((2, d), dtype=np.float32)
    return out


def _torch_view(mgr: KVCacheManager, arr: Any) -> Any:
    import torch  # optional: the attention oracle runs only where torch is installed
    from torch.utils.dlpack import from_dlpack  # optional, as torch above

    if mgr.backend.name == "numpy":
        return torch.from_numpy(np.asarray(arr))
    return from_dlpack(arr)


class AttentionOracle:
    def __init__(self, mgr: KVCacheManager, head_dim: int = 4) -> None:
        t = mgr.cfg.tokens_per_block
        if mgr.dtype != np.float32 or mgr.slot_elems != 2 * t * head_dim:
            raise ValueError(f"attention needs a float32 pool with slot_elems = {2 * t * head_dim}")
        self.mgr, self.t, self.d = mgr, t, head_dim

    def write(self, kv: KVCache, positions: list[int]) -> None:
        """Enqueue K/V of `positions` into every life cycle's locked page."""
        xp, t, d = self.mgr.backend.xp, self.t, self.d
        pos = np.asarray(positions, dtype=np.int64)
        for lc in range(self.mgr.cfg.num_life_cycles):
            slots = kv.index[lc][pos // t]
            ok = slots != BAD_PAGE_INDEX
            if not ok.any():
                continue
            pool = self.mgr.pool(0, self.mgr.cfg.pool_group_of(lc))
            view = pool.reshape(pool.shape[0], t, 2, d)
            vals = kv_vectors(kv.seq_id, lc, pos[ok], d)
            rows, offs = slots[ok].astype(np.int64), pos[ok] % t

            def run(view: Any = view, rows: Any = rows, offs: Any = offs, vals: Any = vals
                    ) -> None:  # uploads happen on the sequence's stream
                view[xp.asarray(rows), xp.asarray(offs)] = xp.asarray(vals)

            self.mgr.backend.launch(kv.stream, run)

    def _mask(self, lc: int, h: int, n: int) -> np.ndarray[Any, Any]:
        lcfg = self.mgr.cfg.life_cycles[lc]
        p = np.arange(n)
        keep = p <= h
        if lcfg.window is not None:
            keep &= (p >= h + 1 - lcfg.window) | (p < lcfg.sink_tokens)
        return keep

    def paged(self, kv: KVCache, lc: int, q: np.ndarray[Any, Any]) -> Any:
        """Attention of query q at position h = history, gathering K/V by page."""
        import torch  # optional: the attention oracle runs only where torch is installed

        self.mgr.backend.synchronize_all()
        t, d, h = self.t, self.d, kv.history
        pool = _torch_view(self.mgr, self.mgr.pool(0, self.mgr.cfg.pool_group_of(lc)))
        table = _torch_view(self.mgr, kv.page_table(lc)).to(torch.int64)[: kv.num_blocks]
        present = table != BAD_PAGE_INDEX
        blocks = torch.nonzero(present).flatten()
        gathered = pool.reshape(pool.shape[0], t, 2, d)[table[blocks]]  # (nb', t, 2, d)
        pos = (blocks[:, None] * t + torch.arange(t, device=blocks.device)[None, :]).flatten()
        kvs = gathered.reshape(-1, 2, d)
        mask = torch.as_tensor(self._mask(lc, h, int(pos.max()) + 1 if len(pos) else 0),
                               device=pos.device)
        keep = mask[pos] if len(pos) else pos.bool()
        return self._attend(torch.as_tensor(q, device=kvs.device), kvs[keep])

    def dense(self, kv: KVCache, lc: int, q: np.ndarray[Any, Any]) -> Any:
        import torch  # optional: the attention oracle runs only where torch is installed

        h = kv.history
        allpos = np.arange(h + 1)
        kvs = torch.from_numpy(kv_vectors(kv.seq_id, lc, allpos, self.d))
        keep = torch.from_numpy(self._mask(lc, h, h + 1))
        return self._attend(torch.as_tensor(q), kvs[keep])

    @staticmethod
    def _attend(q: Any, kvs: Any) -> Any:
        import torch  # optional: the attention oracle runs only where torch is installed

        k, v = kvs[:, 0, :], kvs[:, 1, :]
        w = torch.softmax((k @ q) / float(q.shape[0]) ** 0.5, dim=0)
        return (w[:, None] * v).sum(dim=0).cpu()
