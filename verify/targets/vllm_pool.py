"""vLLM's block pool invariants, as vLLM states them, checked from outside.

- reference counts equal live references: a block's `ref_cnt` is the number of times it
  appears in the requests' block lists of every group (the null block excepted: vLLM
  does not count its references);
- the free queue holds exactly the blocks with `ref_cnt == 0`, each once, and its
  `num_free_blocks` counts them;
- a request holds each block once: no block in two groups' tables, nor twice in one
  (the null block excepted, the placeholder every group shares on purpose);
- the null block (id 0) is never handed out: never free, never cached, never written;
- the hash map agrees with the blocks: a key maps to a block exactly when the block
  carries that key, and a cached block's content (the stamp array) is the content its
  hash stands for.

The accessors tolerate the layout differences between vLLM releases that the target
supports (a hash map that is a plain dict of dicts before 0.10, a block with one hash or
several).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from kvpocket.verify.targets.base import CheckFailure, StepStats, TargetConfig
from kvpocket.verify.targets.data_oracle import StampArray


class PoolView:
    """Read-only access to a `KVCacheManager`'s pool, managers and hash map."""

    def __init__(self, utils: Any, mgr: Any, cfg: TargetConfig) -> None:
        self.utils = utils
        self.mgr = mgr
        self.cfg = cfg
        self.pool: Any = mgr.block_pool
        coordinator = getattr(mgr, "coordinator", None)
        # Before the hybrid allocator (0.10) the manager kept one group's tables itself.
        self.managers: tuple[Any, ...] = tuple(coordinator.single_type_managers) \
            if coordinator is not None else (mgr,)
        self.null_block: Any = self.pool.null_block
        self.null_id: int = int(self.null_block.block_id)

    def is_null(self, block: Any) -> bool:
        return block is self.null_block

    def split_key(self, key: Any) -> tuple[Any, int]:
        """(block hash, group id) of a hash-map key."""
        if hasattr(self.utils, "get_block_hash") and hasattr(self.utils, "get_group_id"):
            return self.utils.get_block_hash(key), int(self.utils.get_group_id(key))
        return getattr(key, "block_hash", key), int(getattr(key, "group_id", 0))

    def cached_entries(self) -> Iterator[tuple[Any, Any]]:
        """(key, block) for every block in the hash map."""
        m = self.pool.cached_block_hash_to_block
        raw = getattr(m, "_cache", m)
        for key, blocks in raw.items():
            if isinstance(blocks, dict):
                yield from ((key, b) for b in blocks.values())
            else:
                yield key, blocks

    def keys_of(self, block: Any) -> set[Any]:
        """The keys a block is cached under."""
        h = block.block_hash
        keys = set() if h is None else {h}
        # Since about 0.30 a block can be cached under more keys than its own hash.
        by_block = getattr(self.pool, "cached_block_hashes_by_block", None)
        if by_block is not None:
            keys.update(by_block.get(block.block_id, ()))
        return keys

    def free_queue(self) -> list[Any]:
        q = self.pool.free_block_queue
        if hasattr(q, "get_all_free_blocks"):
            return list(q.get_all_free_blocks())
        out, b = [], q.free_list_head
        while b is not None:
            out.append(b)
            b = b.next_free_block
        return out

    def block_ids(self, rid: str) -> list[list[int]]:
        """The request's block table, one row of block ids per group."""
        return [[b.block_id for b in m.req_to_blocks.get(rid, ())] for m in self.managers]

    def num_cached(self) -> int:
        return sum(1 for _ in self.cached_entries())

    def tables(self) -> Iterator[tuple[int, str, list[Any]]]:
        """(group, request id, blocks) for every request every group holds blocks for."""
        for g, m in enumerate(self.managers):
            for rid, blocks in m.req_to_blocks.items():
                yield g, rid, blocks


