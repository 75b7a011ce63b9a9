"""scripts/setup-env.sh installs what the README says, and says what and why: CuPy only when
asked for (KVPOCKET_CUDA=1) or when `nvidia-smi` works, redis-server only with
KVPOCKET_REDIS=1; scripts/main.sh prints a line per step.

The scripts run from a copy whose `.venv/bin/python`, `apt-get`, `nvidia-smi` and
`kvpocket` are stubs that log their arguments, on a PATH of only the tools they need."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("bash", "sha256sum", "cut", "cat", "dirname", "mkdir", "stat", "nproc", "awk", "grep")


def _stub(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/bash\necho \"{path.name} $*\" >> \"$STUB_LOG\"\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    if any(shutil.which(t) is None for t in TOOLS):
        pytest.skip("needs " + ", ".join(TOOLS))
    work = tmp_path / "clone"
    (work / "scripts").mkdir(parents=True)
    for name in ("setup-env.sh", "main.sh"):
        shutil.copy(ROOT / "scripts" / name, work / "scripts" / name)
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    (work / ".venv" / "bin").mkdir(parents=True)
    _stub(work / ".venv" / "bin" / "python", "exit 0")
    _stub(work / ".venv" / "bin" / "kvpocket", "exit 0")
    tools = tmp_path / "tools"
    tools.mkdir()
    for t in TOOLS:
        (tools / t).symlink_to(shutil.which(t) or t)
    _stub(tools / "apt-get", "exit 0")
    return work


def _run(work: Path, script: str, gpu: bool | None = None, **env: str
         ) -> tuple[subprocess.CompletedProcess[str], str]:
    tools = work.parent / "tools"
    if gpu is not None:
        _stub(tools / "nvidia-smi", "exit 0" if gpu else "exit 9")
    log = work.parent / "stub.log"
    log.write_text("")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KVPOCKET_", "PYTHON"))}
    done = subprocess.run(["bash", str(work / "scripts" / script)], cwd=work,
                          env={**base, "PATH": str(tools), "STUB_LOG": str(log), **env},
                          capture_output=True, text=True, timeout=60, check=False)
    return done, log.read_text()


def _extras(log: str) -> str:
    (line,) = [x for x in log.splitlines() if " -e " in x]
    return line.split(" -e ")[1].strip()


def test_a_cpu_only_machine_gets_no_cupy_and_no_apt_get(copy: Path) -> None:
    done, log = _run(copy, "setup-env.sh", gpu=False)
    assert done.returncode == 0, done.stderr
    assert _extras(log) == ".[dev,redis]"
    assert "apt-get" not in log
    out = done.stdout
    assert "no CuPy: no working nvidia-smi (KVPOCKET_CUDA=1 installs it)" in out
    assert "the CPU build" in out and "Redis database test will skip" in out


@pytest.mark.parametrize(("gpu", "env"), [(True, {}), (False, {"KVPOCKET_CUDA": "1"})])
def test_cupy_comes_with_a_working_gpu_or_when_asked_for(
        copy: Path, gpu: bool, env: dict[str, str]) -> None:
    done, log = _run(copy, "setup-env.sh", gpu=gpu, **env)
    assert done.returncode == 0, done.stderr
    assert _extras(log) == ".[dev,redis,cuda]"


def test_kvpocket_cuda_0_leaves_cupy_out_on_a_gpu_machine(copy: Path) -> None:
    done, log = _run(copy, "setup-env.sh", gpu=True, KVPOCKET_CUDA="0")
    assert _extras(log) == ".[dev,redis]", done.stdout


def test_redis_server_only_when_asked_for(copy: Path) -> None:
    done, log = _run(copy, "setup-env.sh", gpu=False, KVPOCKET_REDIS="1")
    assert done.returncode == 0, done.stderr
    assert "apt-get install -y -qq redis-server" in log
    assert "installing redis-server with apt-get (KVPOCKET_REDIS=1" in done.stdout


def test_a_second_run_installs_nothing_and_says_so(copy: Path) -> None:
    _run(copy, "setup-env.sh", gpu=False)
    done, log = _run(copy, "setup-env.sh", gpu=False)
    assert " -e " not in log and "up to date" in done.stdout
    done, log = _run(copy, "setup-env.sh", KVPOCKET_CUDA="1")  # other extras: installs again
    assert _extras(log) == ".[dev,redis,cuda]"


def test_a_bad_switch_is_one_line_exit_2(copy: Path) -> None:
    done, log = _run(copy, "setup-env.sh", KVPOCKET_CUDA="yes")
    assert done.returncode == 2 and log == ""
    assert done.stderr.strip().splitlines() == [
        "scripts/setup-env.sh: error: KVPOCKET_CUDA: expected 0 or 1 (unset: install CuPy "
        "when nvidia-smi works), got 'yes'"]


def test_pips_own_lines_show_what_it_fetches_and_a_failure_stops_setup(copy: Path) -> None:
    python = copy / ".venv" / "bin" / "python"
    _stub(python, 'printf "Collecting numpy\\nRequirement already satisfied: rich\\n'
                  'Successfully installed numpy-2\\n"; exit 0')
    done, _ = _run(copy, "setup-env.sh", gpu=False)
    assert done.returncode == 0, done.stderr
    assert "setup-env:   Collecting numpy" in done.stdout
    assert "setup-env:   Successfully installed numpy-2" in done.stdout
    assert "Requirement already satisfied" not in done.stdout
    _stub(python, 'echo "ERROR: No matching distribution"; exit 1')
    (copy / ".venv" / ".kvpocket-deps").unlink()
    done, _ = _run(copy, "setup-env.sh", gpu=False)
    assert done.returncode != 0 and "ERROR: No matching distribution" in done.stdout
    assert not (copy / ".venv" / ".kvpocket-deps").exists()  # not stamped: tried again next time


def test_main_sh_prints_a_line_per_step(copy: Path) -> None:
    # fuzz and prove write their --json report (main.sh combines them with `verdict`)
    _stub(copy / ".venv" / "bin" / "kvpocket",
          'while [ "$#" -gt 0 ]; do [ "$1" = --json ] && echo "{}" > "$2"; shift; done; exit 0')
    done, log = _run(copy, "main.sh", gpu=False, KVPOCKET_EXAMPLES="10")
    assert done.returncode == 0, done.stderr
    steps = [x for x in done.stdout.splitlines() if x.startswith("== ")]
    assert [s.split(":")[0] for s in steps] == ["== setup", "== fuzz", "== prove"], done.stdout
    assert "--total-examples 10" in steps[1]
    assert "kvpocket fuzz --total-examples 10" in log and "kvpocket prove" in log


def test_a_failed_install_shows_pips_last_lines_and_is_tried_once_more(copy: Path) -> None:
    python = copy / ".venv" / "bin" / "python"
    _stub(python, 'echo "Collecting torch"; echo "Traceback (most recent call last):"; '
                  'echo "OSError: [Errno 28] No space left on device"; exit 1')
    done, log = _run(copy, "setup-env.sh", gpu=False)
    assert done.returncode != 0
    # the cause pip printed after "ERROR: Exception:" reaches the log, not only the filter
    assert "setup-env:   | OSError: [Errno 28] No space left on device" in done.stdout
    assert "trying once more" in done.stdout
    torch_tries = [x for x in log.splitlines() if "install" in x and "torch" in x]
    # torch, again; then the newest torch (the fallback), again
    assert len(torch_tries) == 4, log
