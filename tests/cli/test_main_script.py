"""scripts/main.sh checks its environment variables before it installs or runs anything:
a bad value exits 2 with one line naming the variable. (The script runs from a copy
whose setup step is a stub that fails loudly, so a missed check cannot install.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "main.sh"


def _copy_with_setup(tmp_path: Path, setup: str) -> Path:
    """main.sh copied under tmp_path, its setup step replaced by `setup` (a shell body)."""
    if shutil.which("bash") is None or shutil.which("nproc") is None:
        pytest.skip("needs bash and nproc (coreutils)")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(SCRIPT, scripts / "main.sh")
    (scripts / "setup-env.sh").write_text(f"#!/bin/sh\n{setup}\n")
    (scripts / "setup-env.sh").chmod(0o755)
    return scripts / "main.sh"


@pytest.mark.parametrize(("var", "value"), [
    ("KVPOCKET_MINUTES", "abc"), ("KVPOCKET_MINUTES", "0"), ("KVPOCKET_MINUTES", "-1"),
    ("KVPOCKET_MINUTES", "nan"), ("KVPOCKET_MINUTES", "1e9"), ("KVPOCKET_MINUTES", ""),
    ("KVPOCKET_WORKERS", "0"), ("KVPOCKET_WORKERS", "x"), ("KVPOCKET_WORKERS", "100000"),
    ("KVPOCKET_WORKERS", ""), ("KVPOCKET_CONFIG", ""),
])
def test_a_bad_variable_stops_before_any_work(var: str, value: str, tmp_path: Path) -> None:
    script = _copy_with_setup(tmp_path, "echo SETUP-RAN; exit 99")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOCKET_")}
    proc = subprocess.run(["bash", str(script)], env={**env, var: value},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "SETUP-RAN" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and var in lines[0] and "error" in lines[0]
    assert not (tmp_path / "kvpocket-out").exists()


STUB = """#!/bin/sh
# A stand-in `kvpocket`: fuzz and prove write canned reports; verdict is the real one.
case "$1" in
  fuzz) while [ "$#" -gt 0 ]; do [ "$1" = --json ] && cp "$STUB_DIR/fuzz.json" "$2"; shift; done
        echo "$*" >> "$STUB_DIR/calls"; exit 0 ;;
  prove) while [ "$#" -gt 0 ]; do [ "$1" = --json ] && cp "$STUB_DIR/prove.json" "$2"; shift; done
         exit "$PROVE_EXIT" ;;
  *) exec "$REAL_PYTHON" -m kvpocket.verify.cli "$@" ;;
esac
"""


@pytest.mark.parametrize(("unknown", "want"), [(0, 0), (1, 3)])
def test_the_last_line_combines_every_verdict(unknown: int, want: int, tmp_path: Path) -> None:
    # A fuzz campaign that found nothing beside a proof with an unknown obligation is
    # incomplete: the script says so on its last line and exits 3, never 0.
    import json
    import sys

    from kvpocket.verify.conformance.matrix import MatrixReport

    script = _copy_with_setup(tmp_path, "exit 0")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "kvpocket").write_text(STUB)
    (bin_dir / "kvpocket").chmod(0o755)
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "fuzz.json").write_text(json.dumps(MatrixReport(
        0, 1, 0.0, None, "numpy", examples=1000, total_examples=1000).to_json()))
    (stub / "prove.json").write_text(json.dumps({
        "summary": {"gpu/revalidate": {"proved": 5, "violated": 0, "unknown": unknown}},
        "obligations": [], "interrupted": False, "cells": 1, "cells_finished": 1}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOCKET_")}
    env.update(STUB_DIR=str(stub), REAL_PYTHON=sys.executable, PROVE_EXIT=str(3 * unknown),
               PYTHONPATH=str(SCRIPT.parents[1] / ".devpath"))
    proc = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == want, (proc.stdout, proc.stderr)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("kvpocket: " + ("CLEAN" if not unknown else "INCOMPLETE"))
    assert "fuzz: no bug found" in last and "prove:" in last
    assert "--minutes" not in (stub / "calls").read_text()  # the default is the plan
