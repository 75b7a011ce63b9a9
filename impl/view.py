"""`ManagerView`: the public reads of a manager that snapshot, invariants and the event
log need.

The integrator's read-only views (free slots, pages, block tables, pockets) are methods
of `KVCacheManager` and `KVCache` returning the immutable types of `results.py`; this
protocol is the internal one.

A structural type (`KVCacheManager` satisfies it without naming it), so those
modules type their argument without importing `manager.py`, which imports them:
the import graph of `impl/` stays acyclic (tests/impl/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kvpocket.model.config import KVConfig

    from .kvcache import KVCache
    from .results import PressureResult
    from .storage import Storage
    from .transactions import Transactions
    from .undo import Choice


class ManagerView(Protocol):
    """What a reader of the whole manager state uses (all attributes read-only here)."""

    @property
    def cfg(self) -> KVConfig: ...

    @property
    def storage(self) -> Storage: ...

    @property
    def seqs(self) -> Mapping[int, KVCache]: ...

    @property
    def transactions(self) -> Transactions: ...

    def last_choices(self) -> list[Choice]: ...


class ManagerEntryPoints(ManagerView, Protocol):
    """The manager-level API methods the event log wraps on an instance."""

    def create(self, seq_id: int, prompt_tokens: Sequence[int] = ()) -> KVCache: ...

    def pressure(self, level: int, pool_group: int, n: int) -> PressureResult: ...

    def inject_allocation_failure(self) -> None: ...

    def inject_copy_failure(self) -> None: ...
