"""Ctrl-C is never a verdict: fuzz, prove, mutants and bench exit 130, print and write
the part that ran marked as interrupted, and print no traceback (a second Ctrl-C
included). The signal goes to the command's whole process group, as a terminal sends
it. Nothing here asserts on elapsed time (the 2 s target is measured by hand, see
docs/cli.md); the commands are given far longer budgets than the wait before Ctrl-C.
A write error on stdout is a usage error (2), not a finding."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
WAIT_S = 8.0  # before Ctrl-C: past start-up, long before the command would finish


def _cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "kvpocket.verify.cli", *argv]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / ".devpath")}


def interrupt(argv: list[str], cwd: Path, second_after: float | None = None
              ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(_cli(*argv), cwd=cwd, env=_env(), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(WAIT_S)
    assert proc.poll() is None, "the command ended before Ctrl-C"
    os.killpg(proc.pid, signal.SIGINT)
    if second_after is not None:
        time.sleep(second_after)
        with contextlib.suppress(ProcessLookupError):  # it may have ended already
            os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


# slow: each waits WAIT_S of wall time in a subprocess before its Ctrl-C
pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
              pytest.mark.slow]


def test_prove_interrupted(tmp_path: Path) -> None:
    r = interrupt(["prove", "--json", "p.json", "--out", "cex"], tmp_path)
    assert r.returncode == 130, r.stderr
    assert "INTERRUPTED" in r.stdout and "ALL PROVED" not in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["interrupted"] is True and data["cells_finished"] < data["cells"]


def test_mutants_interrupted_is_no_verdict(tmp_path: Path) -> None:
    # The whole zoo (minutes), so the Ctrl-C lands inside it whatever the machine's speed:
    # the bugs finished before it keep their verdicts, the one cut has none.
    from kvpocket.verify.quality.zoo import ZOO

    r = interrupt(["mutants", "--zoo", "--json", "m.json"], tmp_path)
    assert r.returncode == 130, r.stderr
    assert "survived" not in r.stdout and "INTERRUPTED" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["interrupted"] is True and len(data["mutants"]) < len(ZOO)
    assert all(m["killed"] for m in data["mutants"]), data["mutants"]


def test_bench_interrupted_writes_the_rows_that_ran(tmp_path: Path) -> None:
    r = interrupt(["bench", "--suite", "default", "--json", "b.json"], tmp_path)
    assert r.returncode == 130, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert json.loads((tmp_path / "b.json").read_text())["interrupted"] is True


def test_a_second_ctrl_c_prints_no_traceback(tmp_path: Path) -> None:
    r = interrupt(["fuzz", "--workers", "2", "--minutes", "10", "--out", "o",
                   "--no-progress"], tmp_path, second_after=0.3)
    assert r.returncode in (130, -signal.SIGINT), r.stderr  # -2: killed while exiting
    assert "Traceback" not in r.stdout + r.stderr
    assert not list((tmp_path / "o").glob("failure-*"))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_a_write_error_on_stdout_is_a_usage_error(tmp_path: Path) -> None:
    log = tmp_path / "valid.ndjson"
    assert subprocess.run(_cli("trace", "record", "--steps", "20", "--out", str(log)),
                          env=_env(), capture_output=True, check=False).returncode == 0
    with open("/dev/full", "w") as full:
        r = subprocess.run(_cli("trace", "check", str(log)), env=_env(), stdout=full,
                           stderr=subprocess.PIPE, text=True, check=False)
    assert r.returncode == 2
    assert "cannot write to standard output" in r.stderr and "Traceback" not in r.stderr


def test_a_ctrl_c_inside_a_finalizer_is_delivered_after_it(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A KeyboardInterrupt cannot leave a `__del__` or a `weakref.finalize` callback: Python
    prints it with a traceback and goes on (seen once in `mutants --zoo`). The handler
    leaves such a Ctrl-C for later instead of counting it."""
    from kvpocket.verify import interrupts

    later: list[int] = []
    monkeypatch.setattr(interrupts, "_redeliver_later", lambda: later.append(1))

    class Finalized:
        def __del__(self) -> None:
            interrupts._handler(signal.SIGINT, sys._getframe())

    with interrupts.interrupt_scope():
        obj = Finalized()
        del obj  # the handler runs inside __del__: no exception, delivered again later
        assert later == [1] and not interrupts.was_interrupted()
        with pytest.raises(KeyboardInterrupt):  # the redelivered signal, outside it
            interrupts._handler(signal.SIGINT, sys._getframe())
        assert interrupts.was_interrupted()


def test_a_ctrl_c_inside_a_gc_callback_is_delivered_after_it(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """Likewise inside a function in `gc.callbacks` (Hypothesis registers one), in the CLI's
    process and in a campaign worker busy with a task (seen once in a fresh-clone CI run: a
    worker's traceback printed as "Exception ignored in: gc_callback")."""
    import gc

    from kvpocket.verify import interrupts

    later: list[int] = []
    monkeypatch.setattr(interrupts, "_redeliver_later", lambda: later.append(1))
    handlers = [interrupts._handler, interrupts._worker_handler]

    def callback(phase: str, info: dict[str, int]) -> None:
        for handler in handlers:
            handler(signal.SIGINT, sys._getframe())

    gc.callbacks.append(callback)
    try:
        interrupts.worker_ctrl_c()
        with interrupts.interrupt_scope(), interrupts.working():
            gc.collect()  # both handlers run inside the callback: nothing raised, later
            assert later and set(later) == {1} and not interrupts.was_interrupted()
            handlers.clear()
            with pytest.raises(KeyboardInterrupt):  # the redelivered signal, outside it
                interrupts._worker_handler(signal.SIGINT, sys._getframe())
    finally:
        gc.callbacks.remove(callback)
        signal.signal(signal.SIGINT, signal.default_int_handler)
