"""Trace files (JSON lines) and their replay on the executable model.

Line 1 is a header `{"kvpocket_trace": 1, "config": <KVConfig.to_json()>, "source": ...,
"policy": ...}`; every further line is one step `{"action": name, "params": {...},
"layer": "api"|"page", "choices": [[kind, value], ...]}`. API-level steps replay
through `Model.call` with a `ScriptedChooser` holding the recorded choices;
page-level steps through `Model.apply`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpocket.model.config import ConfigError, KVConfig
from kvpocket.model.executor import ScriptedChooser
from kvpocket.model.machine import Model

TRACE_VERSION = 1


class TraceError(ValueError):
    """A malformed trace file; the message names the line."""


@dataclass
class TraceStep:
    action: str
    params: dict[str, Any]
    layer: str = "api"
    choices: list[tuple[str, int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "params": self.params, "layer": self.layer,
                "choices": [[k, v] for k, v in self.choices]}


@dataclass
class Trace:
    config: KVConfig
    steps: list[TraceStep]
    source: str = "bmc"
    policy: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def write_trace(path: str | Path, trace: Trace) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    header = {"kvpocket_trace": TRACE_VERSION, "config": trace.config.to_json(),
              "source": trace.source, "policy": trace.policy or trace.config.pocket.policy.value,
              **trace.extra}
    lines = [json.dumps(header)] + [json.dumps(s.to_json()) for s in trace.steps]
    p.write_text("\n".join(lines) + "\n")
    return p


def read_trace(path: str | Path) -> Trace:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TraceError(f"{p}: cannot read: {exc.strerror}") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise TraceError(f"{p}: empty trace (expected a header line)")
    n, first = lines[0]
    header = _obj(p, n, first)
    if header.get("kvpocket_trace") != TRACE_VERSION:
        raise TraceError(f"{p}:{n}: not a kvpocket trace header "
                         f"(expected \"kvpocket_trace\": {TRACE_VERSION})")
    try:
        cfg = KVConfig.from_json(header.get("config"))
    except ConfigError as exc:
        raise TraceError(f"{p}:{n}: bad config: {exc}") from None
    steps = [_step(p, n, line) for n, line in lines[1:]]
    extra = {k: v for k, v in header.items()
             if k not in ("kvpocket_trace", "config", "source", "policy")}
    return Trace(cfg, steps, str(header.get("source", "")), str(header.get("policy", "")), extra)


def _obj(p: Path, n: int, line: str) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{p}:{n}: invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(data, dict):
        raise TraceError(f"{p}:{n}: expected a JSON object, got {type(data).__name__}")
    return data


def _step(p: Path, n: int, line: str) -> TraceStep:
    data = _obj(p, n, line)
    for key in ("action", "params"):
        if key not in data:
            raise TraceError(f"{p}:{n}: missing field '{key}'")
    action, params = data["action"], data["params"]
    layer = data.get("layer", "api")
    choices = data.get("choices", [])
    if not isinstance(action, str):
        raise TraceError(f"{p}:{n}: 'action' must be a string")
    if not isinstance(params, dict):
        raise TraceError(f"{p}:{n}: 'params' must be an object")
    if layer not in ("api", "page"):
        raise TraceError(f"{p}:{n}: 'layer' must be \"api\" or \"page\", got {layer!r}")
    if not isinstance(choices, list) or not all(
        isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) and isinstance(c[1], int)
        for c in choices
    ):
        raise TraceError(f"{p}:{n}: 'choices' must be a list of [kind, integer] pairs")
    return TraceStep(action, params, layer, [(c[0], c[1]) for c in choices])


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
