"""Trace files: one action per line, replayable by the model and the lockstep checker.

Line 1 is a header: {"kvpocket_trace": 1, "config": {...}, "source": "fuzz"|"bmc"|...,
"policy": ..., "backend": "numpy", "eager": false}. Every other line is one action:
{"action": NAME, "params": {...}, "layer": "api"|"page", "choices": [[kind, value], ...]}.
API-level actions are those of the lockstep alphabet (`adapter.ALPHABET`); page-level
ones are the model's page actions. Choices are the model's (BMC counterexamples record
them); fuzz traces leave them out, since the implementation makes its own.
Malformed files raise `TraceError` naming the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpocket.model.config import ConfigError, KVConfig
from kvpocket.model.executor import ScriptedChooser
from kvpocket.model.machine import Model

from .adapter import check_params

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
    policy: str = ""  # informational; the config's pocket policy is what replays
    extra: dict[str, Any] = field(default_factory=dict)
    backend: str = "numpy"
    eager: bool = False  # the stream simulator runs work only when a step advances it

    def lines(self) -> Iterator[str]:
        header = {"kvpocket_trace": TRACE_VERSION, "config": self.config.to_json(),
                  "source": self.source, "policy": self.policy or self.config.pocket.policy.value,
                  "backend": self.backend, "eager": self.eager, **self.extra}
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
        if not isinstance(obj, dict):
            raise TraceError(f"{name}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        for key in ("action", "params"):
            if key not in obj:
                raise TraceError(f"{name}:{lineno}: missing field '{key}'")
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
    known = {"kvpocket_trace", "config", "source", "policy", "backend", "eager"}
    return Trace(cfg, steps, str(header.get("source", "unknown")), str(header.get("policy", "")),
                 {k: v for k, v in header.items() if k not in known},
                 str(header.get("backend", "numpy")), bool(header.get("eager", False)))


def write_trace(path: str | Path, trace: Trace) -> Path:
    p = Path(path)
    trace.write(p)
    return p


def read_trace(path: str | Path) -> Trace:
    path = Path(path)
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
        raise TraceError(f"{name}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})"
                         ) from None


def replay_on_model(trace: Trace) -> tuple[int, list[str]]:
    """Replay a trace on `Model`; (index of the first step after which an invariant is
    violated, their names), or (-1, []) when every step keeps every invariant.

    API steps are checked against all invariants, page steps against the step-scope ones.
    A recorded choice the model rejects raises `ChoiceRejected`; a page step whose guard
    is false raises `GuardViolation`.
    """
    model = Model(trace.config)
    for i, step in enumerate(trace.steps):
        if step.layer == "page":
            model.apply(step.action, **step.params)
            bad = model.violations("step")
        else:
            script: dict[str, list[int]] = {}
            for kind, value in step.choices:
                script.setdefault(kind, []).append(value)
            chooser = ScriptedChooser(script)
            model.chooser = chooser
            params = dict(step.params)
            for key in ("prompt", "tokens"):
                if isinstance(params.get(key), list):
                    params[key] = tuple(params[key])
            model.call(step.action, params)
            left = {k: v for k, v in chooser.script.items() if v}
            if left:
                raise TraceError(f"step {i} ({step.action}): recorded choices not used: {left}")
            bad = model.violations("api")
        if bad:
            return i, [inv.name for inv in bad]
    return -1, []
