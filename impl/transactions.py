"""`Transactions`: runs API calls as `Op`s and keeps the last call's choice record.

Shared by the manager and every `KVCache` handle (each gets it at construction), so
a sequence's API methods run their ops without reaching into the manager. It owns
the "shut down" flag too: every API call checks it first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .exceptions import ManagerShutdownError
from .undo import Choice, Op

if TYPE_CHECKING:
    from .counters import CounterBook
    from .storage import Storage


class Transactions:
    """Runs one API call at a time as an `Op` over `storage`, merging into `counters`."""

    def __init__(self, storage: Storage, counters: CounterBook) -> None:
        self.storage = storage
        self.counters = counters
        self._choices: list[Choice] = []
        self._shut = False

    # ---- open / shut -------------------------------------------------------------------
    def check_open(self) -> None:
        if self._shut:
            raise ManagerShutdownError("the manager was shut down")

    def shut(self) -> None:
        """Every later call fails with `ManagerShutdownError`."""
        self._shut = True

    # ---- running ops -------------------------------------------------------------------
    def run(self, fn: Callable[[Op], None]) -> None:
        """Run `fn` as one op: on an exception roll it back exactly (recording the
        choices made plus ("fail", ExceptionName)) and re-raise; on success run the
        deferred stream work and merge the counters."""
        op = Op()
        self.storage.begin_op()
        try:
            fn(op)
        except BaseException as exc:
            op.rollback()
            self._choices = [*op.choices, ("fail", type(exc).__name__)]
            self.storage.begin_op()
            raise
        self._choices = op.choices
        for work in op.deferred:
            work()
        self.counters.merge(op.counts)
        self.storage.begin_op()

    # ---- the choice record -------------------------------------------------------------
    def last_choices(self) -> list[Choice]:
        """Choices made by the last call, in order (a copy)."""
        return list(self._choices)

    def reset_choices(self, choices: Sequence[Choice] = ()) -> None:
        """Replace the record: empty for a call that makes no op (a no-op fast path, a
        call rejected before it starts), or a kept earlier record."""
        self._choices = list(choices)
