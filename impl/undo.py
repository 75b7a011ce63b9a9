"""Transactions: an undo log, deferred stream work and a choice record per API call.

Every state mutation inside an operation goes through an `Op`, which records
its inverse. Stream work (copies, waits, event records) is *deferred* until
the operation succeeds, so a rolled-back operation has touched neither the
metadata nor the device: rollback is exact by construction. Savepoints let a
nested attempt (e.g. "make room one level down") fail and be undone while the
enclosing operation goes on (e.g. the victim is dropped instead).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .counters import CounterDelta

Choice = tuple[Any, ...]


class Op:
    """One API call in progress."""

    __slots__ = ("choices", "counts", "deferred", "fences", "recording", "undo")

    def __init__(self, recording: bool = True) -> None:
        self.recording = recording
        self.undo: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.deferred: list[Callable[[], None]] = []
        self.choices: list[Choice] = []
        self.counts = CounterDelta()
        self.fences: dict[int, Any] = {}  # stream id -> EventRef recorded by this op

    # ---- mutations with inverses -------------------------------------------------------
    def set(self, obj: Any, name: str, value: Any) -> None:
        if self.recording:
            self.undo.append((setattr, (obj, name, getattr(obj, name))))
        setattr(obj, name, value)

    def setitem(self, container: Any, key: Any, value: Any) -> None:
        if self.recording:
            self.undo.append((container.__setitem__, (key, container[key])))
        container[key] = value

    def on_undo(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.recording:
            self.undo.append((fn, args))

    def defer(self, fn: Callable[[], None]) -> None:
        self.deferred.append(fn)

    def choose(self, choice: Choice) -> None:
        self.choices.append(choice)

    def count(self, name: str, seq: int | None, n: int = 1) -> None:
        self.counts.items[(name, seq)] += n

    # ---- savepoints --------------------------------------------------------------------
    def savepoint(self) -> tuple[int, int, int, dict[tuple[str, int | None], int], dict[int, Any]]:
        return (len(self.undo), len(self.deferred), len(self.choices),
                dict(self.counts.items), dict(self.fences))

    def rollback_to(
        self, sp: tuple[int, int, int, dict[tuple[str, int | None], int], dict[int, Any]]
    ) -> None:
        """Undo a nested attempt. Its choices stay in the record, marked ("undone", ...):
        the model decides such an attempt up front and never makes them."""
        n_undo, n_def, n_choice, counts, fences = sp
        self._undo_to(n_undo)
        del self.deferred[n_def:]
        self.choices[n_choice:] = [("undone", *c) for c in self.choices[n_choice:]]
        self.counts.items.clear()
        self.counts.items.update(counts)
        self.fences = fences

    def rollback(self) -> None:
        """Undo the whole call. Its choices stay as made: the model, failing the same
        call, makes the same ones before it fails."""
        self._undo_to(0)
        self.deferred.clear()
        self.counts.items.clear()
        self.fences = {}

    def _undo_to(self, n_undo: int) -> None:
        while len(self.undo) > n_undo:
            fn, args = self.undo.pop()
            fn(*args)
