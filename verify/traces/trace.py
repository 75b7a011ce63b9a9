"""Trace files: one action per line, replayable by the model and the lockstep checker.

Line 1 is a header: {"kvpocket_trace": 1, "config": {...}, "source": "fuzz"|"bmc"|...,
"policy": ..., "backend": "numpy", "eager": false}. Every other line is one action:
{"action": NAME, "params": {...}, "layer": "api"|"page", "choices": [[kind, value], ...]}.
API-level actions are those of the API table (`model.api.API`, in the lockstep's form:
`adapter.alphabet()`); page-level ones are the model's page actions. Choices are the
model's (BMC counterexamples record them); fuzz traces leave them out, since the
implementation makes its own.
Malformed files raise `TraceError` naming the file and line.

Event logs (`"kind": "events"` in the header) extend this format for integrators: the
same header and action lines, with the manager's own sequence ids, `commit` carrying
its `"tokens"`, choices as labels, and optional `"result"` and `"observed"` fields. They
are parsed by `parse_events`/`read_events` and checked by `tracecheck.py`; the format is
documented in docs/adapter-guide.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpocket.model.api import API
from kvpocket.model.config import ConfigError, KVConfig
from kvpocket.model.executor import RecordedChooser
from kvpocket.model.machine import Model
from kvpocket.verify.traces.alphabet import check_params

TRACE_VERSION = 1
EVENTS_KIND = "events"  # header "kind" of an event log (see `parse_events`)


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
    header, cfg = _header(rows[0], name)
    if header.get("kind") == EVENTS_KIND:
        raise TraceError(f"{name}:{rows[0][0]}: this is an event log; check it with "
                         "`kvpocket trace check`")
    steps = []
    for lineno, text in rows[1:]:
        obj = _step_object(lineno, text, name)
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
    return parse_trace(_read_lines(path, "trace"), str(path))


def _read_lines(path: Path, what: str) -> list[str]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: the {what} is not UTF-8 text") from None
    if text and not text.endswith("\n"):
        # A writer that died mid-line leaves a truncated last line: say so precisely.
        last = text.rsplit("\n", 1)[-1]
        try:
            json.loads(last)
        except json.JSONDecodeError:
            n = text.count("\n") + 1
            raise TraceError(f"{path}:{n}: the {what} is truncated (last line is incomplete)"
                             ) from None
    return text.splitlines()


def _header(row: tuple[int, str], name: str) -> tuple[dict[str, Any], KVConfig]:
    header = _json(row, name)
    if not isinstance(header, dict) or header.get("kvpocket_trace") != TRACE_VERSION:
        raise TraceError(f"{name}:{row[0]}: not a kvpocket trace header "
                         f"(expected {{\"kvpocket_trace\": {TRACE_VERSION}, \"config\": ...}})")
    try:
        cfg = KVConfig.from_json(header.get("config"))
    except ConfigError as exc:
        raise TraceError(f"{name}:{row[0]}: {exc}") from None
    return header, cfg


def _json(row: tuple[int, str], name: str) -> Any:
    lineno, text = row
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{name}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})"
                         ) from None


def _step_object(lineno: int, text: str, name: str) -> dict[str, Any]:
    """One line of a trace or event log: a JSON object with `action` and `params`."""
    obj = _json((lineno, text), name)
    if not isinstance(obj, dict):
        raise TraceError(f"{name}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    for key in ("action", "params"):
        if key not in obj:
            raise TraceError(f"{name}:{lineno}: missing field '{key}'")
    return obj


def run_api_step(model: Model, step: TraceStep) -> RecordedChooser:
    """Run one API-level step on the model with the step's recorded choices scripted;
    returns the chooser, whose `left()` holds any recorded choice left unused."""
    script: dict[str, list[object]] = {}
    for kind, value in step.choices:
        script.setdefault(kind, []).append(int(value))
    chooser = RecordedChooser(script, by="candidate")
    model.chooser = chooser
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in step.params.items()}
    model.call(step.action, params)
    return chooser


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
            chooser = run_api_step(model, step)
            left = chooser.left()
            if left:
                raise TraceError(f"step {i} ({step.action}): recorded choices not used: {left}")
            bad = model.violations("api")
        if bad:
            return i, [inv.name for inv in bad]
    return -1, []


# ---- event logs --------------------------------------------------------------------------

CHOICE_KINDS = ("slot", "victim", "pocket")
OBSERVED_KEYS = ("free", "status", "index", "pocket")


def event_params() -> dict[str, tuple[str, ...]]:
    """Each action's parameters in an event log: the API table's own."""
    return {name: a.param_names for name, a in API.items()}


NO_RESULT = object()  # an event that does not report its result


@dataclass
class Event:
    """One API call of an integrator's manager, as its event log recorded it."""

    line: int
    action: str
    params: dict[str, Any]
    choices: list[tuple[str, Any]] | None = None  # None: not recorded (the model picks)
    result: Any = NO_RESULT  # True/False/None, or {"error": category}
    observed: dict[str, Any] | None = None

    def describe(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.action}({shown})"


