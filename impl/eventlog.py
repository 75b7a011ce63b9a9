"""The event log: one NDJSON line per API call, checkable by `kvpocket trace check`.

Enabled by `KVCacheManager(..., event_log=PATH_OR_TEXT_STREAM)`. The format is
documented in `docs/adapter-guide.md` and parsed by `kvpocket.verify.traces.trace`:

    {"kvpocket_trace": 1, "kind": "events", "config": {...}, "source": ..., "policy": ...}
    {"action": "resize", "params": {"seq": 7, "capacity": 8, "history": 6},
     "choices": [["slot", 3], ["victim", [0, 0, 2]], ["pocket", [0, 0, 1]]],
     "result": true, "observed": {"free": [[0, 0, 1], ...], "index": [[...]], ...}}
    ...
    {"kvpocket_end": 57, "digest": "sha256:..."}

The last line, written by `close()` (the manager's `shutdown`), is the end marker: the
number of event lines and the SHA-256 of the header and event lines as written (each
followed by a newline). A log without it was cut short (`kvpocket trace check` says so).

Choices are labels both sides can name: a slot id for every slot taken (any level), the
(level, pool group, slot) where a victim or a popped/refused pocket entry sat when it was
picked. The hooks wrap the public API methods of the manager and of each `KVCache` on
the instance, so a manager without a log pays nothing.

The log reads the manager through `ManagerView` (`view.py`) and clears the choice
record through its public `transactions`; `manager.py` imports this module, never the
reverse.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kvpocket.model.api import API, ApiAction
from kvpocket.model.config import SeqStatus

from .exceptions import KVPocketError
from .results import OpResult
from .snapshot import Where, choice_labels, page_locations

if TYPE_CHECKING:
    from .kvcache import KVCache
    from .view import ManagerEntryPoints, ManagerView

EVENTS_KIND = "events"
END_KEY = "kvpocket_end"  # the end marker's key (`kvpocket.verify.traces.trace` reads it)

def error_category(exc: BaseException) -> str:
    """The model's category of a usage error (`KVPocketError.category`), else the class name."""
    category = getattr(exc, "category", None)
    return category if isinstance(category, str) else type(exc).__name__


# How the implementation names what the API table (`model.api.API`) names, where it differs:
# methods, and parameters. An action is wrapped on the sequence handle when it takes a
# "seq" (create, which makes the handle, on the manager), else on the manager.
METHOD_OF = {"fail_allocation": "inject_allocation_failure", "fail_copy": "inject_copy_failure"}
PARAM_OF = {"seq_id": "seq", "prompt_tokens": "prompt", "history_length": "history",
            "n": "slots"}
NOT_A_CALL = {"advance"}  # a stream's work completing: logged by `stream_completed`


class EventLog:
    """Writes the header at construction and one event per API call."""

    def __init__(self, sink: str | Path | TextIO, mgr: ManagerView,
                 observed: bool = True) -> None:
        if isinstance(sink, (str, Path)):
            Path(sink).parent.mkdir(parents=True, exist_ok=True)
            self._out: TextIO = Path(sink).open("w")  # noqa: SIM115 (closed by close())
            self._owned = True
        else:
            self._out, self._owned = sink, False
        self.observed = observed
        self._digest = hashlib.sha256()
        self._lines = -1  # event lines written (the header is not counted)
        self._ended = False
        self._mgr = mgr
        cfg = mgr.cfg
        self.write({"kvpocket_trace": 1, "kind": EVENTS_KIND, "config": cfg.to_json(),
                    "source": "kvpocket.impl", "policy": cfg.pocket.policy.value})

    def write(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, separators=(",", ":"))
        self._digest.update(line.encode("utf-8") + b"\n")
        self._lines += 1
        self._out.write(line + "\n")
        self._out.flush()

    def close(self) -> None:
        """Write the end marker (once), and close the file if the log opened it."""
        if not self._ended and not self._out.closed:
            self._ended = True
            self._out.write(json.dumps({END_KEY: self._lines, "digest": "sha256:"
                                        + self._digest.hexdigest()}, separators=(",", ":"))
                            + "\n")
            self._out.flush()
        if self._owned and not self._out.closed:
            self._out.close()

    # ---- the hooks (derived from the API table) ----------------------------------------
    def instrument_manager(self, mgr: ManagerEntryPoints) -> None:
        """Wrap the manager's API and environment entry points on this instance."""
        for action in API.values():
            if action.name in NOT_A_CALL:
                continue
            if action.name == "create" or "seq" not in action.param_names:
                self._wrap(mgr, action, None)

    def instrument_sequence(self, kv: KVCache) -> None:
        """Wrap one sequence handle's API methods on this instance."""
        for action in API.values():
            if action.name != "create" and "seq" in action.param_names:
                self._wrap(kv, action, kv.seq_id)

    def _wrap(self, target: Any, action: ApiAction, seq: int | None) -> None:
        """Replace `target`'s method for `action` by one that logs each call with the
        parameters in the table's names and order. A None argument for a table parameter
        the target also has as an attribute means "keep the current value" (resize)."""
        name = METHOD_OF.get(action.name, action.name)
        method = getattr(target, name)
        signature = inspect.signature(method)
        kinds = {p.name: p.kind for p in action.params}

        def logged(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            given: dict[str, Any] = {"seq": seq} if seq is not None else {}
            for arg, value in bound.arguments.items():
                if kinds.get(PARAM_OF.get(arg, arg)) == "tokens":
                    value = list(value)  # an iterator is read once: log and pass the list
                    bound.arguments[arg] = value
                given[PARAM_OF.get(arg, arg)] = value
            params = {p: getattr(target, p) if given[p] is None else given[p]
                      for p in action.param_names}
            return self.call(action.name, params,
                             params.get("seq"), lambda: method(*bound.args, **bound.kwargs))

        setattr(target, name, logged)

    def stream_completed(self, stream: int | str) -> None:
        """Record that a stream's outstanding work completed: a sequence id or "copy"."""
        self.write({"action": "advance", "params": {"stream": stream}, "choices": [],
                    "result": None})

    # ---- one call ----------------------------------------------------------------------
    def call(self, action: str, params: dict[str, Any], seq: int | None,
             fn: Callable[[], Any]) -> Any:
        mgr = self._mgr
        where = page_locations(mgr)
        mgr.transactions.reset_choices()  # a call rejected before it starts records nothing
        event: dict[str, Any] = {"action": action, "params": params}
        try:
            value = fn()
        except KVPocketError as exc:
            event["choices"] = self._labels(where)
            event["result"] = {"error": error_category(exc)}
            self.write(event)
            raise
        event["choices"] = self._labels(where)
        # A typed result (`ResizeResult`, ...) is logged in the format's bool form.
        event["result"] = bool(value) if isinstance(value, (bool, OpResult)) else None
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
