"""Paged SWA attention through the page table equals dense SWA attention."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from impl_helpers import assert_clean, swa_config

torch = pytest.importorskip("torch")

from kvpocket.verify.oracles.attention import AttentionOracle  # noqa: E402


@pytest.mark.parametrize("pocket", [False, True])
@pytest.mark.parametrize("sink", [0, 2])
def test_paged_equals_dense(make_mgr: Any, pocket: bool, sink: int) -> None:
    d = 4
    cfg = swa_config(window=5, slots=(16, 16), pocket=pocket, full=True, sink=sink)
    mgr = make_mgr(cfg, slot_elems=2 * cfg.tokens_per_block * d, dtype=np.float32)
    att = AttentionOracle(mgr, head_dim=d)
    kv = mgr.create(0)
    assert kv.resume()
    kv.stop_committing()
    rng = np.random.default_rng(0)
    checked = 0
    for h in range(16):
        assert kv.resize(h + 1, h)
        att.write(kv, [h])
        q = rng.standard_normal(d).astype(np.float32)
        for lc in range(2):
            paged, dense = att.paged(kv, lc, q), att.dense(kv, lc, q)
            torch.testing.assert_close(paged, dense, rtol=1e-5, atol=1e-5)
            checked += 1
    assert checked == 32
    if pocket:
        assert mgr.counters_of(0).pocket_pops > 0
    assert_clean(mgr)


def test_attention_detects_a_corrupted_page(make_mgr: Any) -> None:
    d = 4
    cfg = swa_config(window=5, slots=(10, 10))
    mgr = make_mgr(cfg, slot_elems=2 * cfg.tokens_per_block * d, dtype=np.float32)
    att = AttentionOracle(mgr, head_dim=d)
    kv = mgr.create(0)
    assert kv.resume()
    for h in range(6):
        assert kv.resize(h + 1, h)
        att.write(kv, [h])
    mgr.synchronize()
    pool = mgr.backend.to_numpy(mgr.pool(0))
    slot = int(kv.index[0][kv.num_blocks - 1])
    pool[slot] += 1.0
    mgr.pool(0)[slot] = mgr.backend.xp.asarray(pool[slot])
    q = np.ones(d, dtype=np.float32)
    assert not torch.allclose(att.paged(kv, 0, q), att.dense(kv, 0, q))
