"""kvpocket.impl: a paged KV-cache manager with levels, eviction and the SWA reuse pocket.

Entry point: `KVCacheManager(cfg, backend="numpy"|"cupy"|"auto")`.
"""

from .allocator import FirstSlotPolicy, SlotAllocator, SlotPolicy
from .backend import Backend, NumpyBackend, StreamSimulator, gpu_available, make_backend
from .counters import Counters
from .eviction import EvictionQueue, QueueOrderVictimPolicy, VictimPolicy
from .exceptions import (
    CapacityError,
    CapacityFailure,
    CommitNotAllowedError,
    CopyFailedError,
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
    UnknownLevelError,
    UnknownLifeCycleError,
    UnknownSequenceError,
)
from .kvcache import KVCache
from .manager import KVCacheManager, LeakReport

__all__ = [
    "Backend", "CapacityError", "CapacityFailure", "CommitNotAllowedError", "CopyFailedError",
    "Counters", "DoubleReleaseError", "DuplicateSequenceError", "EvictionQueue",
    "FirstSlotPolicy", "HistoryDecreaseError", "InjectedAllocationError", "KVCache",
    "KVCacheManager", "KVPocketError", "LeakError", "LeakReport", "ManagerShutdownError",
    "NumpyBackend", "OutOfPagesError", "QueueOrderVictimPolicy", "SequenceClosedError",
    "SequenceStateError", "SlotAllocator", "SlotChoiceError", "SlotPolicy",
    "StreamSimulator", "UnknownLevelError", "UnknownLifeCycleError", "UnknownSequenceError",
    "VictimPolicy", "gpu_available", "make_backend",
]
