"""Typed results and immutable views of the public API (docs/adapter-guide.md).

Results: `resize`, `resume` and `pressure` return an `OpResult` subclass. It is truthy
exactly when the call succeeded, so `if not kv.resize(...)` keeps working; on a capacity
failure (the call was rolled back, nothing changed) it names the failure (`error`: the
class name, e.g. "OutOfPagesError"; `reason`: its message) and `raise_for_failure()`
raises it, for callers that prefer exceptions.

Views: plain `NamedTuple`s and tuples built on each call from the manager's state, so a
caller can keep them, compare them and hash them, and never mutates the manager through
them. Nothing here imports the manager or a sequence handle (they import this module).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Self

from .exceptions import CapacityFailure, LeakError


@dataclass(frozen=True)
class OpResult:
    """The outcome of a call that can run out of pages: truthy iff `ok`."""

    ok: bool
    error: str | None = None  # the capacity failure's class name, None on success
    reason: str = ""  # its message
    exception: CapacityFailure | None = field(default=None, compare=False, repr=False)

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def failed(cls, exc: CapacityFailure) -> Self:
        """The result of a call that `exc` rolled back."""
        return cls(False, type(exc).__name__, str(exc), exc)

    def raise_for_failure(self) -> None:
        """Raise the capacity failure (`OutOfPagesError`, `InjectedAllocationError`,
        `CopyFailedError`) that rolled the call back; nothing if it succeeded."""
        if self.exception is not None:
            raise self.exception


@dataclass(frozen=True)
class ResizeResult(OpResult):
    """What `KVCache.resize` returns."""


@dataclass(frozen=True)
class ResumeResult(OpResult):
    """What `KVCache.resume` returns."""


@dataclass(frozen=True)
class PressureResult(OpResult):
    """What `KVCacheManager.pressure` returns."""


# Shared success values: the hot path (a decode step's resize) allocates nothing.
RESIZE_OK = ResizeResult(True)
RESUME_OK = ResumeResult(True)
PRESSURE_OK = PressureResult(True)


class SlotCount(NamedTuple):
    """Slots of one (level, pool group): `free` of `capacity` can be allocated now."""

    level: int
    pool_group: int
    free: int
    capacity: int

    @property
    def used(self) -> int:
        return self.capacity - self.free


class SlotRef(NamedTuple):
    """A slot: (level, pool group, slot id)."""

    level: int
    pool_group: int
    slot: int


class PocketEntry(NamedTuple):
    """One parked page of a sequence's pocket, oldest first. `valid`: the page is still
    live at GPU with a slot, so a pop may reuse the slot (what `revalidate` checks); an
    invalid entry is refused under `revalidate` (and aliased under `unsafe`)."""

    page_id: int
    level: int
    pool_group: int
    slot: int
    valid: bool


class BlockEntry(NamedTuple):
    """One block of a sequence for one life cycle. `page_id` None: no page (never
    allocated, or dropped as stale). `locked`: the page is at GPU and the block table
    holds its slot; a page that is only held (suspended, or a stale block kept for a later
    commit) has `locked` False and no block-table entry."""

    block: int
    page_id: int | None
    level: int | None
    slot: int | None
    locked: bool
    stale: bool


class PageInfo(NamedTuple):
    """A live page. `status`: "LOCKED", "HELD" or "DROPPABLE"; `owner`: the sequence that
    created it while uncommitted; `pocket_owner`: the sequence whose pocket holds it."""

    page_id: int
    lc: int
    pool_group: int
    level: int
    slot: int
    status: str
    committed: bool
    locks: int
    holds: int
    owner: int | None
    pocket_owner: int | None


@dataclass(frozen=True)
class LeakReport:
    """What `shutdown` found still alive after dropping the reusable (tree-only) pages."""

    open_sequences: tuple[int, ...] = ()
    pages: tuple[PageInfo, ...] = ()
    orphan_slots: tuple[SlotRef, ...] = ()  # occupied in an allocator, owned by no page

    def __bool__(self) -> bool:
        return bool(self.open_sequences or self.pages or self.orphan_slots)

    def __str__(self) -> str:
        if not self:
            return "no leaks"
        return (f"leaks: open sequences {list(self.open_sequences)}; "
                f"{len(self.pages)} live pages {[p.page_id for p in self.pages]}; "
                f"occupied slots without a page {[tuple(s) for s in self.orphan_slots]}")


@dataclass(frozen=True)
class ShutdownReport:
    """What `shutdown` returns: the leaks, and the corruption the manager detected over its
    lifetime (invariant violations, double releases it survived), each named in one line.
    Falsy when there is neither."""

    leaks: LeakReport = field(default_factory=LeakReport)
    corruption: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.leaks) or self.corrupted

    @property
    def corrupted(self) -> bool:
        return bool(self.corruption)

    # The leak report's fields, for callers of the former `LeakReport` return value.
    @property
    def open_sequences(self) -> tuple[int, ...]:
        return self.leaks.open_sequences

    @property
    def pages(self) -> tuple[PageInfo, ...]:
        return self.leaks.pages

    @property
    def orphan_slots(self) -> tuple[SlotRef, ...]:
        return self.leaks.orphan_slots

    def raise_if_unclean(self) -> None:
        """`LeakError` naming the leaks and the corruption, if there is any."""
        if self:
            raise LeakError(str(self))

    def __str__(self) -> str:
        if not self:
            return "clean: no leaks, no corruption"
        lines = [str(self.leaks)]
        if self.corruption:
            lines.append(f"corruption ({len(self.corruption)}):")
            lines += [f"  {c}" for c in self.corruption]
        return "\n".join(lines)
