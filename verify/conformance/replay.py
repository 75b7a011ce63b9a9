"""Replay a trace (see `trace.py`) against the implementation and the model in lockstep.

Recorded slot choices are forced on the implementation (so a BMC counterexample takes
the same slots) and the model follows the implementation's choices as in any lockstep
step. Page-layer traces replay on the model alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvpocket.model.errors import ModelError
from kvpocket.model.machine import Model
from kvpocket.model.overrides import Override, active, check_override
from kvpocket.verify import patching
from kvpocket.verify.conformance.lockstep import Divergence, Lockstep
from kvpocket.verify.traces.trace import Trace, TraceError


@dataclass
class ReplayResult:
    ok: bool
    steps_run: int
    failed_step: int | None = None
    kind: str = ""
    report: str = ""


class _ForcedSlots:
    """Makes the implementation take the trace's recorded slots, in order.

    A recorded slot the implementation's allocator cannot hand out (the model may pick
    any free slot; the allocator issues never-used ids in ascending order) is skipped:
    the implementation picks as usual and the model follows it, as in any lockstep step.
    """

    def __init__(self, slots: list[int], fallback: Any) -> None:
        self.slots = slots
        self.fallback = fallback

    def choose(self, level: int, pool_group: int, candidates: Iterator[int]) -> int:
        legal = list(candidates)
        if self.slots:
            want = self.slots.pop(0)
            if want in legal:
                return want
        return int(self.fallback.choose(level, pool_group, iter(legal)))


def replay(trace: Trace, backend: str | None = None) -> ReplayResult:
    """Run a trace; the first divergence or violated invariant ends it. A trace recorded
    with seeded bugs switched on (its header's `seeded_bugs`) replays only with the same
    bugs on (`kvpocket replay` switches them on; so does its pytest reproducer): otherwise
    TraceError, never a replay of the correct implementation that passes. A trace whose
    header says `"event_log": true` (its campaign example checked the event log) has the
    implementation's event log checked at every step too; one whose header says
    `"race_check": true` or `"device_mirror": true` runs the simulator in that mode."""
    missing = patching.missing_bugs(trace.extra)
    if missing:
        raise TraceError(f"the trace was recorded with seeded bug(s) {', '.join(missing)} "
                         "switched on; replay it with `kvpocket replay`, or inside "
                         "kvpocket.verify.quality.patches.switched_on(...)")
    spec_mutant = recorded_overrides(trace.extra)
    if spec_mutant and any(active().get(k) != v for k, v in spec_mutant.items()):
        raise TraceError("the trace was recorded with the spec's conditions overridden "
                         f"({', '.join(spec_mutant)}); replay it with `kvpocket replay`, or "
                         "inside kvpocket.model.overrides.overriding(...)")
    if any(s.layer == "page" for s in trace.steps):
        return _replay_page_layer(trace)
    ls = Lockstep(trace.config, backend=backend or trace.backend, eager=trace.eager,
                  check_event_log=bool(trace.extra.get("event_log", False)),
                  race_check=bool(trace.extra.get("race_check", False)),
                  device_mirror=bool(trace.extra.get("device_mirror", False)))
    default_policy = ls.impl.slot_policy
    for i, step in enumerate(trace.steps):
        forced = [int(v) for k, v in step.choices if k == "slot"]
        ls.impl.slot_policy = _ForcedSlots(forced, default_policy) if forced else default_policy
        try:
            ls.step(step.action, step.params)
        except Divergence as exc:
            return ReplayResult(False, i + 1, i, exc.kind, str(exc))
    try:
        ls.finish()
    except Divergence as exc:
        return ReplayResult(False, len(trace.steps), len(trace.steps), exc.kind, str(exc))
    return ReplayResult(True, len(trace.steps))


OVERRIDES_KEY = "model_overrides"  # the trace header field of a spec mutant's overrides


def recorded_overrides(extra: dict[str, Any]) -> dict[str, Override]:
    """The spec's labelled conditions a trace was recorded with overridden (a spec mutant,
    `kvpocket.model.overrides`); ValueError naming the field if malformed."""
    raw = extra.get(OVERRIDES_KEY, {})
    if not isinstance(raw, dict):
        raise ValueError(f"header field {OVERRIDES_KEY!r}: expected an object of "
                         f"label -> [kind, value], got {raw!r}")
    try:
        return {str(k): check_override(str(k), v) for k, v in raw.items()}
    except ValueError as exc:
        raise ValueError(f"header field {OVERRIDES_KEY!r}: {exc}") from None


def _replay_page_layer(trace: Trace) -> ReplayResult:
    m = Model(trace.config)
    for i, step in enumerate(trace.steps):
        try:
            if step.layer == "page":
                m.apply(step.action, **{k: int(v) for k, v in step.params.items()})
            else:
                m.call(step.action, step.params)
        except ModelError as exc:
            return ReplayResult(False, i + 1, i, "guard", str(exc))
        bad = m.violations("step")
        if bad:
            names = "; ".join(f"{b.name}: {b.statement}" for b in bad)
            return ReplayResult(False, i + 1, i, "model invariant violated",
                                f"step {i}: {step.action}({step.params}) violates {names}")
    return ReplayResult(True, len(trace.steps))
