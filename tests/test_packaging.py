"""`pip install .` gives one package, `kvpocket`, with the top-level folders as its
subpackages, and no top-level `model`, `impl` or `verify`."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_source_package_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {
        "kvpocket." + ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("model", "impl", "verify") for p in (ROOT / top).rglob("__init__.py")
    }
    assert found | {"kvpocket"} == listed  # "kvpocket": the root's __main__.py


def test_non_editable_install_imports_only_kvpocket(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(ROOT)],
        check=True, cwd=tmp_path, capture_output=True,
    )
    assert (target / "kvpocket" / "model" / "__init__.py").is_file()
    assert (target / "kvpocket" / "verify" / "regressions").is_dir()
    assert not any((target / name).exists() for name in ("model", "impl", "verify"))
    # A fresh interpreter that sees only the install (-S: no site-packages, so no editable
    # finder) and runs from another directory: the model imports (standard library only),
    # and nothing named model, impl or verify is importable.
    probe = (
        "import importlib.util, kvpocket.model\n"
        f"assert kvpocket.model.__file__.startswith({str(target)!r})\n"
        "for name in ('model', 'impl', 'verify'):\n"
        "    assert importlib.util.find_spec(name) is None, name\n"
        "assert importlib.util.find_spec('kvpocket.impl') is not None\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-S", "-c", probe], cwd=tmp_path, check=True,
                         capture_output=True, text=True, env={"PYTHONPATH": str(target)})
    assert out.stdout.strip() == "ok"


def test_every_module_name_is_unique() -> None:
    """One name, one module: `grep`, tracebacks and docs never have to say which `logic`."""
    names: dict[str, list[str]] = {}
    for top in ("model", "impl", "verify"):
        for p in (ROOT / top).rglob("*.py"):
            if p.name not in ("__init__.py", "__main__.py"):
                names.setdefault(p.stem, []).append(str(p.relative_to(ROOT)))
    assert {n: ps for n, ps in names.items() if len(ps) > 1} == {}


def test_no_package_export_shadows_its_submodule() -> None:
    """`from .bmc import bmc` in an `__init__` would make `import pkg.bmc as m` bind the
    function, not the module (monkeypatching and docs then reach the wrong object)."""
    import importlib

    for init in (ROOT / "verify").rglob("__init__.py"):
        pkg = "kvpocket." + ".".join(init.parent.relative_to(ROOT).parts)
        mod = importlib.import_module(pkg)
        subs = {p.stem for p in init.parent.glob("*.py")} | {p.name for p in init.parent.iterdir()
                                                                if (p / "__init__.py").is_file()}
        assert not set(getattr(mod, "__all__", ())) & subs, pkg


def test_python_m_kvpocket_runs_the_cli_from_the_source_tree(tmp_path: Path) -> None:
    """`python -m kvpocket` from a clone (through `.devpath`, as pytest imports it) is the
    `kvpocket` command, with the version pyproject.toml declares."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(ROOT / ".devpath")
    for args, needle in ((["--version"], f"kvpocket {version}"), (["--help"], "usage: kvpocket")):
        done = subprocess.run([sys.executable, "-m", "kvpocket", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(needle), done.stdout
