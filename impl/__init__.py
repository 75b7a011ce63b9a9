"""kvpocket.impl: a paged KV-cache manager with levels, eviction and the SWA reuse pocket.

Entry point: `KVCacheManager(cfg, backend="numpy"|"cupy"|"auto")`. The public API for
integrators (typed results, read-only views, usage errors, the shutdown report) is
documented in docs/adapter-guide.md.
"""

from .allocator import FirstSlotPolicy, SlotAllocator, SlotPolicy
from .backend import Backend, NumpyBackend, StreamSimulator, gpu_available, make_backend
from .counters import Counters
from .eviction import EvictionQueue, QueueOrderVictimPolicy, VictimPolicy
from .exceptions import (
    BackendUnavailableError,
    CapacityError,
    CapacityFailure,
    CommitNotAllowedError,
    CopyFailedError,
    CorruptionError,
    CorruptionWarning,
    DoubleReleaseError,
    DuplicateSequenceError,
    HistoryDecreaseError,
    InjectedAllocationError,
    KVPocketError,
    LeakError,
    ManagerShutdownError,
    OutOfPagesError,
    SequenceClosedError,
    SequenceStateError,
    SlotChoiceError,
    TooManySequencesError,
    UnknownLevelError,
    UnknownLifeCycleError,
    UnknownSequenceError,
    UsageError,
)
from .kvcache import KVCache
from .manager import KVCacheManager
from .results import (
    BlockEntry,
    LeakReport,
    OpResult,
    PageInfo,
    PocketEntry,
    PressureResult,
    ResizeResult,
    ResumeResult,
    ShutdownReport,
    SlotCount,
    SlotRef,
)

__all__ = [
    "Backend", "BackendUnavailableError", "BlockEntry", "CapacityError", "CapacityFailure",
    "CommitNotAllowedError",
    "CopyFailedError", "CorruptionError", "CorruptionWarning", "Counters",
    "DoubleReleaseError", "DuplicateSequenceError", "EvictionQueue", "FirstSlotPolicy",
    "HistoryDecreaseError", "InjectedAllocationError", "KVCache", "KVCacheManager",
    "KVPocketError", "LeakError", "LeakReport", "ManagerShutdownError", "NumpyBackend",
    "OpResult", "OutOfPagesError", "PageInfo", "PocketEntry", "PressureResult",
    "QueueOrderVictimPolicy", "ResizeResult", "ResumeResult", "SequenceClosedError",
    "SequenceStateError", "ShutdownReport", "SlotAllocator", "SlotChoiceError", "SlotCount",
    "SlotPolicy", "SlotRef", "StreamSimulator", "TooManySequencesError", "UnknownLevelError",
    "UnknownLifeCycleError", "UnknownSequenceError", "UsageError", "VictimPolicy",
    "gpu_available", "make_backend",
]
