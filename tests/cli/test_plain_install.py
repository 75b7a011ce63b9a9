"""A plain install (no extras: no torch, no CuPy, no redis, no matplotlib) runs every subcommand's
cheapest form without a traceback; the optional parts say in one line what is missing.

The package is installed with `pip install --no-deps --target` (as tests/test_packaging.py
does); the core dependencies come from this environment, and a `sitecustomize` on the
path makes torch, cupy, redis and matplotlib unimportable, as on a machine that never installed them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
HIDDEN = ("torch", "cupy", "cupyx", "cupy_backends", "redis", "matplotlib")

SHIM = f'''
import sys

HIDDEN = {HIDDEN!r}


class _Hide:
    """Optional packages are not installed (as far as this interpreter can tell)."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Hide())
'''


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a plain install: the package from the target folder, the
    optional packages hidden."""
    root = tmp_path_factory.mktemp("plain")
    target = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(ROOT)],
        check=True, cwd=root, capture_output=True,
    )
    shim = root / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "KVPOCKET"))}
    env.update(PYTHONPATH=os.pathsep.join([str(shim), str(target)]), COLUMNS="80",
               HYPOTHESIS_STORAGE_DIRECTORY=str(root / "hypothesis"))
    return {"root": str(root), "target": str(target), **{f"env:{k}": v for k, v in env.items()}}


def _env(plain: dict[str, str]) -> dict[str, str]:
    return {k[4:]: v for k, v in plain.items() if k.startswith("env:")}


def _run(plain: dict[str, str], *args: str, code: str | None = None, timeout: float = 240
         ) -> subprocess.CompletedProcess[str]:
    # `python -m kvpocket`: the installed package's own entry (the root's __main__.py)
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "kvpocket", *args]
    work = Path(plain["root"]) / "work"
    work.mkdir(exist_ok=True)
    return subprocess.run(cmd, cwd=work, env=_env(plain), capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_the_shim_hides_the_optional_packages_and_uses_the_install(plain: dict[str, str]
                                                                  ) -> None:
    probe = ("import importlib, kvpocket.verify.cli as c\n"
             "print(c.__file__)\n"
             f"for name in {HIDDEN!r}:\n"
             "    try:\n"
             "        importlib.import_module(name)\n"
             "    except ModuleNotFoundError:\n"
             "        continue\n"
             "    raise SystemExit(name + ' imports')\n")
    r = _run(plain, code=probe)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(plain["target"])


REGRESSION = "kvpocket/verify/regressions/migration-during-park-revalidate.jsonl"

# (arguments, expected exit status, a line stdout or stderr must contain)
CHEAPEST: list[tuple[list[str], int, str]] = [
    (["--help"], 0, "usage: kvpocket"),
    (["--version"], 0, f"kvpocket {VERSION}"),
    (["spec"], 0, "Invariants"),
    (["spec", "--json"], 0, '"invariants"'),
    (["fuzz", "--list-configs"], 0, "default matrix"),
    (["fuzz", "--config", "tiny", "--examples", "2", "--out", "out"], 3,
     "rare states never reached"),
    (["fuzz", "--config", "tiny", "--examples", "2", "--database", "redis://127.0.0.1:6379/0"],
     2, "pip install 'kvpocket[redis]'"),
    (["fuzz", "--config", "tiny", "--examples", "2", "--backend", "cupy"], 2,
     "needs CuPy and a usable CUDA GPU"),
    (["replay", "{target}/" + REGRESSION], 0, "implementation and model agree"),
    (["replay", "{target}/" + REGRESSION, "--backend", "cupy"], 2, "needs CuPy"),
    (["replay", "{root}/cupy-trace.jsonl"], 2, "the header asks for backend cupy"),
    (["prove", "--config", "gpu", "--depth", "0", "--page-depth", "0", "--workers", "1"], 0,
     "ALL PROVED"),
    (["trace", "record", "--steps", "20", "--out", "log.ndjson"], 0, "API calls"),
    (["trace", "check", "log.ndjson"], 0, "events valid"),
    (["bench", "--list"], 0, "smoke"),
    (["bench", "--suite", "gpu"], 2, "needs CuPy"),
    (["bench", "--suite", "smoke", "--plots", "plots"], 2, "pip install 'kvpocket[plots]'"),
    (["mutants", "--list"], 0, "pop-no-revalidate"),
    (["mutants", "--only", "pop-no-revalidate", "--budget", "20"], 0,
     "attention detector skipped: torch is not installed"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "code", "needle"), CHEAPEST,
                         ids=[" ".join(a[:3]) for a, _, _ in CHEAPEST])
def test_every_subcommand_runs_without_the_extras(plain: dict[str, str], args: list[str],
                                                  code: int, needle: str) -> None:
    cupy_trace = Path(plain["root"]) / "cupy-trace.jsonl"
    if not cupy_trace.exists():
        lines = (Path(plain["target"]) / REGRESSION).read_text().splitlines()
        header = json.loads(lines[0])
        header["backend"] = "cupy"
        cupy_trace.write_text("\n".join([json.dumps(header), *lines[1:-1]]) + "\n")
    argv = [a.format(target=plain["target"], root=plain["root"]) for a in args]
    if "cupy-trace" in argv[-1]:
        argv.append("--allow-unterminated")  # the header was edited: no valid marker
    if argv[:2] == ["trace", "check"]:
        record = _run(plain, "trace", "record", "--steps", "20", "--out", "log.ndjson")
        assert record.returncode == 0, record.stderr
    r = _run(plain, *argv)
    both = r.stdout + r.stderr
    assert "Traceback" not in both, both
    assert r.returncode == code, both
    assert needle in both, both
    if code == 2:
        assert r.stderr.strip().splitlines()[-1].startswith(f"kvpocket {argv[0]}: error: ")
