"""Trace-level minimisation (delta debugging) after Hypothesis has shrunk.

Hypothesis shrinks the rules it drew; a rule may expand into several trace
steps (a run of decode steps), and steps of one rule cannot be removed
separately. Traces carry absolute parameters, so dropping any step still
leaves a valid trace: this pass removes every step (and chunk of steps) whose
removal keeps the same failure, and stops at a 1-minimal trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from kvpocket.verify.conformance.replay import ReplayResult, replay
from kvpocket.verify.traces.trace import Trace


def signature(result: ReplayResult) -> tuple[str, str]:
    """What makes two failures "the same": the kind and its first report line after the
    step header (the invariant or the kind of difference)."""
    lines = result.report.splitlines()
    detail = lines[2].split(":")[0] if result.kind.endswith("violated") and len(lines) > 2 else ""
    return result.kind, detail


def minimize(trace: Trace, budget_replays: int = 400,
             run: Callable[[Trace], ReplayResult] = replay) -> Trace:
    first = run(trace)
    if first.ok:
        return trace
    want = signature(first)
    steps = trace.steps[: (first.failed_step or len(trace.steps)) + 1]
    replays = 0

    def still_fails(candidate: list) -> bool:  # type: ignore[type-arg]
        nonlocal replays
        replays += 1
        r = run(replace(trace, steps=candidate))
        return not r.ok and signature(r) == want

    chunk = max(1, len(steps) // 2)
    while chunk >= 1 and replays < budget_replays:
        i, removed = 0, False
        while i < len(steps) and replays < budget_replays:
            candidate = steps[:i] + steps[i + chunk:]
            if candidate and still_fails(candidate):
                steps, removed = candidate, True
            else:
                i += chunk
        if not removed:
            chunk //= 2
    return replace(trace, steps=steps)
