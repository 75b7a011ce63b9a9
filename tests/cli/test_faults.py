"""Faults around a run: a full disk, a closed stdout, SIGTERM, a killed parent, a Ctrl-C
while the CLI loads. Each is one line and a documented exit status, never a traceback,
never a lost report, never a worker left running or a temporary file left behind.

A full disk is simulated by making the writer's os calls raise ENOSPC (no root mounts).
The process tests poll for their condition (workers gone, the process ended) up to a
generous number of times: the bound only guards against a hang, no verdict reads the
clock."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvpocket.verify.cli.commands import main
from kvpocket.verify.traces import trace as tr

ROOT = Path(__file__).parents[2]
REGRESSIONS = ROOT / "verify" / "regressions"
POSIX = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and /proc")
POLL_S = 0.25
POLLS = 400  # 100 s: far beyond the 2 s a worker takes to notice; guards only a hang


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / ".devpath")}


def _enospc(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


# ---- the one writer -------------------------------------------------------------------


@pytest.mark.parametrize("call", ["write", "fsync", "replace"])
def test_the_writer_turns_a_full_disk_into_one_named_error(
        call: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "report.json"
    target.write_text("old\n")
    if call == "write":
        monkeypatch.setattr(tr._Guarded, "write", lambda self, text: _enospc())
    else:
        monkeypatch.setattr(os, call, _enospc)
    with pytest.raises(tr.OutputError) as info:
        tr.write_atomic(target, "new\n")
    assert str(info.value) == f"cannot write {target} (No space left on device)"
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary file


def test_the_writer_names_a_folder_in_the_way_and_a_path_through_a_file(tmp_path: Path
                                                                       ) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(tr.OutputError, match=r"cannot write .*dir"):
        tr.write_atomic(tmp_path / "dir", "x")
    with pytest.raises(tr.OutputError, match=r"cannot write .*file/r\.json"):
        tr.write_atomic(tmp_path / "file" / "r.json", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file"]


def test_one_writer() -> None:
    """fuzz.py's own copy of the writer is gone: every report goes through write_atomic."""
    from kvpocket.verify.conformance import fuzz

    assert not hasattr(fuzz, "write_text_atomic")


def test_fuzz_reports_a_finding_whose_trace_cannot_be_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    real = os.fsync

    def fsync(fd: int) -> None:  # the disk fills up when the failure trace is written
        if "failure-" in os.readlink(f"/proc/self/fd/{fd}"):
            _enospc()
        real(fd)

    if not Path("/proc/self/fd").exists():
        pytest.skip("no /proc")
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "o"
    report = tmp_path / "r.json"
    code = main(["fuzz", "--config", "tiny", "--policy", "unsafe", "--examples", "300",
                 "--no-progress", "--out", str(out), "--json", str(report)])
    stdout, err = capsys.readouterr()
    assert code == 2, err
    assert "failure after" in stdout  # the report is printed
    assert json.loads(report.read_text())["failures"]  # and written
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "cannot write" in lines[0] and "No space left" in lines[0]
    assert "failure-" in lines[0] and "Traceback" not in err
    assert not [p for p in out.rglob("*") if p.name.startswith((".failure", "failure"))]


