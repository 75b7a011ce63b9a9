"""A bug planted in a patched copy of SGLang's SWA free path (the installed package is
never touched): a subclass of the pinned `SWATokenToKVPoolAllocator` whose out-of-window
free returns the SWA pages to the pool but leaves the full-to-SWA mapping pointing at
them, so a freed SWA slot is still read through the mapping and, once reallocated, is
shared by two positions."""

from __future__ import annotations

from typing import Any


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
