"""The event log: one NDJSON line per API call, checkable by `kvpocket trace check`.

Enabled by `KVCacheManager(..., event_log=PATH_OR_TEXT_STREAM)`. The format is
documented in `docs/adapter-guide.md` and parsed by `kvpocket.verify.trace`:

    {"kvpocket_trace": 1, "kind": "events", "config": {...}, "source": ..., "policy": ...}
    {"action": "resize", "params": {"seq": 7, "capacity": 8, "history": 6},
     "choices": [["slot", 3], ["victim", [0, 0, 2]], ["pocket", [0, 0, 1]]],
     "result": true, "observed": {"free": [[0, 0, 1], ...], "index": [[...]], ...}}

Choices are labels both sides can name: a slot id for every slot taken (any level), the
(level, pool group, slot) where a victim or a popped/refused pocket entry sat when it was
picked. The hooks wrap the public API methods of the manager and of each `KVCache` on
the instance, so a manager without a log pays nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kvpocket.model.config import SeqStatus

from . import errors as e
from .snapshot import Where, choice_labels, page_locations

if TYPE_CHECKING:
    from .kvcache import KVCache
    from .manager import KVCacheManager

EVENTS_KIND = "events"

# The model's error category for each implementation error (as `verify/adapter.py`).
ERROR_CATEGORY: dict[type[BaseException], str] = {
    e.UnknownSequenceError: "unknown_sequence",
    e.DuplicateSequenceError: "sequence_state",
    e.SequenceClosedError: "sequence_state",
    e.SequenceStateError: "sequence_state",
    e.HistoryDecreaseError: "history_decrease",
    e.CapacityError: "capacity",
    e.CommitNotAllowedError: "commit",
    e.UnknownLevelError: "capacity",
}


def error_category(exc: BaseException) -> str:
    for cls in type(exc).__mro__:
        if cls in ERROR_CATEGORY:
            return ERROR_CATEGORY[cls]
    return type(exc).__name__


class EventLog:
    """Writes the header at construction and one event per API call."""

    def __init__(self, sink: str | Path | TextIO, mgr: KVCacheManager,
                 observed: bool = True) -> None:
        if isinstance(sink, (str, Path)):
            Path(sink).parent.mkdir(parents=True, exist_ok=True)
            self._out: TextIO = Path(sink).open("w")  # noqa: SIM115 (closed by close())
            self._owned = True
        else:
            self._out, self._owned = sink, False
        self.observed = observed
        self._mgr = mgr
        cfg = mgr.cfg
        self.write({"kvpocket_trace": 1, "kind": EVENTS_KIND, "config": cfg.to_json(),
                    "source": "kvpocket.impl", "policy": cfg.pocket.policy.value})

    def write(self, obj: dict[str, Any]) -> None:
        self._out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._out.flush()

    def close(self) -> None:
        if self._owned and not self._out.closed:
            self._out.close()

    # ---- the hooks ---------------------------------------------------------------------
    def instrument_manager(self, mgr: KVCacheManager) -> None:
        """Wrap the manager's API and environment entry points on this instance."""
        create, pressure = mgr.create, mgr.pressure
        fail_alloc, fail_copy = mgr.inject_allocation_failure, mgr.inject_copy_failure

        def logged_create(seq_id: int, prompt_tokens: Any = ()) -> Any:
            prompt = list(prompt_tokens)
            return self.call("create", {"seq": seq_id, "prompt": prompt}, seq_id,
                             lambda: create(seq_id, prompt))

        def logged_pressure(level: int, pool_group: int, n: int) -> Any:
            return self.call("pressure", {"level": level, "pool_group": pool_group, "slots": n},
                             None, lambda: pressure(level, pool_group, n))

        setattr(mgr, "create", logged_create)  # noqa: B010 (instance attribute on purpose)
        setattr(mgr, "pressure", logged_pressure)  # noqa: B010
        setattr(mgr, "inject_allocation_failure",  # noqa: B010
                lambda: self.call("fail_allocation", {}, None, fail_alloc))
        setattr(mgr, "inject_copy_failure",  # noqa: B010
                lambda: self.call("fail_copy", {}, None, fail_copy))

    def instrument_sequence(self, kv: KVCache) -> None:
        """Wrap one sequence handle's API methods on this instance."""
        sid = kv.seq_id
        for name in ("resume", "stop_committing", "suspend", "close"):
            method = getattr(kv, name)
            setattr(kv, name, self._simple(name, sid, method))
        resize, commit = kv.resize, kv.commit

        def logged_resize(capacity: int | None = None, history_length: int | None = None) -> Any:
            cap = kv.capacity if capacity is None else capacity
            h = kv.history if history_length is None else history_length
            return self.call("resize", {"seq": sid, "capacity": cap, "history": h}, sid,
                             lambda: resize(capacity, history_length))

        def logged_commit(tokens: Any) -> Any:
            toks = list(tokens)
            return self.call("commit", {"seq": sid, "tokens": toks}, sid, lambda: commit(toks))

        setattr(kv, "resize", logged_resize)  # noqa: B010
        setattr(kv, "commit", logged_commit)  # noqa: B010

    def _simple(self, name: str, sid: int, method: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: self.call(name, {"seq": sid}, sid, method)

    def stream_completed(self, stream: int | str) -> None:
        """Record that a stream's outstanding work completed: a sequence id or "copy"."""
        self.write({"action": "advance", "params": {"stream": stream}, "choices": [],
                    "result": None})

    # ---- one call ----------------------------------------------------------------------
    def call(self, action: str, params: dict[str, Any], seq: int | None,
             fn: Callable[[], Any]) -> Any:
        mgr = self._mgr
        where = page_locations(mgr)
        mgr._choices = []  # a call rejected before it starts records nothing
        event: dict[str, Any] = {"action": action, "params": params}
        try:
            value = fn()
        except e.KVPocketError as exc:
            event["choices"] = self._labels(where)
            event["result"] = {"error": error_category(exc)}
            self.write(event)
            raise
        event["choices"] = self._labels(where)
        event["result"] = value if isinstance(value, bool) else None
        if self.observed:
            event["observed"] = self._observe(seq)
        self.write(event)
        return value

    def _labels(self, where: dict[int, Where]) -> list[list[Any]]:
        return [[kind, list(label) if isinstance(label, tuple) else label]
                for kind, label in choice_labels(self._mgr.last_choices(), where)]

    def _observe(self, seq: int | None) -> dict[str, Any]:
        mgr = self._mgr
        obs: dict[str, Any] = {"free": [[a.level, a.group, a.capacity - len(a.occupied)]
                                        for allocs in mgr.storage.allocs for a in allocs]}
        kv = mgr.seqs.get(seq) if seq is not None else None
        if kv is not None:
            obs["status"] = kv.status.name
            if kv.status is not SeqStatus.CLOSED:
                obs["index"] = [[int(x) for x in kv.index[lc, : kv.num_blocks]]
                                for lc in range(len(kv.pages))]
                obs["pocket"] = [[[p.level, p.group, p.slot] for p in pocket]
                                 for pocket in kv.pocket]
        return obs
