"""Regenerate the generated sections of the docs from the model.

Sections sit between `<!-- BEGIN GENERATED: NAME -->` and `<!-- END GENERATED: NAME -->`.
`python -m kvpocket.verify.cli.docgen` rewrites them in place; a test fails when they are stale,
so the docs cannot drift from the action table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from kvpocket.model.fastcheck import HAND_WRITTEN
from kvpocket.model.invariants import INVARIANTS
from kvpocket.model.spec import markdown_tables, mermaid_page_life
from kvpocket.verify.cli.archgen import GENERATORS as ARCHITECTURE
from kvpocket.verify.cli.commands import build_parser
from kvpocket.verify.presets import DEFAULT_PRESET, preset
from kvpocket.verify.proofs.parametric import PARAMETRIC_INVARIANTS, RESTATED

DOCS = Path(__file__).resolve().parents[2] / "docs"

PROOF_STATUS = DOCS / "proof-status.json"
HELP_WIDTH = 96


def proof_status() -> str:
    """The committed `kvpocket prove --json` result, summarised per configuration."""
    try:
        data = json.loads(PROOF_STATUS.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return f"(no proof status: cannot read {PROOF_STATUS.name}: {exc})"
    rows: dict[str, dict[str, float]] = {}
    open_rows: list[str] = []
    for o in data.get("obligations", []):
        r = rows.setdefault(o["config"], {"proved": 0, "violated": 0, "unknown": 0, "seconds": 0.0})
        r[o["status"] if o["status"] in r else "unknown"] += 1
        r["seconds"] += float(o["seconds"])
        if o["status"] != "proved":
            open_rows.append(f"| {o['config']} | {o['obligation']} | {o['status']} | "
                             f"{o.get('detail', '')} |")
    lines = ["| configuration / policy | obligations | proved | violated | unknown | seconds |",
             "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        total = int(r["proved"] + r["violated"] + r["unknown"])
        lines.append(f"| {name} | {total} | {int(r['proved'])} | {int(r['violated'])} | "
                     f"{int(r['unknown'])} | {r['seconds']:.1f} |")
    n = sum(int(r["proved"] + r["violated"] + r["unknown"]) for r in rows.values())
    proved = sum(int(r["proved"]) for r in rows.values())
    lines += ["", f"{proved} of {n} obligations proved in {data.get('seconds', 0):.0f} s "
              f"(from `docs/{PROOF_STATUS.name}`)."]
    if open_rows:
        lines += ["", "| configuration / policy | obligation | status | detail |",
                  "|---|---|---|---|", *open_rows]
    return "\n".join(lines)


def _help(p: argparse.ArgumentParser) -> str:
    p.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=HELP_WIDTH)
    return p.format_help().rstrip()


def _subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_reference() -> str:
    """`kvpocket --help` and every subcommand's help, from `verify/cli/commands.py: build_parser()`."""
    root = build_parser()
    root.prog = "kvpocket"
    out = ["```text", _help(root), "```"]
    for name, sub in _subcommands(root).items():
        out += ["", f"### `kvpocket {name}`", "", "```text", _help(sub), "```"]
        for sname, subsub in _subcommands(sub).items():
            out += ["", f"#### `kvpocket {name} {sname}`", "", "```text", _help(subsub), "```"]
    return "\n".join(out)


def invariant_engines() -> str:
    """Per invariant: where each engine's form comes from (docs/architecture.md)."""
    param = {i.name: i for i in PARAMETRIC_INVARIANTS}
    lines = ["| invariant | executable check (full, local) | parametric proof (every size) |",
             "|---|---|---|"]
    for inv in INVARIANTS:
        if inv.per_page is not None:
            fast = "derived from the one-page form"
        elif inv.per_entry is not None:
            fast = "derived from the one-entry form"
        elif inv.per_seq is not None:
            fast = "derived from the one-sequence form"
        elif inv.name in HAND_WRITTEN:
            fast = f"hand-written: {HAND_WRITTEN[inv.name]}"
        else:
            fast = "the definition itself"
        if inv.name not in param:
            proof = "not among its invariants"
        elif inv.name in RESTATED:
            proof = f"restated: {RESTATED[inv.name]}"
        elif inv.per_page is not None:
            proof = "derived: the one-page form over the page sort"
        elif inv.per_seq is not None:
            proof = "derived: the one-sequence form over the sequence sort"
        else:
            proof = "derived: the definition as it is"
        lines.append(f"| `{inv.name}` | {fast} | {proof} |")
    return "\n".join(lines)


GENERATORS: dict[str, Callable[[], str]] = {
    "invariant-engines": invariant_engines,
    "page-life": lambda: "```mermaid\n" + mermaid_page_life() + "\n```",
    "spec-tables": lambda: markdown_tables(preset(DEFAULT_PRESET)),
    "proof-status": proof_status,
    "cli-reference": cli_reference,
    **ARCHITECTURE,
}


def render(text: str) -> str:
    def fill(m: re.Match[str]) -> str:
        name = m.group(1)
        return f"<!-- BEGIN GENERATED: {name} -->\n{GENERATORS[name]()}\n<!-- END GENERATED: {name} -->"

    return re.sub(r"<!-- BEGIN GENERATED: ([\w-]+) -->.*?<!-- END GENERATED: \1 -->", fill, text,
                  flags=re.DOTALL)


def main() -> int:
    for path in sorted(DOCS.glob("*.md")):
        old = path.read_text()
        new = render(old)
        if new != old:
            path.write_text(new)
            print(f"updated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
