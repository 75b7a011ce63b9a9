"""`kvpocket mutants`: the kill matrix of the seeded mutants (`seeded.py`) or of the bug zoo
(`zoo.py`), its options, its table and its JSON file."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from kvpocket.verify.interrupts import stop_if_interrupted
from kvpocket.verify.quality.seeded import (
    CAMPAIGN_DETECTORS,
    DETECTORS,
    EXPLICIT_BMC,
    MUTANTS,
    MutantResult,
    run_mutant,
    torch_available,
)
from kvpocket.verify.quality.zoo import ZOO, run_zoo_bug
from kvpocket.verify.terminal import console as terminal_console
from kvpocket.verify.traces.trace import write_atomic

MAX_BUDGET_S = 3600.0  # --budget, per mutant
TORCH_MISSING = ("attention detector skipped: torch is not installed "
                 "(pip install 'kvpocket[torch]')")


def add_mutants_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--list", dest="list_only", action="store_true",
                        help="list the mutants and exit")
    parser.add_argument("--only", metavar="NAME", default=None,
                        help="one mutant (see --list; zoo names with --zoo)")
    parser.add_argument("--zoo", action="store_true",
                        help="the bug zoo (real-world bugs, verify/quality/zoo.py) under the default "
                             "campaign, instead of the seeded mutants")
    parser.add_argument("--budget", metavar="SECONDS", type=float, default=60.0,
                        help="time budget per mutant for the campaign with --examples 0 "
                        "(default 60; Z3 and BMC are limited in resource units and states, "
                        "never seconds)")
    parser.add_argument("--examples", metavar="N", type=int, default=None,
                        help="the default campaign's example budget per mutant (default: "
                        "the examples the default campaign intends, so the verdict is the "
                        "same on any machine; 0: stop on --budget seconds instead)")
    parser.add_argument("--json", dest="json_path", metavar="FILE", default=None,
                        help="write the kill matrix as JSON")


def _usage_error(message: str) -> int:
    print(f"kvpocket mutants: error: {message}", file=sys.stderr)
    return 2


def run_mutants(only: str | None, budget_s: float, json_path: str | None,
                list_only: bool, zoo: bool = False, examples: int | None = None) -> int:
    """Run the campaign; 0 when every mutant is killed, 1 when one survives, 2 on bad options.
    `zoo`: the bug zoo (`verify/quality/zoo.py: ZOO`) under the default campaign instead."""
    # rich (about 90 ms) is imported when the command runs: this module is imported by
    # `kvpocket --help` to build the parser, which prints no table.
    from rich.markup import escape
    from rich.table import Table

    console = terminal_console()
    names: list[str] = list(ZOO) if zoo else list(MUTANTS)
    if only is not None and only not in names:
        hint = "" if zoo or only not in ZOO else " (a zoo bug: add --zoo)"
        return _usage_error(f"argument --only: unknown {'zoo bug' if zoo else 'mutant'} "
                            f"{only!r}{hint}; expected one of " + ", ".join(names))
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not (
            0 < budget_s <= MAX_BUDGET_S):  # also refuses nan
        return _usage_error(f"argument --budget: expected seconds in (0, {MAX_BUDGET_S:g}], "
                            f"got {budget_s!r}")
    if list_only:
        if zoo:
            table = Table(title="kvpocket bug zoo")
            _name_column(table, "bug", ZOO)
            for col in ("origin", "hazard", "what went wrong upstream", "counterpart", "switch"):
                table.add_column(col, overflow="fold")
            for b in ZOO.values():
                table.add_row(b.name, escape(b.origin), b.hazard, escape(b.description),
                              escape(b.counterpart), escape(b.switch))
        else:
            table = Table(title="kvpocket mutants")
            _name_column(table, "mutant", MUTANTS)
            for col in ("layer", "bug", "modelled on", "switch"):
                table.add_column(col, overflow="fold")
            for m in MUTANTS.values():
                table.add_row(m.name, m.layer, escape(m.description), escape(m.modelled_on),
                              escape(m.switch))
        console.print(table)
        return 0
    chosen = [only] if only else names
    results: list[MutantResult] = []
    t_all = time.monotonic()
    if not zoo and not torch_available():
        console.print(TORCH_MISSING, markup=False)
    interrupted = False
    try:
        for name in chosen:
            if zoo:
                console.print(f"[dim]zoo bug {name} ({escape(ZOO[name].origin)}), default "
                              f"campaign...[/dim]")
                result = run_zoo_bug(ZOO[name], budget_s, examples=examples)
            else:
                m = MUTANTS[name]
                console.print(f"[dim]mutant {m.name} ({m.layer}, {m.preset}/{m.policy})...[/dim]")
                result = run_mutant(m, budget_s, examples=examples)
            # A Ctrl-C that something below swallowed (a library, a callback) is no verdict
            # either: the result of a run it cut is never recorded.
            stop_if_interrupted()
            results.append(result)
    except KeyboardInterrupt:  # the mutants that finished are reported, marked interrupted
        interrupted = True
        console.print(f"[yellow bold]INTERRUPTED[/] after {len(results)} of {len(chosen)}")
    killed = sum(r.killed for r in results)
    # The zoo runs the default campaign only: no attention scenario, no Z3 column.
    detectors = CAMPAIGN_DETECTORS if zoo else DETECTORS
    table = Table(title="kill matrix" + (" (bug zoo, default campaign)" if zoo else ""))
    _name_column(table, "mutant", {r.name: r for r in results})
    if zoo:
        table.add_column("origin", overflow="fold")
        table.add_column("hazard", overflow="fold")
    for d in detectors:
        table.add_column(d, justify="center")
    table.add_column("examples-to-kill", justify="right")
    table.add_column("time-to-kill s", justify="right")
    table.add_column("trace", justify="right")
    for r in results:
        marks = [_mark(r, d) for d in detectors]
        extra = [escape(r.origin), r.hazard or ""] if zoo else []
        table.add_row(r.name if r.killed else f"[red]{r.name}[/red]", *extra, *marks,
                      "-" if r.examples is None else str(r.examples),
                      "-" if r.seconds is None else f"{r.seconds:.1f}",
                      "-" if r.trace_length is None else str(r.trace_length))
    console.print(table)
    times = [r.seconds for r in results if r.seconds is not None]
    lengths = [r.trace_length for r in results if r.trace_length is not None]
    summary = f"killed {killed} of {len(results)}"
    counts = [r.examples for r in results if r.examples is not None]
    if counts:  # the machine-independent measure (with an example budget)
        summary += (f"; examples-to-kill median {statistics.median(counts):g}, worst "
                    f"{max(counts)}" + (f" (budget {examples})" if examples else ""))
    if times:
        summary += (f"; time-to-kill median {statistics.median(times):.1f} s, worst "
                    f"{max(times):.1f} s")
    if lengths:
        summary += f"; shrunk trace median {statistics.median(lengths):g}, worst {max(lengths)} steps"
    console.print(summary + f"; total {time.monotonic() - t_all:.0f} s", highlight=False)
    if any(r.attention == "skipped" for r in results):
        console.print(TORCH_MISSING, markup=False)
    for r in results:
        if not r.killed:
            console.print(f"[red]survived:[/red] {r.name}: {escape(r.campaign)}; "
                          f"z3 {escape(str(r.z3 or 'n/a'))}")
    if json_path:
        data = {"kind": "zoo" if zoo else "seeded", "killed": killed, "total": len(results),
                "interrupted": interrupted, "mutants": [r.to_json() for r in results]}
        write_atomic(json_path, json.dumps(data, indent=2) + "\n")
    if interrupted:
        return 130
    return 0 if killed == len(results) else 1


def _name_column(table: Any, title: str, names: Any) -> None:
    """A name column that is never broken in the middle of a name (other columns wrap at
    spaces instead, on a narrow terminal or a pipe's 80 columns)."""
    width = max([len(title), *(len(str(n)) for n in names)])
    table.add_column(title, no_wrap=True, min_width=width)


def _mark(r: MutantResult, detector: str) -> str:
    if detector in r.detectors:
        return "[green]killed[/green]"
    if detector == "attention" and r.attention == "missed":
        return "[yellow]missed[/yellow]"
    if detector == "attention" and r.attention == "skipped":
        return "[dim]skipped[/dim]"
    if detector == "z3" and r.z3:
        z3_only = [v for k, v in r.z3.items() if k != EXPLICIT_BMC]
        return "[yellow]" + ("n/a" if all(v.startswith("n/a") for v in z3_only)
                             else "missed") + "[/yellow]"
    if detector == "explicit-bmc" and EXPLICIT_BMC in r.z3:
        return "[yellow]missed[/yellow]"
    return "."