def test_fuzz_prints_its_report_when_the_json_cannot_be_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(os, "fsync", _enospc)
    monkeypatch.chdir(tmp_path)
    code = main(["fuzz", "--config", "tiny", "--examples", "3", "--no-progress",
                 "--out", str(tmp_path / "o"), "--json", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert code == 2
    assert "fuzz campaign: tiny" in out  # the report is printed
    assert err.strip() == f"kvpocket fuzz: error: cannot write {tmp_path / 'r.json'} (No " \
                          "space left on device)"
    assert not (tmp_path / "r.json").exists()


def test_record_on_a_full_disk_keeps_the_old_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "l.ndjson"
    log.write_text("old\n")
    monkeypatch.setattr(os, "fsync", _enospc)
    assert main(["trace", "record", "--steps", "20", "--out", str(log)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot write {log}" in err
    assert log.read_text() == "old\n" and len(list(tmp_path.iterdir())) == 1


# ---- a closed stdout --------------------------------------------------------------------


@POSIX
@pytest.mark.parametrize("argv", [
    ["spec"], ["trace", "check", "LOG"], ["replay", str(REGRESSIONS / "migration-during-"
                                                        "park-pin.jsonl")]])
def test_a_closed_stdout_is_one_line(argv: list[str], tmp_path: Path) -> None:
    """`kvpocket ... >&-`: exit 2 (a usage error, as a full stdout) and one line."""
    from kvpocket.verify.presets import preset
    from kvpocket.verify.traces.record import record

    log = tmp_path / "log.ndjson"
    record(preset("tiny"), 30, 0, log)
    argv = [str(log) if a == "LOG" else a for a in argv]
    r = subprocess.run([sys.executable, "-m", "kvpocket.verify.cli", *argv], env=_env(),
                       capture_output=True, text=True,
                       preexec_fn=lambda: os.close(1), cwd=tmp_path, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    assert "cannot write to standard output" in r.stderr


# ---- a Ctrl-C while the CLI loads -------------------------------------------------------

# A Ctrl-C landing while NumPy is imported (the first second of every command), made
# certain by an import hook that raises KeyboardInterrupt there.
_CTRL_C_AT_IMPORT = """
import sys
class Hook:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            raise KeyboardInterrupt
        return None
sys.meta_path.insert(0, Hook())
sys.argv = ["kvpocket", "spec"]
"""


@pytest.mark.parametrize("entry", [
    "import runpy; runpy.run_module('kvpocket.verify.cli', run_name='__main__')",
    "from kvpocket.verify.cli import main; sys.exit(main())",  # the console script's
])
def test_ctrl_c_while_the_cli_loads_is_one_line(entry: str) -> None:
    r = subprocess.run([sys.executable, "-c", _CTRL_C_AT_IMPORT + entry], env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 130, r.stderr
    assert r.stderr == "kvpocket: interrupted\n"


# ---- SIGTERM and kill -9: no worker survives, no temporary file stays ----------------


def _children(pid: int) -> set[int]:
    """Every live descendant of `pid` (from /proc)."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, pp in parents.items() if pp == p}
        out |= kids
        todo.extend(kids)
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:80] + " " + \
            Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _poll(condition: object, what: object) -> None:
    for _ in range(POLLS):
        if condition():  # type: ignore[operator]
            return
        time.sleep(POLL_S)
    raise AssertionError(f"not reached after {POLLS} polls: {what}")


def _spawn(argv: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "kvpocket.verify.cli", *argv], cwd=cwd,
                            env=_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _threads(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(ln.split()[1]) for ln in status.splitlines()
                 if ln.startswith("Threads:")), 0)


def _workers_started(proc: subprocess.Popen[str], n: int) -> set[int]:
    """Once n workers have run their initializer (its parent-watch thread is their
    second thread); before that a worker is Python's own start-up, not ours."""
    def ready() -> set[int]:
        return {c for c in _children(proc.pid) if _threads(c) >= 2}

    _poll(lambda: proc.poll() is not None or len(ready()) >= n, f"{n} worker processes")
    assert proc.poll() is None, "the command ended before its workers started"
    return _children(proc.pid)


# Work that keeps each worker busy for far longer than the polls' bound: a worker that
# outlived its parent would still be running when the bound is reached (and one that
# finished its task first and noticed the broken pipe could not pass for a clean stop).
SLOW_CAMPAIGNS = {
    "fuzz": ["fuzz", "--config", "tiny", "--workers", "2", "--examples", "4000000",
             "--out", "o", "--no-progress"],
    "matrix": ["fuzz", "--workers", "2", "--minutes", "30", "--out", "o", "--no-progress"],
    "prove": ["prove", "--workers", "2", "--depth", "30", "--page-depth", "30",
              "--out", "cex"],
}


@POSIX
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").exists(), reason="no /proc")
@pytest.mark.parametrize("command", sorted(SLOW_CAMPAIGNS))
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_a_killed_campaign_leaves_no_worker(command: str, sig: int, tmp_path: Path) -> None:
    proc = _spawn(SLOW_CAMPAIGNS[command], tmp_path)
    try:
        workers = _workers_started(proc, 2)
        os.kill(proc.pid, sig)
        proc.wait(timeout=POLLS * POLL_S)
        _poll(lambda: not any(_alive(w) for w in workers),
              f"workers gone: {[(w, _state(w)) for w in workers]}")
        err = proc.stderr.read() if proc.stderr else ""
        if sig == signal.SIGTERM:  # the parent stops its pool: quietly
            assert proc.returncode == 143 and "Traceback" not in err, err
        else:  # (a worker sending a result as the parent dies may print a broken pipe)
            assert proc.returncode == -signal.SIGKILL
    finally:
        with_suppress_kill(proc)


def with_suppress_kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@POSIX
@pytest.mark.slow
def test_record_stopped_by_sigterm_leaves_no_temporary_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = _spawn(["trace", "record", "--steps", "10000000", "--out", str(out / "l.ndjson")],
                  tmp_path)
    try:
        _poll(lambda: proc.poll() is not None or any(out.iterdir()), "the temporary file")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=POLLS * POLL_S)
        err = proc.stderr.read() if proc.stderr else ""
        assert proc.returncode == 143, err
        assert err == "kvpocket trace: interrupted\n"
        assert list(out.iterdir()) == []
    finally:
        with_suppress_kill(proc)


# ---- the README's replay of every failure trace -----------------------------------------


def test_replay_takes_every_failure_trace(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`kvpocket replay kvpocket-out/failure-*.jsonl` with two failing runs' traces."""
    out = tmp_path / "kvpocket-out"
    out.mkdir()
    for i, name in enumerate(("migration-during-park-unsafe", "drop-during-park-unsafe")):
        shutil.copy(REGRESSIONS / f"{name}.jsonl", out / f"failure-{i}.jsonl")
    traces = sorted(str(p) for p in out.glob("failure-*.jsonl"))
    assert main(["replay", *traces]) == 1  # each still fails: a bug (1)
    text = capsys.readouterr().out
    parts = text.split("== ")[1:]
    assert [p.splitlines()[0] for p in parts] == traces
    assert all("model invariant violated" in p for p in parts), text
    clean = [str(REGRESSIONS / f"migration-during-park-{p}.jsonl") for p in ("pin", "revalidate")]
    assert main(["replay", *clean]) == 0  # fixed: every trace replays clean
    assert capsys.readouterr().out.count("implementation and model agree") == 2


def test_running_out_of_memory_is_no_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A MemoryError inside a step is the machine's limit, not "the implementation
    crashed": exit 2, no failure trace written."""
    from kvpocket.verify.conformance import lockstep

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(lockstep, "call_impl", out_of_memory)
    monkeypatch.chdir(tmp_path)
    code = main(["fuzz", "--config", "tiny", "--examples", "5", "--no-progress",
                 "--out", str(tmp_path / "o")])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "MemoryError" in err and "not a finding" in err and "crashed" not in out + err
    assert not list((tmp_path / "o").glob("failure-*"))