def check_pool(view: PoolView, stamps: StampArray,
               hash_content: dict[Any, tuple[int, tuple[int, ...]]],
               stats: StepStats, held_elsewhere: list[Any] | None = None) -> None:
    """The pool's invariants; `held_elsewhere`: blocks the scheduler holds outside every
    request's table (the frees it defers past a step in flight), one reference each."""
    pool = view.pool
    null = pool.null_block
    if view.null_id != 0 or not getattr(null, "is_null", True):
        raise CheckFailure("pool", f"the null block is block {view.null_id}, not marked as "
                           "null; vLLM reserves block 0")

    refs: Counter[int] = Counter()
    held: dict[str, dict[int, int]] = {}  # request -> block id -> the group holding it
    refs.update(b.block_id for b in held_elsewhere or () if not view.is_null(b))
    for g, rid, blocks in view.tables():
        refs.update(b.block_id for b in blocks if not view.is_null(b))
        mine = held.setdefault(rid, {})
        for b in blocks:
            if view.is_null(b):  # the one block vLLM shares on purpose (a placeholder)
                continue
            if b.block_id in mine:
                where = "twice in group" if mine[b.block_id] == g else \
                    f"in groups {mine[b.block_id]} and"
                raise CheckFailure("pool", f"{rid} holds block {b.block_id} {where} {g}: "
                                   "two token ranges would write one block")
            mine[b.block_id] = g
    for b in pool.blocks:
        if view.is_null(b):
            continue
        if b.ref_cnt != refs[b.block_id]:
            holders = [f"{rid}/group {g}" for g, rid, blocks in view.tables()
                       if any(x.block_id == b.block_id for x in blocks)]
            raise CheckFailure("pool", f"block {b.block_id} has ref_cnt {b.ref_cnt} but "
                               f"{refs[b.block_id]} live references ({', '.join(holders) or 'none'})")

    queue = view.free_queue()
    ids = [b.block_id for b in queue]
    if len(set(ids)) != len(ids):
        dup = next(i for i, n in Counter(ids).items() if n > 1)
        raise CheckFailure("pool", f"block {dup} is in the free queue twice: {ids}")
    if view.null_id in ids:
        raise CheckFailure("pool", f"the null block is in the free queue: it can be handed out ({ids})")
    zero = {b.block_id for b in pool.blocks if not view.is_null(b) and b.ref_cnt == 0}
    if set(ids) != zero:
        extra, missing = sorted(set(ids) - zero), sorted(zero - set(ids))
        raise CheckFailure("pool", "the free queue is not the set of blocks with ref_cnt 0: "
                           f"in the queue but referenced {extra}, unreferenced but not "
                           f"in the queue {missing}")
    if pool.free_block_queue.num_free_blocks != len(ids):
        raise CheckFailure("pool", f"num_free_blocks is {pool.free_block_queue.num_free_blocks} "
                           f"but the queue holds {len(ids)} blocks")
    if null.block_hash is not None or view.keys_of(null):
        raise CheckFailure("pool", "the null block is in the prefix cache")

    mapped: dict[int, set[Any]] = {}
    for key, b in view.cached_entries():
        mapped.setdefault(b.block_id, set()).add(key)
    for b in pool.blocks:
        carried = view.keys_of(b)
        in_map = mapped.get(b.block_id, set())
        if carried != in_map:
            raise CheckFailure("pool", f"block {b.block_id} carries {len(carried)} hash keys but "
                               f"the hash map lists it under {len(in_map)}, of which "
                               f"{len(in_map & carried)} agree")
        for key in carried:
            h, group = view.split_key(key)
            entry = hash_content.get(h)
            if entry is None:  # a hash no request of this run produced (or a group's
                stats.hit("cached_block_unverified")  # hash over several hash blocks)
                continue
            start, want = entry
            # The hashed tokens sit at this offset in a block of the group's size (a block
            # holding several hash blocks is also cached under the hash of a part of it).
            bs = view.cfg.group_block_size(group)
            offset = start % bs
            n = len(want)
            if key == b.block_hash and getattr(b, "block_hash_num_tokens", None):
                n = min(n, (int(b.block_hash_num_tokens) - 1) % bs + 1 - offset)
            expected = StampArray.stamp(np.asarray(want[:n], dtype=np.int64), group)
            got = stamps.block_row(b.block_id)[offset:offset + n]
            if not np.array_equal(got, expected):
                raise CheckFailure("pool", f"block {b.block_id} is cached (group {group}) under "
                                   f"a hash whose tokens it does not hold: cells {got.tolist()}, "
                                   f"the hash's content {expected.tolist()}")
            stats.hit("cached_block_verified")
