"""The adapter layer between model actions and implementation calls.

One entry per action of the lockstep alphabet. The model and the
implementation speak slightly different languages (sequence slots vs ids,
token lists vs "the next n tokens", exceptions vs categories); every
translation lives here and nowhere else.

Results: the model reports a capacity failure as False. The implementation's calls that
can run out of pages return a typed result (`kvpocket.impl.results.OpResult`, truthy iff
it succeeded); a plain bool and the exception form (`OpResult.raise_for_failure`, a
`CapacityFailure` raised) are compared the same way, as their bool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kvpocket.impl import exceptions as impl_errors
from kvpocket.impl.kvcache import KVCache
from kvpocket.impl.manager import KVCacheManager
from kvpocket.impl.results import OpResult
from kvpocket.model.api import API
from kvpocket.model.machine import RunResult


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
    """An implementation call's outcome: a usage error's category; a capacity failure's
    bool in any of its three forms (a bool, a typed result, a raised `CapacityFailure`,
    each with the failure named in `detail`); None for calls that return nothing."""
    try:
        value = call()
    except impl_errors.CapacityFailure as exc:  # the exception form of a failed result
        return Outcome("ok", False, f"{type(exc).__name__}: {exc}")
    except impl_errors.KVPocketError as exc:
        if exc.category is None:  # not a usage error: the implementation broke
            raise
        return Outcome("error", exc.category, str(exc))
    if isinstance(value, OpResult):
        return Outcome("ok", value.ok, "" if value.ok else f"{value.error}: {value.reason}")
    return Outcome("ok", value if isinstance(value, bool) else None)


def outcome_of(result: RunResult) -> Outcome:
    if result.error is not None:
        return Outcome("error", result.error.category, str(result.error))
    return Outcome("ok", result.value)


# ---- the implementation's side of each action --------------------------------------------


class Harness(Protocol):
    """What an implementation call needs from the lockstep: the manager, the map from
    model sequence slots to implementation ids, and the harness's token streams."""

    impl: KVCacheManager

    def handle(self, seq: int) -> KVCache: ...
    def keep(self, seq: int, kv: KVCache) -> None: ...
    def open_seq(self, seq: int, prompt: list[int]) -> int: ...
    def tokens(self, seq: int, start: int, n: int) -> list[int]: ...
    def run_stream(self, stream: int) -> None: ...


ImplCall = Callable[[Harness, dict[str, Any]], Any]


def _create(h: Harness, p: dict[str, Any]) -> Any:
    # The model's sequence slots are 0..num_sequences-1; a slot outside names no sequence
    # the harness could open (the manager itself takes any id).
    if not 0 <= p["seq"] < h.impl.cfg.num_sequences:
        raise impl_errors.UnknownSequenceError(f"create: no sequence slot {p['seq']}")
    kv = h.impl.create(h.open_seq(p["seq"], list(p["prompt"])), list(p["prompt"]))
    h.keep(p["seq"], kv)  # as an integrator keeps it (the manager forgets old closed ones)
    return kv


def _commit(h: Harness, p: dict[str, Any]) -> Any:
    kv = h.handle(p["seq"])
    return kv.commit(h.tokens(p["seq"], kv.num_committed_tokens, p["n"]))


def _advance(h: Harness, p: dict[str, Any]) -> Any:
    # Not a call of the implementation's API: the harness runs a stream's queued work. A
    # stream that does not exist is the same usage error as in the model.
    if not 0 <= p["stream"] <= h.impl.cfg.num_sequences:
        raise impl_errors.UnknownSequenceError(f"advance: no stream {p['stream']}")
    h.run_stream(p["stream"])


# Actions whose implementation call is not the default one: a sequence action is the
# method of the same name on the sequence's handle, with the other parameters in table
# order; an environment action is the manager's method of the same name.
IMPL_CALLS: dict[str, ImplCall] = {
    "create": _create,
    "commit": _commit,
    "advance": _advance,
    "fail_allocation": lambda h, p: h.impl.inject_allocation_failure(),
    "fail_copy": lambda h, p: h.impl.inject_copy_failure(),
}


def call_impl(h: Harness, action: str, params: dict[str, Any]) -> Any:
    special = IMPL_CALLS.get(action)
    if special is not None:
        return special(h, params)
    spec = API[action]
    rest = [params[p.name] for p in spec.params if p.name != "seq"]
    if any(p.name == "seq" for p in spec.params):
        return getattr(h.handle(params["seq"]), action)(*rest)
    return getattr(h.impl, action)(*rest)


def model_params(h: Harness, action: str, params: dict[str, Any], committed: int
                 ) -> dict[str, Any]:
    """A trace step's parameters in the API form (`committed`: the sequence's committed
    token count before the step, where commit's next tokens start)."""
    if action == "commit":
        return {"seq": params["seq"], "tokens": h.tokens(params["seq"], committed, params["n"])}
    return params