@dataclass
class ParsedEventLog:
    config: KVConfig
    events: list[Event]
    source: str = "unknown"
    policy: str = ""
    header_line: int = 1


def parse_events(lines: Iterable[str], name: str = "event log") -> ParsedEventLog:
    """Parse an event log; `TraceError` names the line of the first malformed event."""
    rows = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    if not rows:
        raise TraceError(f"{name}: the event log is empty (expected a header line)")
    header, cfg = _header(rows[0], name)
    events = [_event(lineno, text, name) for lineno, text in rows[1:]]
    return ParsedEventLog(cfg, events, str(header.get("source", "unknown")),
                    str(header.get("policy", "")), rows[0][0])


def read_events(path: str | Path) -> ParsedEventLog:
    path = Path(path)
    return parse_events(_read_lines(path, "event log"), str(path))


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _event(lineno: int, text: str, name: str) -> Event:
    where = f"{name}:{lineno}"
    obj = _step_object(lineno, text, name)
    action, params = obj["action"], obj["params"]
    if obj.get("layer", "api") != "api":
        raise TraceError(f"{where}: event logs hold API events only (layer \"api\")")
    known = event_params()
    if action not in known:
        raise TraceError(f"{where}: unknown action {action!r}; expected one of "
                         + ", ".join(known))
    if not isinstance(params, dict):
        raise TraceError(f"{where}: \"params\" must be an object")
    want = set(known[action])
    if set(params) != want:
        hint = " (event logs carry the committed \"tokens\", not \"n\")" if "n" in params else ""
        raise TraceError(f"{where}: action '{action}' takes parameters {sorted(want)}, "
                         f"got {sorted(params)}{hint}")
    for k, v in params.items():
        if k in ("prompt", "tokens"):
            if not isinstance(v, list) or not all(_is_int(x) for x in v):
                raise TraceError(f"{where}: parameter '{k}' must be a list of ints")
        elif k == "stream" and v == "copy":
            continue
        elif not _is_int(v):
            raise TraceError(f"{where}: parameter '{k}' must be an int, got {v!r}")
    ev = Event(lineno, action, params)
    if "choices" in obj:
        ev.choices = _choices(obj["choices"], where)
    if "result" in obj:
        r = obj["result"]
        ok = r is None or isinstance(r, bool) or (
            isinstance(r, dict) and set(r) == {"error"} and isinstance(r["error"], str))
        if not ok:
            raise TraceError(f"{where}: \"result\" must be true, false, null or "
                             f"{{\"error\": CATEGORY}}, got {r!r}")
        ev.result = r
    if "observed" in obj:
        ev.observed = _observed(obj["observed"], where)
    return ev


def _is_location(v: object) -> bool:
    return isinstance(v, list) and len(v) == 3 and all(_is_int(x) for x in v)


def _choices(raw: object, where: str) -> list[tuple[str, Any]]:
    if not isinstance(raw, list):
        raise TraceError(f"{where}: \"choices\" must be a list of [kind, label] pairs")
    out: list[tuple[str, Any]] = []
    for c in raw:
        if not (isinstance(c, list) and len(c) == 2 and c[0] in CHOICE_KINDS):
            raise TraceError(f"{where}: bad choice {c!r}: expected [kind, label] with kind one "
                             f"of {', '.join(CHOICE_KINDS)}")
        kind, label = c
        if kind == "slot" and not _is_int(label):
            raise TraceError(f"{where}: a slot choice's label is a slot id, got {label!r}")
        if kind != "slot" and not _is_location(label):
            raise TraceError(f"{where}: a {kind} choice's label is [level, pool_group, slot], "
                             f"got {label!r}")
        out.append((kind, label if kind == "slot" else tuple(label)))
    return out


def _observed(raw: object, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: \"observed\" must be an object")
    unknown = sorted(set(raw) - set(OBSERVED_KEYS))
    if unknown:
        raise TraceError(f"{where}: unknown observed field(s) {unknown}; expected "
                         + ", ".join(OBSERVED_KEYS))
    free = raw.get("free", [])
    if not isinstance(free, list) or not all(_is_location(x) for x in free):
        raise TraceError(f"{where}: observed \"free\" must be a list of "
                         "[level, pool_group, free_slots]")
    if "status" in raw and not isinstance(raw["status"], str):
        raise TraceError(f"{where}: observed \"status\" must be a string")
    index = raw.get("index", [])
    if not isinstance(index, list) or not all(
            isinstance(r, list) and all(_is_int(x) for x in r) for r in index):
        raise TraceError(f"{where}: observed \"index\" must be a list (per life cycle) of "
                         "lists of ints")
    pocket = raw.get("pocket", [])
    if not isinstance(pocket, list) or not all(
            isinstance(r, list) and all(_is_location(x) for x in r) for r in pocket):
        raise TraceError(f"{where}: observed \"pocket\" must be a list (per life cycle) of "
                         "[level, pool_group, slot] lists")
    return dict(raw)
