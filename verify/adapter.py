"""The adapter layer between model actions and implementation calls.

One entry per action of the lockstep alphabet. The model and the
implementation speak slightly different languages (sequence slots vs ids,
token lists vs "the next n tokens", exceptions vs categories); every
translation lives here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvpocket.impl import errors as impl_errors
from kvpocket.model.errors import ChoiceRejected, UsageError

# Implementation exception classes and the model category each corresponds to.
IMPL_CATEGORY: dict[type[BaseException], str] = {
    impl_errors.UnknownSequenceError: "unknown_sequence",
    impl_errors.DuplicateSequenceError: "sequence_state",
    impl_errors.SequenceClosedError: "sequence_state",
    impl_errors.SequenceStateError: "sequence_state",
    impl_errors.HistoryDecreaseError: "history_decrease",
    impl_errors.CapacityError: "capacity",
    impl_errors.CommitNotAllowedError: "commit",
    impl_errors.UnknownLevelError: "capacity",
}


@dataclass(frozen=True)
class Outcome:
    """What a call returned, comparable across the two sides."""

    kind: str  # "ok" or "error"
    value: Any = None  # the return value, or the error category
    detail: str = ""

    def same_as(self, other: Outcome) -> bool:
        return (self.kind, self.value) == (other.kind, other.value)

    def __str__(self) -> str:
        if self.kind == "ok":
            return f"returned {self.value!r}"
        return f"raised {self.value} ({self.detail})"


def impl_outcome(call: Callable[[], Any]) -> Outcome:
    try:
        value = call()
    except impl_errors.KVPocketError as exc:
        for cls in type(exc).__mro__:
            if cls in IMPL_CATEGORY:
                return Outcome("error", IMPL_CATEGORY[cls], str(exc))
        raise
    return Outcome("ok", value if isinstance(value, bool) else None)


def model_outcome(call: Callable[[], Any]) -> Outcome:
    try:
        value = call()
    except ChoiceRejected:
        raise
    except UsageError as exc:
        return Outcome("error", exc.category, str(exc))
    return Outcome("ok", value if isinstance(value, bool) else None)


@dataclass(frozen=True)
class ActionSpec:
    """An action of the lockstep alphabet: its parameters and whether it is environment."""

    name: str
    params: tuple[str, ...]
    environment: bool
    doc: str


ALPHABET: dict[str, ActionSpec] = {a.name: a for a in (
    ActionSpec("create", ("seq", "prompt"), False, "create a sequence, reusing a committed prefix"),
    ActionSpec("resume", ("seq",), False, "bring a sequence's pages to GPU and lock them"),
    ActionSpec("resize", ("seq", "capacity", "history"), False,
               "grow/shrink and advance the window; the harness writes and verifies data"),
    ActionSpec("commit", ("seq", "n"), False, "commit the sequence's next n tokens"),
    ActionSpec("stop_committing", ("seq",), False, "stop committing"),
    ActionSpec("suspend", ("seq",), False, "suspend"),
    ActionSpec("close", ("seq",), False, "close"),
    ActionSpec("pressure", ("level", "pool_group", "slots"), True,
               "another tenant needs free slots at a level"),
    ActionSpec("advance", ("stream",), True,
               "a stream's queued GPU work runs (stream num_sequences: the copy stream)"),
    ActionSpec("fail_allocation", (), True, "the next slot allocation fails"),
    ActionSpec("fail_copy", (), True, "the next migration copy fails"),
)}


def check_params(action: str, params: dict[str, Any]) -> None:
    """A trace line's action and parameters, validated with a clear message."""
    if action not in ALPHABET:
        raise ValueError(f"unknown action '{action}'; expected one of {', '.join(ALPHABET)}")
    want = set(ALPHABET[action].params)
    got = set(params)
    if want != got:
        raise ValueError(f"action '{action}' takes parameters {sorted(want)}, got {sorted(got)}")
    for k, v in params.items():
        if k == "prompt":
            if not isinstance(v, list) or not all(isinstance(x, int) for x in v):
                raise ValueError(f"parameter 'prompt' of '{action}' must be a list of ints")
        elif isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"parameter '{k}' of '{action}' must be an int, got {v!r}")
