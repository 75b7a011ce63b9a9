"""Terminal rendering with rich: tables for the spec and for reports."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from kvpocket.verify.conformance.guards import PREFIX as GUARD_PREFIX
from kvpocket.verify.conformance.lockstep import CHECKS
from kvpocket.verify.terminal import Progress, console


class Ticker:
    """Progress of a long file check (events, line, rate) through the one progress
    component; silent when `show` is False or for a small file."""

    SMALL = 1 << 20  # bytes: a file this small is done before a line would help

    def __init__(self, what: str, total_bytes: int, show: bool = True) -> None:
        self.line = Progress(what, show and total_bytes >= self.SMALL)

    def __enter__(self) -> Ticker:
        self.line.__enter__()
        return self

    def update(self, events: int, line: int) -> None:
        rate = events / max(self.line.elapsed(), 1e-9)
        self.line.update(f"{events:,} events, line {line:,} ({rate:,.0f} events/s)")

    def __exit__(self, *exc: object) -> None:
        self.line.__exit__(None, None, None)


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


def print_campaign(report: Any) -> None:
    out = console()
    if getattr(report, "interrupted", False):
        out.print("[yellow bold]INTERRUPTED[/yellow bold]: the report covers the part that "
                  "ran" + ("" if report.failures else "; no bug found in it"))
    table = Table(title=f"fuzz campaign: {report.config} / {report.policy} / {report.backend}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for k, v in (("examples", report.examples), ("steps", report.steps),
                 ("seconds", f"{report.seconds:.1f}"),
                 ("steps/s", f"{report.steps_per_second:,.0f}"),
                 ("workers", report.workers), ("seed", report.seed),
                 ("max pocket occupancy", report.max_pocket_occupancy),
                 ("failures", len(report.failures))):
        table.add_row(k, str(v))
    out.print(table)
    rare = Table(title="rare states reached")
    rare.add_column("state")
    rare.add_column("count", justify="right")
    for name, n in report.rare_states.items():
        if not name.startswith(GUARD_PREFIX):  # the guard family: one line below
            gap = " (coverage gap)" if name in report.coverage_gaps else ""
            rare.add_row(name + gap, str(n))
    out.print(rare)
    out.print(guard_line(report.rare_states, report.coverage_gaps), markup=False,
              soft_wrap=True)
    if not report.failures and not getattr(report, "interrupted", False):
        gaps = (f"; [yellow]{len(report.coverage_gaps)} rare states never reached[/yellow] "
                "(named above), so not a full check") if report.coverage_gaps else ""
        out.print(f"[green bold]no bug found[/green bold] in {report.examples:,} examples, "
                  f"{report.steps:,} steps{gaps}")
    out.print(checks_line(report), markup=False, soft_wrap=True)
    for f in report.failures:
        first = f.message.splitlines()[0] if f.message else "failure"
        out.print(f"[red]failure[/red] after {f.steps} steps: {escape(first)}")
        out.print(f"  trace:      {f.trace}   (kvpocket replay {f.trace})", markup=False,
                  soft_wrap=True)
        out.print(f"  reproducer: {f.test}", markup=False, soft_wrap=True)


def _plan_ran(report: Any) -> str:
    """How much of its plan a campaign ran, in words."""
    if report.total_examples is not None:
        return (f"the plan of {report.total_examples:,} examples ran to its end "
                f"({report.examples:,} run)")
    if report.budget_s:
        return f"{report.examples:,} examples in a {report.budget_s:g} s budget"
    return f"the plan ran to its end, {report.examples:,} examples (a fixed number per cell)"


def guard_line(rare: dict[str, int], missed: list[str]) -> str:
    """The guard combinations (`guards.py`) in one line: how many were reached, and the
    ones missed by name (a table row each would bury the other rare states)."""
    names = [n for n in rare if n.startswith(GUARD_PREFIX)]
    gaps = [n.removeprefix(GUARD_PREFIX) for n in missed if n.startswith(GUARD_PREFIX)]
    reached = sum(1 for n in names if rare[n])
    return (f"guard combinations (every API action from every state that guards it): "
            f"{reached} of {len(names)} reached" + (f"; missed: {'; '.join(gaps)}" if gaps else ""))


def checks_line(report: Any) -> str:
    """What a campaign checked: what every example checks, then each check of
    `lockstep.CHECKS` with the examples that ran it (a report's `checks`), "off" where none
    did, so a check switched off never passes unseen."""
    every = ("the model (outcomes, abstract state, counters), every invariant on both sides, "
             "every speed structure against its meaning")
    ran = getattr(report, "checks", None) or {}
    parts = []
    for name in (*CHECKS, *(n for n in ran if n not in CHECKS)):
        n = ran.get(name, 0)
        parts.append(f"{name} off" if not n else f"{name} in every example"
                     if n >= report.examples else f"{name} in {n:,} of {report.examples:,} examples")
    return f"checked: {every} in every example; " + ", ".join(parts)


def print_matrix(report: Any, verbose: bool = False) -> None:
    """The verdict first, then one row per cell, the rare states, and any failure."""
    out = console()
    if report.failures:
        f = report.failures[0]
        out.print(f"[red bold]BUG FOUND[/red bold] in cell {f.cell} after {f.seconds:.1f} s: "
                  f"{escape(f.kind)} (shrunk to {f.steps} steps)")
    elif report.interrupted:
        out.print("[yellow bold]INTERRUPTED[/yellow bold]: the plan did not run to its end, "
                  "so this is no verdict; nothing was found in the part that ran")
    elif report.ran_short:
        # "no bug found" is said only of a plan that ran to its end
        out.print(f"[yellow bold]INCOMPLETE[/yellow bold] (exit 3): the time budget ended "
                  f"after {report.examples} of the {report.intended_examples} examples the "
                  f"plan intends ({report.seconds:.0f} s), so this is weaker than the plan's "
                  "measured kill figures and no clean verdict; the default, the plan counted "
                  "in examples (--total-examples), is the same run on any machine")
    else:
        gaps = (f"; [yellow]{len(report.unreached)} rare states never reached[/yellow], so "
                "not a full check (see below)") if report.unreached else ""
        out.print(f"[green bold]no bug found[/green bold]: {_plan_ran(report)}, "
                  f"{report.steps:,} steps, {len(report.cells)} cells, {report.seconds:.0f} s "
                  f"(seed {report.seed}){gaps}")
    out.print(checks_line(report), markup=False, soft_wrap=True)
    table = Table(title="default campaign: cells")
    for col, justify in (("cell", "left"), ("examples", "right"), ("steps", "right"),
                         ("rare states reached", "right"), ("last first reached at", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for name, c in report.cells.items():
        reached = sum(1 for n in c.expected if c.rare_states.get(n))
        shown = f"{reached}/{len(c.expected)}" if c.expected else \
            f"{sum(1 for n in c.rare_states.values() if n)} (drawn)"
        last = f"example {max(c.first_reached.values())}" if c.first_reached else "-"
        table.add_row(name, str(c.examples), str(c.steps), shown, last)
    out.print(table)
    if verbose:
        rare = Table(title="rare states reached (all cells)")
        rare.add_column("state")
        rare.add_column("count", justify="right")
        for name, n in report.rare_states.items():
            if not name.startswith(GUARD_PREFIX):
                rare.add_row(name, str(n))
        out.print(rare)
        out.print(guard_line(report.rare_states, report.unreached), markup=False,
                  soft_wrap=True)
        first = Table(title="example at which each cell first reached each rare state")
        first.add_column("cell")
        first.add_column("first reached (example: state)", overflow="fold")
        for name, c in report.cells.items():
            first.add_row(name, ", ".join(f"{i}: {s}" for s, i in sorted(
                c.first_reached.items(), key=lambda x: x[1])))
        out.print(first)
    if report.unreached:
        out.print("[yellow]coverage gaps[/yellow] (rare states no cell reached): "
                  + ", ".join(report.unreached))
    else:
        wanted = {n for c in report.cells.values() for n in c.expected}
        out.print(f"coverage: all {len(wanted)} rare states the cells can reach were reached")
    for f in report.failures:
        out.print(f"[red]failure[/red] in {f.cell}: {escape(f.message.splitlines()[0])}")
        out.print(f"  trace:      {f.trace}   (kvpocket replay {f.trace})", soft_wrap=True)
        out.print(f"  reproducer: {f.test}", soft_wrap=True)
