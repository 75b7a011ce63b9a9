"""verify/ is layered like impl/: every import goes down `verify/layers.py: LAYERS` (or stays
in its own unit), no module imports another in a cycle, and an import inside a function is
one of the few listed below, each with its reason, and says why in a comment beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpocket.verify import layers
from kvpocket.verify.layers import LAYERS, Import

# (importing module, imported module or package) -> why it is imported inside a function.
# A new entry needs a reason of the same kind: an optional dependency, or an expensive one
# kept off `kvpocket --help` (which imports bench, prove, quality and the CLI to build its
# parser; measure with `python -X importtime -m kvpocket.verify.cli --help`).
HYPOTHESIS = "Hypothesis (about a second to import) stays off `kvpocket --help`"
RICH = "rich stays off `kvpocket --help`, which prints no table"
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    ("verify.bench.device", "cupy"): "optional: CuPy exists only on a GPU machine",
    ("verify.bench.report", "rich"): RICH,
    ("verify.bench.suite", "verify.bench.plots"): "matplotlib: optional and seconds to import",
    ("verify.bench.verifier", "verify.conformance"): HYPOTHESIS,
    ("verify.cli.commands", "verify.cli.render"): RICH,
    ("verify.cli.commands", "redis"): "optional: only for a redis:// database",
    ("verify.cli.commands", "verify.conformance"): HYPOTHESIS,
    ("verify.cli.commands", "verify.targets"): HYPOTHESIS,
    ("verify.conformance.fuzz", "redis"): "optional: only for a redis:// database",
    ("verify.conformance.fuzz", "hypothesis.extra.redis"): "needs the optional redis package",
    ("verify.cli", "verify.cli.commands"): "the console script's entry: a Ctrl-C while the "
    "CLI loads is caught there (one line, never a traceback)",
    ("verify.interrupts", "z3"): "only when a Z3 run starts; campaigns import this module too",
    ("verify.proofs.prove", "rich"): RICH,
    ("verify.proofs.prove", "verify.proofs.parametric"): "the parametric engine, for --parametric",
    ("verify.oracles.attention", "torch"): "optional: the attention oracle needs torch",
    ("verify.quality.killmatrix", "rich"): RICH,
    ("verify.quality.seeded", "verify.conformance"): HYPOTHESIS,
    ("verify.quality.seeded", "torch"): "optional: the attention detector is skipped without it",
    ("verify.targets.registry", "verify.targets.vllm"): "an adapter loads only when named",
    ("verify.targets.registry", "verify.targets.sglang"): "an adapter loads only when named",
    ("verify.targets.sglang", "verify.targets.sglang_stubs"): "its import stubs go in only when "
    "SGLang is loaded",
    ("verify.terminal", "rich"): RICH,
    ("verify.usage", "hypothesis"): HYPOTHESIS,
}


FOUND = layers.imports()  # every import of model/, impl/ and verify/, parsed once


def _allowed(imp: Import) -> bool:
    return any(imp.module == mod and (imp.target == target or imp.target.startswith(target + "."))
               for mod, target in LAZY_IMPORTS)


def _lazy(found: list[Import]) -> list[Import]:
    return [i for i in found if i.local and i.module.split(".")[0] == "verify"]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_every_unit_of_verify_is_in_a_layer() -> None:
    units = [u for level in LAYERS for u in level]
    assert len(units) == len(set(units))
    for module in layers.modules():
        assert layers.unit_of(module)  # raises for a module of no layer
    subpackages = {f"verify.{p.name}" for p in (layers.ROOT / "verify").iterdir()
                   if (p / "__init__.py").is_file()}
    assert subpackages <= set(units)


def test_the_walk_sees_every_kind_of_import() -> None:
    edges = {(i.module, i.target, i.local) for i in FOUND}
    assert ("verify.cli.commands", "verify.usage", False) in edges  # module level
    assert ("verify.bench.verifier", "verify.conformance.fuzz", True) in edges  # in a function
    assert ("verify.quality.zoo", "verify.quality.seeded", False) in edges
    assert ("impl.backend.numpy_sim", "impl.exceptions", False) in edges  # `from ..exceptions`


def test_a_synthetic_upward_import_and_cycle_are_caught(tmp_path: Path) -> None:
    """The checks can fail: a trace module importing the CLI (upward), a proof module
    importing conformance (a peer), two quality modules importing each other (a cycle)."""
    _write(tmp_path, {
        "verify/__init__.py": "",
        "verify/traces/__init__.py": "",
        "verify/traces/trace.py": "def f() -> None:\n    from kvpocket.verify.cli import render\n",
        "verify/cli/__init__.py": "",
        "verify/cli/render.py": "from kvpocket.verify.proofs import prove\n",
        "verify/proofs/__init__.py": "",
        "verify/proofs/prove.py": "from ..conformance.fuzz import unused_path\n",
        "verify/conformance/__init__.py": "",
        "verify/conformance/fuzz.py": "unused_path = None\n",
        "verify/quality/__init__.py": "",
        "verify/quality/seeded.py": "from kvpocket.verify.quality import zoo\n",
        "verify/quality/zoo.py": "from . import seeded\n",
    })
    found = layers.imports(tmp_path, ("verify",))
    bad = layers.layer_violations(found)
    assert any("verify.traces.trace:2 imports verify.cli.render: upward" in b for b in bad), bad
    assert any("verify.proofs.prove:1 imports verify.conformance.fuzz" in b and "peers" in b
               for b in bad), bad
    assert len(bad) == 2, bad  # render -> prove goes down; seeded <-> zoo stays in quality
    cycle = layers.find_cycle(layers.module_graph(found))
    assert cycle is not None
    assert set(cycle) == {"verify.quality.seeded", "verify.quality.zoo"}
    lazy = _lazy(found)
    assert [(i.module, i.target, i.function) for i in lazy] == [
        ("verify.traces.trace", "verify.cli.render", "f")]
    assert not _allowed(lazy[0])


def test_no_import_goes_up_or_sideways() -> None:
    bad = layers.layer_violations(FOUND)
    assert not bad, "imports against verify/layers.py: LAYERS:\n" + "\n".join(bad)


def test_no_import_cycle() -> None:
    cycle = layers.find_cycle(layers.module_graph(FOUND))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_imports_inside_functions_are_the_listed_ones() -> None:
    lazy = _lazy(FOUND)
    unlisted = [f"{i.module}:{i.line} ({i.function}) imports {i.target}" for i in lazy
                if not _allowed(i)]
    assert not unlisted, ("import at the top of the module, or add it to LAZY_IMPORTS with "
                          "the reason:\n" + "\n".join(unlisted))
    used = {(m, t) for m, t in LAZY_IMPORTS
            if any(i.module == m and (i.target == t or i.target.startswith(t + ".")) for i in lazy)}
    assert used == set(LAZY_IMPORTS), f"listed but gone: {set(LAZY_IMPORTS) - used}"


@pytest.mark.parametrize("imp", _lazy(FOUND), ids=lambda i: f"{i.module}:{i.line}")
def test_each_lazy_import_says_why(imp: Import) -> None:
    """A comment on the import's line or just above it (over a group of imports)."""
    lines = layers.modules()[imp.module].read_text().splitlines()
    at = imp.line - 1
    while at >= 0:
        text = lines[at].strip()
        if "#" in text:
            return
        if not text.startswith(("from ", "import ", "try:")) or at < imp.line - 6:
            break
        at -= 1
    pytest.fail(f"{imp.module}:{imp.line}: say why {imp.target} is imported inside "
                f"{imp.function}() in a comment beside it")


def test_the_test_folders_mirror_the_packages() -> None:
    """One test folder per package: `tests/model`, `tests/impl` (its `backend` included) and
    one per subpackage of verify/ (`tests/oracles` for `verify/oracles`, ...), and no other."""
    folders = {p.name for p in (layers.ROOT / "tests").iterdir()
               if p.is_dir() and any(p.glob("test_*.py"))}
    packages = {"model", "impl"} | {p.name for p in (layers.ROOT / "verify").iterdir()
                                    if (p / "__init__.py").is_file()}
    assert folders == packages
