"""impl/ is layered: its relative imports form no cycle, and no module reaches into another
object's underscore attributes (the manager and its sequence handles talk through
`Transactions`, `KVCache.adopt_prefix` and `ManagerView`)."""

from __future__ import annotations

import ast
from pathlib import Path

from kvpocket.verify.layers import find_cycle

IMPL = Path(__file__).resolve().parents[2] / "impl"


def _modules() -> dict[str, Path]:
    """Dotted name (relative to the repository root, e.g. "impl.backend") -> file."""
    out: dict[str, Path] = {}
    for path in sorted(IMPL.rglob("*.py")):
        parts = list(path.relative_to(IMPL.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _package(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def import_graph() -> dict[str, set[str]]:
    """Edges of every import of an impl/ module from an impl/ module: module level,
    TYPE_CHECKING blocks and function-local imports alike (`ast.walk` sees them all)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level:
                base = _package(name, path)
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                if node.module:
                    base = f"{base}.{node.module}"
                # `from . import mutants` names a module; `from .backend import X` does not.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvpocket."):
                targets = [node.module.removeprefix("kvpocket.")]
            elif isinstance(node, ast.Import):
                targets = [a.name.removeprefix("kvpocket.") for a in node.names]
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def test_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_graph_sees_type_checking_and_local_imports() -> None:
    graph = import_graph()
    assert "impl.kvcache" in graph["impl.manager"]
    assert "impl.storage" in graph["impl.transactions"]  # TYPE_CHECKING only
    assert "impl.backend.cupy_backend" in graph["impl.backend"]  # function-local
    assert "impl.exceptions" in graph["impl.backend.numpy_sim"]  # `from ..exceptions`


def test_impl_import_graph_is_acyclic() -> None:
    graph = import_graph()
    cycle = find_cycle(graph)
    edges = sorted(f"{u} -> {v}" for u, vs in graph.items() for v in vs)
    assert cycle is None, "import cycle in impl/: " + " -> ".join(cycle or []) + \
        "\nall edges:\n" + "\n".join(edges)


def test_no_module_reads_another_objects_private_attributes() -> None:
    """`x._name` only on `self`/`cls`: never `self._mgr._run`, `kv._stale`, `mgr._choices`."""
    bad: list[str] = []
    for path in sorted(IMPL.rglob("*.py")):
        text = path.read_text()
        for needle in ("_mgr._", "kv._", "mgr._choices"):
            if needle in text:
                bad.append(f"{path.name}: contains {needle!r}")
        for node in ast.walk(ast.parse(text, str(path))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                bad.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "\n".join(bad)
