"""Exceptions raised by the implementation.

Every API misuse raises a specific subclass of `KVPocketError` *before* any
state is changed, so a caught error always leaves the manager as it was.
Capacity failures (`OutOfPagesError`, `CopyFailedError`) are rolled back
exactly; operations that return a bool (`resize`, `resume`, `pressure`)
turn them into `False`.
"""

from __future__ import annotations


class KVPocketError(Exception):
    """Base class of every error raised by `kvpocket.impl`.

    `category` is the model's name for a usage error (`model/errors.py`), which event
    logs report and the lockstep compares; None for errors that are not usage errors."""

    category: str | None = None


class CapacityFailure(KVPocketError):
    """An operation could not complete for lack of resources; state was rolled back."""


class OutOfPagesError(CapacityFailure):
    """No slot could be made free at a level (eviction cascade exhausted)."""


class InjectedAllocationError(OutOfPagesError):
    """The allocation failure armed by `inject_allocation_failure` (never absorbed
    by the cascade's drop-instead fallback: it always fails the API call)."""


class CopyFailedError(CapacityFailure):
    """A migration copy failed (injected by `inject_copy_failure`)."""


class UnknownSequenceError(KVPocketError, KeyError):
    """The sequence id was never created."""

    category = "unknown_sequence"

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown sequence"


class DuplicateSequenceError(KVPocketError):
    """`create` was called with a sequence id that already exists."""

    category = "sequence_state"


class SequenceClosedError(KVPocketError):
    """The sequence was closed; no operation but `close` (idempotent) is allowed."""

    category = "sequence_state"


class SequenceStateError(KVPocketError):
    """The operation needs another status (e.g. `resize` on a SUSPENDED sequence)."""

    category = "sequence_state"


class HistoryDecreaseError(KVPocketError, ValueError):
    """`history_length` may only grow."""

    category = "history_decrease"


class CapacityError(KVPocketError, ValueError):
    """A capacity is below the history, above `max_blocks * tokens_per_block`,
    or a commit would exceed the capacity."""

    category = "capacity"


class CommitNotAllowedError(KVPocketError):
    """`commit` after `stop_committing` (commit state USER_STOP)."""

    category = "commit"


class UnknownLifeCycleError(KVPocketError, ValueError):
    """A life-cycle index or name that the configuration does not have."""


class UnknownLevelError(KVPocketError, ValueError):
    """A cache level or pool group that the configuration does not have."""

    category = "capacity"


class DoubleReleaseError(KVPocketError):
    """A slot was released twice or was never issued (allocator corruption)."""


class SlotChoiceError(KVPocketError, ValueError):
    """A `SlotPolicy`/`VictimPolicy` returned a choice that is not a candidate."""


class LeakError(KVPocketError):
    """`shutdown(raise_on_leak=True)` found pages or slots still alive."""


class SimulatorError(KVPocketError):
    """The stream simulator was driven into an impossible state (e.g. deadlock)."""


class ManagerShutdownError(KVPocketError):
    """The manager was shut down; no further operation is allowed."""
