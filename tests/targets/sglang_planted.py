"""Bugs planted in patched copies of SGLang's code (the installed package is never
touched): the SWA free path of the hybrid allocator, the namespace of the cache insert,
and the all-SWA tree's release (`WINDOW_EVICTED_RECACHED`, below). The SWA free path: a
subclass of the pinned `SWATokenToKVPoolAllocator` whose out-of-window free returns the
SWA pages to the pool but leaves the full-to-SWA mapping pointing at them, so a freed SWA
slot is still read through the mapping and, once reallocated, is shared by two
positions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpocket.verify.patching import SourceEdit, edited_copy


def stale_mapping_allocator() -> type:
    from kvpocket.verify.targets.sglang import api

    base: Any = api().swa_alloc.SWATokenToKVPoolAllocator

    class StaleMappingSWAAllocator(base):  # type: ignore[misc]
        def _free_swa_pages_none_cuda(self, full_page_representatives: Any) -> Any:
            ps = self.page_size
            swa_tokens = self.full_to_swa_index_mapping[full_page_representatives]
            # the planted bug: the pages go back, the mapping to them stays
            return swa_tokens if ps == 1 else swa_tokens // ps

    return StaleMappingSWAAllocator


# Bugs in the namespace of the cache insert: patched copies of the pinned release's
# `UnifiedRadixCache.checkpoint_into_tree` (the insert of every finished or chunked
# request), put on a subclass of one instance's tree class.
CHECKPOINT = "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache.checkpoint_into_tree"
INSERT_KEY = """            req.extra_key,
            is_bigram=self.tree_core.is_eagle,
            cache_salt=req.cache_salt,
        )
"""
# the cache salt dropped from the inserted key: a tenant's blocks land in the unsalted
# namespace, where any request without that salt hits them
SALT_DROPPED = (SourceEdit(CHECKPOINT, INSERT_KEY, INSERT_KEY.replace(
    "cache_salt=req.cache_salt", "cache_salt=None")),)
# the extra key (where `Req` puts the LoRA adapter's id) dropped from the inserted key:
# blocks computed under an adapter are hit by requests without it
EXTRA_KEY_DROPPED = (SourceEdit(CHECKPOINT, INSERT_KEY, INSERT_KEY.replace(
    "req.extra_key,", "None,")),)


# The all-SWA tree's release path (#31486's shape): a patched copy of the pinned release's
# `RadixCache.checkpoint` (what `release_kv_cache` calls to insert a finished request, and
# every chunk's checkpoint), on a subclass of one PureSWARadixCache instance's class, that
# drops the evict floor's key limit: a prefill-aware model's finished request inserts its
# whole row, the KV its decode already freed out of the window included.
RADIX_CHECKPOINT = "sglang.srt.mem_cache.radix_cache:RadixCache.checkpoint"
KEY_LIMIT = """        key_limit = (
            ceil_align(swa_evict_floor, self.page_size) if swa_evict_floor > 0 else None
        )
"""
WINDOW_EVICTED_RECACHED = (SourceEdit(RADIX_CHECKPOINT, KEY_LIMIT,
                                      "        key_limit = None\n"),)


def planted_tree(edits: tuple[SourceEdit, ...],
                 method_name: str = "checkpoint_into_tree") -> Callable[[Any], None]:
    """An `on_build` hook: the instance's tree becomes a subclass with the patched
    `method_name` (the unified tree's insert by default). The copy is made at the first
    build, once SGLang is imported the target's way (`sglang.api`, its stubs first)."""
    made: list[Any] = []

    def install(inst: Any) -> None:
        if not made:
            made.append(edited_copy(edits))
        base = type(inst.tree)
        inst.tree.__class__ = type(f"Planted{base.__name__}", (base,),
                                   {method_name: made[0]})

    return install
