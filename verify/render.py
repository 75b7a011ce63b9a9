"""Terminal rendering with rich: tables for the spec and for reports."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def console() -> Console:
    return Console(highlight=False, soft_wrap=False)


def print_spec(data: dict[str, Any]) -> None:
    out = console()
    actions = Table(title="Actions", show_lines=False)
    for col in ("layer", "action", "parameters", "guard / precondition"):
        actions.add_column(col, overflow="fold")
    for a in data["actions"]:
        actions.add_row(a["layer"], a["name"], ", ".join(a["parameters"]), a["guard"])
    out.print(actions)
    invariants = Table(title="Invariants")
    for col in ("invariant", "scope", "kind", "statement"):
        invariants.add_column(col, overflow="fold")
    for i in data["invariants"]:
        invariants.add_row(i["name"], i["scope"], i["kind"], i["statement"])
    out.print(invariants)
