"""Bugs planted in patched copies of SGLang's code (the installed package is never
touched). The SWA free path: a subclass of the pinned `SWATokenToKVPoolAllocator` whose out-of-window
free returns the SWA pages to the pool but leaves the full-to-SWA mapping pointing at
them, so a freed SWA slot is still read through the mapping and, once reallocated, is
shared by two positions."""

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


def planted_tree(edits: tuple[SourceEdit, ...]) -> Callable[[Any], None]:
    """An `on_build` hook: the instance's tree becomes a subclass with the patched insert."""
    method = edited_copy(edits)

    def install(inst: Any) -> None:
        base = type(inst.tree)
        inst.tree.__class__ = type(f"Planted{base.__name__}", (base,),
                                   {"checkpoint_into_tree": method})

    return install
