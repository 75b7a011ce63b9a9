"""The event-log line as a closed msgspec schema, derived from the API table.

`trace.py` states what an event line may hold (its keys, `check_params`, `_event`'s
choices, result and observed checks, the 64-bit rule of `_check_ints`). This module is a
second reading of those statements for speed: one typed decoder per log whose structs
are built from `model.api.API` (a tagged union on `"action"`, one closed struct of
parameters per action, each parameter typed by its kind), so one C-level pass parses,
types and bounds a whole line. It decides nothing on its own: a line it accepts is an
`Event` equal to what the reference reading builds, and a line it refuses goes to the
reference reading, which raises the message naming the line and the field (or takes the line,
where the schema was the stricter: the reference is the rule). `tests/traces/test_event_schema.py`
checks both readings agree, line by line, on every log the repository holds and on a
corpus of malformed lines.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec

from kvpocket.model.api import CLASH_LABELS, Param
from kvpocket.model.choices import CLASH, HIT, POCKET, REUSE, SLOT, VICTIM

# every integer in a log is a signed 64-bit value (trace.MAX_ABS_INT)
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
SeqId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]  # a manager's sequence id (`_event`)
Location = Annotated[list[Int64], msgspec.Meta(min_length=3, max_length=3)]
_UNSET = msgspec.UNSET
LOCATION_KINDS = frozenset({VICTIM, POCKET, HIT})  # labels [level, pool_group, slot]
INT_KINDS = frozenset({SLOT, REUSE})  # labels that are ints
CLASH_SET = frozenset(CLASH_LABELS)


def _param_type(p: Param) -> Any:
    """A parameter's type in an event log (the API form: `alphabet.check_params`)."""
    if p.kind == "tokens":
        return list[Int64]
    if p.kind == "stream":
        return Int64 | Literal["copy"]
    if p.name == "seq":
        return SeqId
    return Int64


class Observed(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    free: list[Location] | msgspec.UnsetType = _UNSET
    status: Literal["SUSPENDED", "ACTIVE", "CLOSED"] | msgspec.UnsetType = _UNSET
    index: list[list[Int64]] | msgspec.UnsetType = _UNSET
    pocket: list[list[Location]] | msgspec.UnsetType = _UNSET


def _line_struct(name: str, params: tuple[Param, ...], categories: tuple[str, ...]) -> type:
    """The closed struct of one action's event line, tagged by its "action"."""
    fields: list[tuple[str, Any]] = [(p.name, _param_type(p)) for p in params]
    params_type = msgspec.defstruct(f"{name}_params", fields, forbid_unknown_fields=True)
    error = msgspec.defstruct(f"{name}_error", [("error", Literal[categories])],
                              forbid_unknown_fields=True)
    label = Int64 | str | Location  # checked against the choice's kind after decoding
    return msgspec.defstruct(
        f"{name}_line",
        [("params", params_type),
         ("layer", Literal["api"], "api"),
         ("choices", list[tuple[str, label]] | msgspec.UnsetType, _UNSET),
         ("result", None | bool | error | msgspec.UnsetType, _UNSET),
         ("observed", Observed | msgspec.UnsetType, _UNSET)],
        tag_field="action", tag=name, forbid_unknown_fields=True)


class EventDecoder:
    """Decodes an event line to (action, params, choices, result, observed) as
    `trace._event` would build them, or None where the schema refuses the line."""

    def __init__(self, table: dict[str, tuple[Param, ...]], categories: tuple[str, ...]
                 ) -> None:
        self._types = [_line_struct(n, params, categories) for n, params in table.items()]
        self._decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
            Union[tuple(self._types)])  # noqa: UP007 (a union of types built at run time)

    def decode(self, raw: bytes) -> tuple[str, dict[str, Any], list[tuple[str, Any]] | None,
                                          Any, dict[str, Any] | None] | None:
        try:
            line = self._decoder.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None
        choices: list[tuple[str, Any]] | None = None
        if line.choices is not _UNSET:
            choices = []
            for kind, label in line.choices:
                t = type(label)
                if kind in INT_KINDS and t is int:
                    choices.append((kind, label))
                elif kind in LOCATION_KINDS and t is list:
                    choices.append((kind, tuple(label)))
                elif kind == CLASH and t is str and label in CLASH_SET:
                    choices.append((kind, label))
                else:
                    return None  # the reference names what is wrong with it
        result = line.result
        if result is not _UNSET and result is not None and type(result) is not bool:
            result = {"error": result.error}
        observed = None
        if line.observed is not _UNSET:
            observed = msgspec.structs.asdict(line.observed)
            observed = {k: v for k, v in observed.items() if v is not _UNSET}
        return (type(line).__struct_config__.tag, msgspec.structs.asdict(line.params),
                choices, result, observed)


UNSET = _UNSET  # a field the line does not hold
