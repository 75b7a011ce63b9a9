"""Errors of the model's API. The implementation raises its own classes; the
lockstep checker compares the `category` both sides report."""

from __future__ import annotations


class ModelError(Exception):
    category = "model"


class GuardViolation(ModelError):
    """An action was applied while its guard is false: a bug in the caller (or the model)."""

    category = "guard"

    def __init__(self, action: str, condition: str, params: dict[str, object]) -> None:
        shown = ", ".join(f"{k}={v}" for k, v in params.items())
        super().__init__(f"action '{action}({shown})' is not enabled: '{condition}' is false")
        self.action = action
        self.condition = condition
        self.params = params


class UsageError(ModelError):
    """API misuse; raised before any state change."""

    category = "usage"


class UnknownSequenceError(UsageError):
    category = "unknown_sequence"


class SequenceStateError(UsageError):
    category = "sequence_state"


class HistoryDecreaseError(UsageError):
    category = "history_decrease"


class CapacityError(UsageError):
    category = "capacity"


class CommitError(UsageError):
    category = "commit"


class ChoiceRejected(ModelError):
    """A recorded choice (from the implementation or a trace) is not legal in the model."""

    category = "choice"

    def __init__(self, kind: str, choice: object, legal: list[object]) -> None:
        super().__init__(f"choice {kind}={choice} is not legal here; legal: {legal}")
        self.kind = kind
        self.choice = choice
        self.legal = legal


class MissingChoice(ModelError):
    """The model makes a choice the record (an event log) has no more of."""

    category = "choice"

    def __init__(self, kind: str, labels: list[object]) -> None:
        super().__init__(f"the model makes a {kind} choice the record lacks; legal: {labels}")
        self.kind = kind
        self.labels = labels


class OutOfPages(Exception):  # mirrors upstream OutOfPagesError
    """Raised inside an API action; the action rolls back and reports failure.

    `consumed` names the injected fault ("alloc" or "copy") that caused it, if any:
    the rollback restores everything except that the fault has fired.
    """

    def __init__(self, reason: str, consumed: str | None = None) -> None:
        super().__init__(reason)
        self.consumed = consumed
