"""Bugs planted in patched copies of vLLM's own methods (verify/patching.py: edited_copy
compiles the edited source of the installed file in a copy of its module's namespace),
put on a subclass of one manager object's class: the installed package, its files and its
classes stay as they are."""

from __future__ import annotations

from typing import Any

from kvpocket.verify.patching import SourceEdit, edited_copy

COORDINATOR = "vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator.allocate_new_computed_blocks"
CACHE_FULL_BLOCKS = "vllm.v1.core.block_pool:BlockPool.cache_full_blocks"
ALLOCATE_SLOTS = "vllm.v1.core.kv_cache_manager:KVCacheManager.allocate_slots"

# P/D's guard lost: the blocks an asynchronous KV load will fill are cached at allocation
# (`delay_cache_blocks` ignored), so a prefix hit can take them before the load lands.
CACHE_BEFORE_THE_LOAD = (SourceEdit(
    ALLOCATE_SLOTS,
    """        if delay_cache_blocks:
            return self.create_kv_cache_blocks(new_blocks)
""", ""),)

# vLLM's fix of issue #33775 reverted: every group's local hit blocks are touched before
# any group allocates blocks for external (KV connector) tokens; with one loop, an earlier
# group's allocation can evict a later group's hit block before it is touched.
ONE_PHASE_EXTERNAL_ALLOCATION = (SourceEdit(
    COORDINATOR,
    """                num_external_computed_tokens,
            )
        if num_external_computed_tokens > 0:
            for i, manager in enumerate(self.single_type_managers):
                manager.allocate_external_computed_blocks(""",
    """                num_external_computed_tokens,
            )
            if num_external_computed_tokens > 0:
                manager.allocate_external_computed_blocks("""),)

# A BlockStored announces every new full block's hash, the ones cache_full_blocks skips
# too (null blocks, and blocks sparse sliding-window retention does not keep).
ANNOUNCE_SKIPPED_BLOCKS = (
    SourceEdit(CACHE_FULL_BLOCKS,
               """            if new_hashes is not None:
                new_hashes.append(maybe_convert_block_hash(block_hash))
""", ""),
    SourceEdit(CACHE_FULL_BLOCKS,
               """            if blk.is_null or (block_mask is not None and not block_mask[i]):
                continue
""",
               """            if new_hashes is not None:
                new_hashes.append(maybe_convert_block_hash(new_block_hashes[i]))
            if blk.is_null or (block_mask is not None and not block_mask[i]):
                continue
"""),
)


def _swap(obj: Any, method: str, edits: tuple[SourceEdit, ...]) -> None:
    cls = type(obj)
    obj.__class__ = type(f"Planted{cls.__name__}", (cls,), {method: edited_copy(edits)})


def one_phase_external_allocation(inst: Any) -> None:
    _swap(inst.mgr.coordinator, "allocate_new_computed_blocks", ONE_PHASE_EXTERNAL_ALLOCATION)


def cache_before_the_load(inst: Any) -> None:
    _swap(inst.mgr, "allocate_slots", CACHE_BEFORE_THE_LOAD)


def announce_skipped_blocks(inst: Any) -> None:
    _swap(inst.mgr.block_pool, "cache_full_blocks", ANNOUNCE_SKIPPED_BLOCKS)
