"""Regenerate the generated sections of the docs from the model.

Sections sit between `<!-- BEGIN GENERATED: NAME -->` and `<!-- END GENERATED: NAME -->`.
`python -m kvpocket.verify.cli.docgen` rewrites them in place; a test fails when they are stale,
so the docs cannot drift from the action table.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvpocket.model.config import ConfigError, KVConfig, LifeCycle
from kvpocket.model.fastcheck import HAND_WRITTEN
from kvpocket.model.invariants import INVARIANTS
from kvpocket.model.spec import markdown_tables, mermaid_page_life
from kvpocket.verify.cli.archgen import GENERATORS as ARCHITECTURE
from kvpocket.verify.cli.commands import build_parser
from kvpocket.verify.presets import DEFAULT_PRESET, preset
from kvpocket.verify.proofs.parametric import PARAMETRIC_INVARIANTS, RESTATED
from kvpocket.verify.traces.record import record

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


# What each field of a configuration means (docs/adapter-guide.md). The allowed values and
# defaults come from the code; a field of `KVConfig.to_json()` without an entry here stops
# the generator (and the docs test), so the list cannot fall behind the schema.
CONFIG_MEANING: dict[str, str] = {
    "tokens_per_block": "tokens per block (one page holds one block of one life cycle)",
    "life_cycles": "the life cycles: groups of layers that share one slot per block, at least "
                   "one, names unique",
    "life_cycles[].name": "its name (required)",
    "life_cycles[].window": "sliding window in tokens; `null`: full attention",
    "life_cycles[].sink_tokens": "tokens at the start that never leave the window (0 for full "
                                 "attention)",
    "life_cycles[].pool_group": "the slot pools its pages use; groups are numbered 0..G-1 "
                                "without gaps; life cycles of one slot size share one",
    "life_cycles[].priority": "eviction priority of its pages: lower is evicted first",
    "slots_per_level": "1 to 3 entries, GPU, host, disk: the slots of **each** pool group at "
                       "that level (a level holds G times as many in all)",
    "slots_per_level[]": "one level's slots per pool group",
    "num_sequences": "the most sequences open at once",
    "max_blocks": "blocks per sequence: `capacity <= max_blocks * tokens_per_block`",
    "max_pages": "the most pages alive at once (the model's bound); 0 or absent: derived, one "
                 "per slot plus one per pocket position when parked pages can be dropped",
    "pocket": "the reuse pocket",
    "pocket.enabled": "whether out-of-window pages park in the pocket",
    "pocket.capacity": "pocket entries per sequence and life cycle",
    "pocket.policy": "how a pop protects itself against a migration while parked: `revalidate` "
                     "re-checks, `pin` keeps parked pages from eviction, `unsafe` checks nothing "
                     "(the bug)",
    "pocket.evict_parked": "what the eviction cascade does with a parked victim: `drop` "
                           "releases its slot (no copy), `migrate` moves it one level down",
    "order": "the policy profile checked: `any` (the safety spec) or `lru` (also kvpocket's "
             "own victim and pop order)",
}


def _leaves(obj: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths of a `to_json()` value: containers first, then their fields."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            path = f"{prefix}{k}"
            yield path
            yield from _leaves(v, path + ".")
    elif isinstance(obj, list) and obj:
        if isinstance(obj[0], dict):
            yield from _leaves(obj[0], prefix.rstrip(".") + "[].")
        else:
            yield prefix.rstrip(".") + "[]"


def _set(data: dict[str, Any], path: str, value: object) -> None:
    keys = path.replace("[]", ".0").split(".")
    node: Any = data
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node[k]
    last = keys[-1]
    if last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value


def _allowed(base: dict[str, Any], path: str) -> str:
    """What the validation accepts for `path`: the words of the error a bad value gets."""
    data = copy.deepcopy(base)
    _set(data, path, [] if path == "slots_per_level" else -1)
    try:
        KVConfig.from_json(data)
    except ConfigError as exc:
        return exc.allowed
    raise AssertionError(f"config field {path}: -1 is accepted; give it a probe value")


def config_fields() -> str:
    """Every field of a configuration (`KVConfig.to_json()`), with what it takes."""
    base = KVConfig(life_cycles=(LifeCycle("swa", window=3),)).to_json()
    defaults = KVConfig().to_json()
    lc_default = LifeCycle("x").__dict__
    lines = ["| field | allowed | default | meaning |", "|---|---|---|---|"]
    for path in _leaves(base):
        if path not in CONFIG_MEANING:
            raise KeyError(f"config field {path} has no entry in docgen.CONFIG_MEANING")
        allowed = _allowed(base, path)
        if path.startswith("life_cycles[]."):
            field = path.split(".", 1)[1]
            default = "(required)" if field == "name" else f"`{json.dumps(lc_default[field])}`"
        elif path == "slots_per_level[]":
            default = "-"
        elif path == "max_pages":
            default, allowed = "`0` (derived)", f"0, or {allowed}"
        else:
            node: Any = defaults
            for k in path.split("."):
                node = node[k]
            default = f"`{json.dumps(node)}`"
        lines.append(f"| `{path}` | {allowed} | {default} | {CONFIG_MEANING[path]} |")
    unused = set(CONFIG_MEANING) - set(_leaves(base))
    if unused:
        raise KeyError(f"docgen.CONFIG_MEANING names fields the schema lacks: {sorted(unused)}")
    return "\n".join(lines)


MINIMAL_LOG = ("tiny", 6, 0)  # preset, steps, seed: a log that parks, pops and refuses a misuse


def minimal_log() -> str:
    """A complete log written by `kvpocket trace record` (tests/test_docs.py checks it)."""
    name, steps, seed = MINIMAL_LOG
    out = io.StringIO()
    record(preset(name), steps, seed, out)
    return (f"`kvpocket trace record --config {name} --steps {steps} --seed {seed} --out "
            "minimal.ndjson` writes this log (every line as in the file):\n\n```text\n"
            f"{out.getvalue()}```")


GENERATORS: dict[str, Callable[[], str]] = {
    "config-fields": config_fields,
    "minimal-log": minimal_log,
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
