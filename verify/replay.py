"""Replay a trace (JSON lines) against the implementation and the model in lockstep.

Line 1 is a header: {"kvpocket_trace": 1, "config": {...}, "source": ..., "backend":
"numpy", "eager": false}. Every other line is one action: {"action": NAME,
"params": {...}, "layer": "api", "choices": [[kind, value], ...]}. Choices are
optional; recorded slot choices are forced on the implementation (so a BMC
counterexample takes the same slots), and the model follows the implementation.
Page-layer lines ("layer": "page") replay on the model alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpocket.model.config import ConfigError, KVConfig
from kvpocket.model.errors import ModelError
from kvpocket.model.machine import Model

from .adapter import check_params
from .lockstep import Divergence, Lockstep

TRACE_VERSION = 1


class TraceError(ValueError):
    """A malformed trace: the message names the line and what is wrong."""


@dataclass
class TraceStep:
    action: str
    params: dict[str, Any]
    layer: str = "api"
    choices: list[tuple[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "params": self.params, "layer": self.layer,
                "choices": [list(c) for c in self.choices]}


@dataclass
class Trace:
    config: KVConfig
    steps: list[TraceStep]
    source: str = "fuzz"
    backend: str = "numpy"
    eager: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def lines(self) -> Iterator[str]:
        header = {"kvpocket_trace": TRACE_VERSION, "config": self.config.to_json(),
                  "source": self.source, "backend": self.backend, "eager": self.eager,
                  **self.extra}
        yield json.dumps(header)
        for s in self.steps:
            yield json.dumps(s.to_json())

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(self.lines()) + "\n")


def parse_trace(lines: Iterable[str], name: str = "trace") -> Trace:
    rows = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    if not rows:
        raise TraceError(f"{name}: the trace is empty (expected a header line)")
    header = _json(rows[0], name)
    if not isinstance(header, dict) or header.get("kvpocket_trace") != TRACE_VERSION:
        raise TraceError(f"{name}:{rows[0][0]}: not a kvpocket trace header "
                         f"(expected {{\"kvpocket_trace\": {TRACE_VERSION}, \"config\": ...}})")
    try:
        cfg = KVConfig.from_json(header.get("config"))
    except ConfigError as exc:
        raise TraceError(f"{name}:{rows[0][0]}: {exc}") from None
    steps = []
    for lineno, text in rows[1:]:
        obj = _json((lineno, text), name)
        if not isinstance(obj, dict) or "action" not in obj:
            raise TraceError(f"{name}:{lineno}: expected an object with \"action\" and \"params\"")
        layer = obj.get("layer", "api")
        params = obj.get("params", {})
        if layer not in ("api", "page"):
            raise TraceError(f"{name}:{lineno}: layer must be \"api\" or \"page\", got {layer!r}")
        if not isinstance(params, dict):
            raise TraceError(f"{name}:{lineno}: \"params\" must be an object")
        if layer == "api":
            try:
                check_params(obj["action"], params)
            except ValueError as exc:
                raise TraceError(f"{name}:{lineno}: {exc}") from None
        choices = obj.get("choices", [])
        if not isinstance(choices, list) or not all(
                isinstance(c, list) and len(c) == 2 for c in choices):
            raise TraceError(f"{name}:{lineno}: \"choices\" must be a list of [kind, value] pairs")
        steps.append(TraceStep(obj["action"], params, layer, [(c[0], c[1]) for c in choices]))
    known = {"kvpocket_trace", "config", "source", "backend", "eager"}
    return Trace(cfg, steps, str(header.get("source", "unknown")),
                 str(header.get("backend", "numpy")), bool(header.get("eager", False)),
                 {k: v for k, v in header.items() if k not in known})


def read_trace(path: Path) -> Trace:
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace ({exc.strerror})") from None
    if text and not text.endswith("\n"):
        # A writer that died mid-line leaves a truncated last line: say so precisely.
        last = text.rsplit("\n", 1)[-1]
        try:
            json.loads(last)
        except json.JSONDecodeError:
            n = text.count("\n") + 1
            raise TraceError(f"{path}:{n}: the trace is truncated (last line is incomplete)"
                             ) from None
    return parse_trace(text.splitlines(), str(path))


def _json(row: tuple[int, str], name: str) -> Any:
    lineno, text = row
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{name}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})"
                         ) from None


@dataclass
class ReplayResult:
    ok: bool
    steps_run: int
    failed_step: int | None = None
    kind: str = ""
    report: str = ""


class _ForcedSlots:
    """Makes the implementation take the trace's recorded slots, in order."""

    def __init__(self, slots: list[int], fallback: Any) -> None:
        self.slots = slots
        self.fallback = fallback

    def choose(self, level: int, pool_group: int, candidates: Iterator[int]) -> int:
        if self.slots:
            return self.slots.pop(0)
        return int(self.fallback.choose(level, pool_group, candidates))


def replay(trace: Trace, backend: str | None = None) -> ReplayResult:
    """Run a trace; the first divergence or violated invariant ends it."""
    if any(s.layer == "page" for s in trace.steps):
        return _replay_page_layer(trace)
    ls = Lockstep(trace.config, backend=backend or trace.backend, eager=trace.eager)
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
