"""The generated parts of docs/architecture.md: sizes, the package graph, and the calls
one lockstep step and one BMC step make, read off the code rather than written by hand.

* `sizes`: code lines (non-blank, not comments, not docstrings) per package, counted
  from the source files.
* `package-graph`: the layers of `verify/layers.py` and which unit imports which (parsed
  with `ast`: module level, type-checking and function-local imports alike), as a mermaid
  flowchart.
* `lockstep-step` and `bmc-step`: a mermaid sequence diagram of the first call from one
  module to another during one `Lockstep.step("resize", ...)` on the `tiny` preset and
  during one API step of BMC from Init, recorded with `sys.setprofile`. When the code's
  data flow changes, the diagram changes and the docs test asks for a regeneration.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from kvpocket.model.state import Layout
from kvpocket.verify import layers
from kvpocket.verify.conformance.lockstep import Lockstep
from kvpocket.verify.presets import preset
from kvpocket.verify.proofs.prove import PROVE_CONFIGS
from kvpocket.verify.proofs.symbolic_bmc import bmc

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("model", "impl", "verify")


# ---- sizes ----------------------------------------------------------------------------------
def code_lines(path: Path) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    text = path.read_text()
    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                end = body[0].end_lineno or body[0].lineno
                doc_lines.update(range(body[0].lineno, end + 1))
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                            tokenize.DEDENT, tokenize.ENDMARKER):
            code.update(line for line in range(tok.start[0], tok.end[0] + 1)
                        if line not in doc_lines)
    return len(code)


def package_of(path: Path) -> str:
    """`model`, `impl`, `impl.backend`, `verify.proofs`, ...: a file's package."""
    rel = path.relative_to(ROOT).parent
    return ".".join(rel.parts)


def sizes() -> str:
    per: dict[str, tuple[int, int]] = {}
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            files, lines = per.get(package_of(path), (0, 0))
            per[package_of(path)] = (files + 1, lines + code_lines(path))
    totals = {top: sum(v[1] for k, v in per.items() if k.split(".")[0] == top) for top in TOPS}
    rows = ["| package | files | code lines |", "|---|---:|---:|"]
    rows += [f"| `{name}` | {files} | {lines:,} |" for name, (files, lines) in per.items()]
    rows.append("")
    rows.append(f"Code lines (not blank, comment or docstring): model {totals['model']:,}, "
                f"implementation {totals['impl']:,}, verifiers {totals['verify']:,}; the model "
                f"is {totals['model'] / max(1, totals['impl']):.2f} of the implementation.")
    return "\n".join(rows)


# ---- the package graph ----------------------------------------------------------------------
def package_graph() -> str:
    """The units of `verify/layers.py: LAYERS`, one box per layer from the bottom up, and an
    arrow wherever a module of one unit imports a module of another (module level,
    `TYPE_CHECKING` and inside functions alike)."""
    found = layers.imports(ROOT)
    edges = layers.unit_edges(found)
    lines = ["```mermaid", "flowchart BT"]
    for n, level in enumerate(layers.LAYERS):
        lines.append(f"    subgraph layer{n}[\"layer {n}\"]")
        lines += [f"        {u.replace('.', '_')}[\"{u}\"]" for u in level]
        lines.append("    end")
    lines += [f"    {a.replace('.', '_')} --> {b.replace('.', '_')}" for a, b in sorted(edges)]
    lines.append("```")
    order = " < ".join(", ".join(f"`{u}`" for u in level) for level in layers.LAYERS)
    bad = len(layers.layer_violations(found))
    lines += ["", f"Layers, bottom first (peers, separated by commas, import nothing of each "
              f"other): {order}. {len(edges)} edges between units; {bad} imports go up or "
              "sideways."]
    return "\n".join(lines)


# ---- call flows -----------------------------------------------------------------------------
# Vocabulary and bookkeeping every step goes through; shown, they would drown the flow.
PLUMBING = frozenset({"model.config", "model.logic", "verify.proofs.z3ops", "impl.undo",
                      "impl.counters", "impl.page", "model.overrides"})


def record_calls(run: Callable[[], Any], limit: int = 60) -> list[tuple[str, str, str]]:
    """(caller module, callee module, callee function) for the first call from one kvpocket
    module to another while `run()` runs, in order (plumbing modules left out)."""
    seen: set[tuple[str, str]] = set()
    order: list[tuple[str, str, str]] = []

    def module(frame: FrameType | None) -> str | None:
        name = frame.f_globals.get("__name__", "") if frame is not None else ""
        if name == __name__:
            return "driver"
        return name.removeprefix("kvpocket.") if name.startswith("kvpocket.") else None

    def hook(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or len(order) >= limit:
            return
        callee, caller = module(frame), module(frame.f_back)
        if callee is None or caller is None or callee == caller or {callee, caller} & PLUMBING:
            return
        fn = frame.f_code.co_name
        if fn.startswith("<") or (caller, callee) in seen:
            return
        seen.add((caller, callee))
        order.append((caller, callee, fn))

    sys.setprofile(hook)
    try:
        run()
    finally:
        sys.setprofile(None)
    return order


def sequence_diagram(calls: list[tuple[str, str, str]]) -> str:
    participants: list[str] = []
    for a, b, _ in calls:
        for m in (a, b):
            if m not in participants:
                participants.append(m)
    lines = ["```mermaid", "sequenceDiagram"]
    lines += [f"    participant {m.replace('.', '_')} as {m}" for m in participants]
    lines += [f"    {a.replace('.', '_')}->>{b.replace('.', '_')}: {fn}" for a, b, fn in calls]
    lines.append("```")
    return "\n".join(lines)


def lockstep_step() -> str:
    ls = Lockstep(preset("tiny"))
    ls.step("create", {"seq": 0, "prompt": []})
    ls.step("resume", {"seq": 0})
    ls.step("stop_committing", {"seq": 0})
    for h in range(1, 6):  # into the steady state: blocks leave the window, pages park
        ls.step("resize", {"seq": 0, "capacity": h + 1, "history": h})
    return sequence_diagram(record_calls(
        lambda: ls.step("resize", {"seq": 0, "capacity": 7, "history": 6})))


def bmc_step() -> str:
    lay = Layout(PROVE_CONFIGS["gpu-host"].config)
    return sequence_diagram(record_calls(lambda: bmc(lay, "api", 1)))


GENERATORS: dict[str, Callable[[], str]] = {
    "sizes": sizes,
    "package-graph": package_graph,
    "lockstep-step": lockstep_step,
    "bmc-step": bmc_step,
}
