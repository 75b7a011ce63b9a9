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


@pytest.mark.parametrize(("var", "value"), [
    ("KVPOCKET_MINUTES", "abc"), ("KVPOCKET_MINUTES", "0"), ("KVPOCKET_MINUTES", "-1"),
    ("KVPOCKET_MINUTES", "nan"), ("KVPOCKET_MINUTES", "1e9"), ("KVPOCKET_MINUTES", ""),
    ("KVPOCKET_WORKERS", "0"), ("KVPOCKET_WORKERS", "x"), ("KVPOCKET_WORKERS", "100000"),
    ("KVPOCKET_WORKERS", ""), ("KVPOCKET_CONFIG", ""),
])
def test_a_bad_variable_stops_before_any_work(var: str, value: str, tmp_path: Path) -> None:
    if shutil.which("bash") is None or shutil.which("nproc") is None:
        pytest.skip("needs bash and nproc (coreutils)")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(SCRIPT, scripts / "main.sh")
    (scripts / "setup-env.sh").write_text("#!/bin/sh\necho SETUP-RAN; exit 99\n")
    (scripts / "setup-env.sh").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOCKET_")}
    proc = subprocess.run(["bash", str(scripts / "main.sh")], env={**env, var: value},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "SETUP-RAN" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and var in lines[0] and "error" in lines[0]
    assert not (tmp_path / "kvpocket-out").exists()
