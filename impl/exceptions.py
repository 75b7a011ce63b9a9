"""Exceptions raised by the implementation.

Every API misuse raises a specific subclass of `KVPocketError` *before* any
state is changed, so a caught error always leaves the manager as it was.
Capacity failures (`OutOfPagesError`, `CopyFailedError`) are rolled back
exactly; operations that can run out of pages (`resize`, `resume`, `pressure`)
return a falsy typed result naming them (`results.py`) instead of raising.

`UsageError` is the base of every misuse error: its `category` is the model's name for
it (`model/errors.py`), `parameter` the argument at fault (None when the sequence's state
is at fault). `CorruptionError` is an internal inconsistency (a slot released twice): the
manager records it, reports it on `close`/`shutdown`, and warns with `CorruptionWarning`.
"""

from __future__ import annotations


class KVPocketError(Exception):
    """Base class of every error raised by `kvpocket.impl`.

    `category` is the model's name for a usage error (`model/errors.py`), which event
    logs report and the lockstep compares; None for errors that are not usage errors."""

    category: str | None = None


class UsageError(KVPocketError):
    """API misuse, raised before any state changed. `category`: the model's category
    (`model/errors.py`); `parameter`: the argument at fault, if one is."""

    category: str | None = "usage"

    def __init__(self, message: str = "", *, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


class CapacityFailure(KVPocketError):
    """An operation could not complete for lack of resources; state was rolled back."""


class OutOfPagesError(CapacityFailure):
    """No slot could be made free at a level (eviction cascade exhausted)."""


class InjectedAllocationError(OutOfPagesError):
    """The allocation failure armed by `inject_allocation_failure` (never absorbed
    by the cascade's drop-instead fallback: it always fails the API call)."""


class CopyFailedError(CapacityFailure):
    """A migration copy failed (injected by `inject_copy_failure`)."""


class UnknownSequenceError(UsageError, KeyError):
    """The sequence id was never created."""

    category = "unknown_sequence"

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown sequence"


class DuplicateSequenceError(UsageError):
    """`create` was called with a sequence id that already exists."""

    category = "sequence_state"


class SequenceClosedError(UsageError):
    """The sequence was closed; no operation but `close` (idempotent) is allowed."""

    category = "sequence_state"


class SequenceStateError(UsageError):
    """The operation needs another status (e.g. `resize` on a SUSPENDED sequence)."""

    category = "sequence_state"


class TooManySequencesError(SequenceStateError):
    """`create` while `num_sequences` sequences are open (not CLOSED): every sequence slot
    of the configuration is in use, as the model's `create` on a slot in use."""


class HistoryDecreaseError(UsageError, ValueError):
    """`history_length` may only grow."""

    category = "history_decrease"


class CapacityError(UsageError, ValueError):
    """A capacity is below the history, above `max_blocks * tokens_per_block`,
    or a commit would exceed the capacity."""

    category = "capacity"


class CommitNotAllowedError(UsageError):
    """`commit` after `stop_committing` (commit state USER_STOP)."""

    category = "commit"


class UnknownLifeCycleError(UsageError, ValueError):
    """A life-cycle index or name that the configuration does not have (an index out of
    range, as a level: category "capacity"; no model action takes a life cycle)."""

    category = "capacity"


class UnknownLevelError(UsageError, ValueError):
    """A cache level or pool group that the configuration does not have."""

    category = "capacity"


class CorruptionError(KVPocketError):
    """The manager's own state is inconsistent (a bug, or the `unsafe` pocket policy
    aliasing slots). Not a usage error: `category` is None."""


class CorruptionWarning(RuntimeWarning):
    """Warned once per corruption the manager detects and survives (`close`, `shutdown`);
    `KVCacheManager.corruption` and the shutdown report list them."""


class DoubleReleaseError(CorruptionError):
    """A slot was released twice or was never issued (allocator corruption)."""


class SlotChoiceError(KVPocketError, ValueError):
    """A `SlotPolicy`/`VictimPolicy` returned a choice that is not a candidate."""


class LeakError(KVPocketError):
    """`shutdown(raise_on_leak=True)` found pages or slots still alive."""


class BackendUnavailableError(KVPocketError, RuntimeError):
    """The backend asked for cannot run here (no CuPy, or no usable CUDA device)."""


class SimulatorError(KVPocketError):
    """The stream simulator was driven into an impossible state (e.g. deadlock)."""


class RaceError(SimulatorError):
    """The simulator's race detector (`race_check=True`) found two accesses of a slot, one
    a write, that no event, wait or host synchronisation orders: a race on a GPU."""


class ManagerShutdownError(KVPocketError):
    """The manager was shut down; no further operation is allowed."""
