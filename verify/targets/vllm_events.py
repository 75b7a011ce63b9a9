"""vLLM's KV events as a router reads them, checked against the engine's own cache.

Routers and external indexes (llm-d's KV cache manager, Dynamo's KV router) learn what an
engine caches only from its KV events: `BlockStored` adds its block hashes, `BlockRemoved`
removes them, `AllBlocksCleared` forgets everything. `ConsumerView` rebuilds that view the
way such a consumer does, counting copies (vLLM caches a block computed twice twice, under
one hash, and evicts each copy with its own `BlockRemoved`), keyed by (group, hash) as the
events carry both. After every operation the target drains the manager's events
(`KVCacheManager.take_events`, as the engine core does each step) into the view, which
must then equal the block pool's hash map (`cached_block_hash_to_block`, every copy
counted): a hash the view lacks is a hit a router will never send there, one it has in
excess sends requests to an engine that no longer holds the block.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from kvpocket.verify.targets.base import CheckFailure

Key = tuple[int, Any]  # (group index, external block hash)


class ConsumerView:
    """What a router believes one engine caches, from that engine's KV events alone."""

    def __init__(self) -> None:
        self.blocks: Counter[Key] = Counter()
        self.ever_removed: set[Key] = set()  # evicted at some point (for rare states)
        self.removed_now = 0  # BlockRemoved hashes of the last `apply`
        self.stored_now = 0
        # Releases before group-tagged events (`group_idx`, about 0.20) announce a hash
        # without its group: a router then keys by hash alone, and so does the check.
        self.grouped = True

    def apply(self, events: Iterable[Any]) -> None:
        self.removed_now = self.stored_now = 0
        for ev in events:
            kind = type(ev).__name__
            if kind == "AllBlocksCleared":
                self.blocks.clear()
                continue
            if not hasattr(ev, "group_idx"):
                self.grouped = False
            group = int(getattr(ev, "group_idx", 0) or 0)
            if kind == "BlockStored":
                for h in ev.block_hashes:
                    self.blocks[(group, h)] += 1
                    self.stored_now += 1
            elif kind == "BlockRemoved":
                for h in ev.block_hashes:
                    key = (group, h)
                    if self.blocks[key] <= 0:
                        raise CheckFailure("KV events", f"BlockRemoved for group {group} "
                                           f"hash {_short(h)}, which no BlockStored announced "
                                           "(or was already removed)")
                    self.blocks[key] -= 1
                    if not self.blocks[key]:
                        del self.blocks[key]
                    self.ever_removed.add(key)
                    self.removed_now += 1


def engine_blocks(pool: Any, utils: Any) -> Counter[Key]:
    """The engine's cached blocks, each copy counted, keyed as its events key them."""
    out: Counter[Key] = Counter()
    convert = getattr(utils, "maybe_convert_block_hash", event_hash)
    for key, _ in pool.cached_entries():
        h, group = pool.split_key(key)
        out[(group, convert(h))] += 1
    return out


def check_kv_events(view: ConsumerView, pool: Any, utils: Any) -> None:
    engine = engine_blocks(pool, utils)
    if not view.grouped:
        engine = _by_hash(engine)
    if engine == view.blocks:
        return
    missing = engine - view.blocks
    extra = view.blocks - engine
    parts = []
    if missing:
        parts.append(f"{sum(missing.values())} cached block(s) never announced (or announced "
                     f"removed) ({_keys(missing)})")
    if extra:
        parts.append(f"{sum(extra.values())} announced block(s) the engine does not cache "
                     f"({_keys(extra)})")
    raise CheckFailure("KV events", "a router's view rebuilt from the KV events differs from "
                       f"the engine's prefix cache: {'; '.join(parts)}")


def _short(h: Any) -> str:
    return h.hex()[:8] if isinstance(h, bytes) else str(h)[:8]


def _keys(c: Counter[Key]) -> str:
    return ", ".join(f"group {g} hash {_short(h)} x{n}" for (g, h), n in sorted(
        c.items(), key=lambda kv: (kv[0][0], _short(kv[0][1])))[:4])


def _by_hash(blocks: Counter[Key]) -> Counter[Key]:
    """Copies counted per hash, every group's together (as group 0)."""
    out: Counter[Key] = Counter()
    for (_, h), n in blocks.items():
        out[(0, h)] += n
    return out


def event_hash(h: Any) -> Any:
    """A block hash as the events of a release without `maybe_convert_block_hash` carry
    it: a `BlockHash` tuple's integer value (about 0.9 to 0.10), else the hash itself."""
    if hasattr(h, "get_hash_value"):
        return h.get_hash_value()
    return getattr(h, "hash_value", h)
