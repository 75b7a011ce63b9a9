"""The layers of kvpocket, bottom first, and the imports that must respect them.

A module may import from its own unit (a subpackage, or a top-level module of `verify/`)
and from units of lower layers, never from a higher layer or from a peer of its own
layer: units on one line of `LAYERS` do not import each other (they are independent
engines, not a cycle split in two). Within a unit, modules import each other without a
cycle. `tests/test_layers.py` checks all of it on every import (module
level, `TYPE_CHECKING` blocks and imports inside functions alike), and
`verify/cli/archgen.py` draws the picture in docs/architecture.md from the same walk.

Imports inside functions are the exception, each with a reason next to it: an optional
dependency (z3 in the interrupt handler, CuPy, torch, redis, vLLM, matplotlib) or an
expensive one off the common path (Hypothesis and rich are not imported by
`kvpocket --help`); the test holds the list.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("model", "impl", "verify")

LAYERS: tuple[tuple[str, ...], ...] = (
    ("model",),
    ("impl",),
    ("verify.exits",),  # the exit statuses every command and engine returns
    # Below every engine: named configurations, bug switching, Ctrl-C handling, option
    # checks, progress lines, this file.
    ("verify", "verify.presets", "verify.patching", "verify.interrupts", "verify.usage",
     "verify.terminal", "verify.layers", "verify.verdicts"),
    ("verify.oracles",),  # the data and attention oracles, read by the engines above
    ("verify.traces",),
    # Three engines over the traces, independent of each other.
    ("verify.conformance", "verify.proofs", "verify.targets"),
    ("verify.quality",),
    ("verify.bench",),
    ("verify.cli",),
)


@dataclass(frozen=True)
class Import:
    """One import of a kvpocket module (or of anything, for `local` imports)."""

    module: str  # the importing module, dotted from the package root: "verify.cli.commands"
    target: str  # the imported module: "verify.traces.trace", or "rich.table" outside kvpocket
    line: int
    local: bool  # inside a function (a lazy import), not at module level
    function: str = ""  # the enclosing function when `local`


def modules(root: Path = ROOT, tops: Iterable[str] = TOPS) -> dict[str, Path]:
    """Dotted module name (without the `kvpocket.` prefix) -> file."""
    out: dict[str, Path] = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _walk(node: ast.AST, function: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, function
        inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else ""
        yield from _walk(child, function or inner)


def _resolve(name: str, known: dict[str, Path]) -> str:
    """The longest known module `name` starts with, or `name` itself (outside kvpocket)."""
    if name.startswith("kvpocket."):
        parts = name.removeprefix("kvpocket.").split(".")
        for cut in range(len(parts), 0, -1):
            if ".".join(parts[:cut]) in known:
                return ".".join(parts[:cut])
    return name


def imports(root: Path = ROOT, tops: Iterable[str] = TOPS) -> list[Import]:
    """Every import statement of every module under `tops`, resolved to modules: a
    kvpocket target without its prefix, anything else by its full dotted name."""
    known = modules(root, tops)
    out: list[Import] = []
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, function in _walk(ast.parse(path.read_text(), str(path)), ""):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif node.level:  # relative: `from .x import y`, `from . import x`
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, *([node.module] if node.module else [])])
                names = [f"kvpocket.{mod}.{a.name}" for a in node.names]
            else:
                mod = node.module or ""
                names = [f"{mod}.{a.name}" if f"{mod}.{a.name}".removeprefix("kvpocket.")
                         in known else mod for a in node.names]
            for target in dict.fromkeys(_resolve(n, known) for n in names):
                if target != name:
                    out.append(Import(name, target, node.lineno, bool(function), function))
    return out


def unit_of(module: str) -> str:
    """The entry of `LAYERS` a module belongs to (the longest one it starts with)."""
    best = ""
    for level in LAYERS:
        for unit in level:
            if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best):
                best = unit
    if not best:
        raise KeyError(f"{module} is in no layer of verify/layers.py: LAYERS")
    return best


def level_of(unit: str) -> int:
    return next(i for i, level in enumerate(LAYERS) if unit in level)


def layer_violations(found: Iterable[Import]) -> list[str]:
    """An import of a higher layer, or of a peer unit of the same layer, one line each."""
    bad: list[str] = []
    for imp in found:
        if imp.target.split(".")[0] not in TOPS:
            continue
        src, dst = unit_of(imp.module), unit_of(imp.target)
        if src == dst:
            continue
        if level_of(dst) > level_of(src):
            bad.append(f"{imp.module}:{imp.line} imports {imp.target}: upward "
                       f"({src} is below {dst})")
        elif level_of(dst) == level_of(src):
            bad.append(f"{imp.module}:{imp.line} imports {imp.target}: {src} and {dst} are "
                       "peers of one layer")
    return bad


def module_graph(found: Iterable[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for imp in found:
        if imp.target.split(".")[0] in TOPS:
            graph.setdefault(imp.module, set()).add(imp.target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a closed path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return [*stack[stack.index(v):], v]
            if v not in state and (found := visit(v)) is not None:
                return found
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state and (found := visit(u)) is not None:
            return found
    return None


def unit_edges(found: Iterable[Import]) -> set[tuple[str, str]]:
    """(importing unit, imported unit) over every kvpocket import between two units."""
    return {(unit_of(i.module), unit_of(i.target)) for i in found
            if i.target.split(".")[0] in TOPS and unit_of(i.module) != unit_of(i.target)}
