"""Seeded bugs are source patches applied from outside the product code (issue 23 item 2):
impl/ has no switch, every registered bug's patch applies to the current source and
changes what it edits, the product code comes back afterwards, spawned campaign workers
get the same bugs, and a reproducer names them. Cheap: no campaign runs here (the kill
tests are test_mutants.py and test_zoo.py, marked quality)."""

from __future__ import annotations

import dis
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
from pathlib import Path
from types import FunctionType

import pytest

from kvpocket.impl.kvcache import KVCache
from kvpocket.model.overrides import overriding
from kvpocket.verify import patching
from kvpocket.verify.conformance.fuzz import init_worker
from kvpocket.verify.conformance.lockstep import Divergence, Lockstep
from kvpocket.verify.conformance.replay import replay
from kvpocket.verify.patching import PatchError, SeededBug, SourceEdit, patched
from kvpocket.verify.presets import PRESETS
from kvpocket.verify.quality.patches import BUGS, switched_on
from kvpocket.verify.quality.reach import REACH_BUGS
from kvpocket.verify.quality.seeded import MUTANTS
from kvpocket.verify.quality.zoo import ZOO
from kvpocket.verify.traces.trace import Trace, TraceError, TraceStep

ROOT = Path(__file__).resolve().parents[2]


def test_impl_has_no_mutant_code() -> None:
    assert not (ROOT / "impl" / "mutants.py").exists()
    for path in (ROOT / "impl").rglob("*.py"):
        text = path.read_text()
        assert "mutants" not in text, f"{path}: mentions mutants"
        assert "KVPOCKET_MUTANT" not in text and "__dict__" not in text, path
        assert not re.search(r"\bzoo\b", text), f"{path}: zoo bug code"


def test_every_bug_has_a_patch_and_every_patch_a_bug() -> None:
    impl_bugs = {m.name for m in MUTANTS.values() if m.layer == "impl"} | set(ZOO) | set(REACH_BUGS)
    assert set(BUGS) == impl_bugs
    for name, bug in BUGS.items():
        assert bug.name == name and bug.edits
        assert all(e.target.startswith("kvpocket.impl.") and e.old != e.new for e in bug.edits)


def _code_of(target: str) -> FunctionType:
    fn = patching._resolve(target)[2]
    assert isinstance(fn, FunctionType), target
    return fn


@pytest.mark.parametrize("name", list(BUGS))
def test_patch_applies_changes_its_targets_and_restores(name: str) -> None:
    targets = {e.target for e in BUGS[name].edits}
    before = {t: _code_of(t) for t in targets}
    with switched_on(name):
        assert patching.active_names() == [name]
        for t in targets:
            now = _code_of(t)
            assert now is not before[t], f"{t} was not replaced"
            assert now.__qualname__ == before[t].__qualname__
            assert now.__code__.co_code != before[t].__code__.co_code or \
                now.__code__.co_consts != before[t].__code__.co_consts, f"{t} is unchanged"
    assert not patching.active()
    for t in targets:
        assert _code_of(t) is before[t], f"{t} not restored"


def test_patched_code_keeps_the_file_line_numbers() -> None:
    original = KVCache._unlock
    with switched_on("stale-index-entry"):
        edited = KVCache._unlock
        assert edited.__code__.co_firstlineno == original.__code__.co_firstlineno
        assert "seeded bug stale-index-entry" in edited.__code__.co_filename
        lines = {ln for _, ln in dis.findlinestarts(edited.__code__) if ln}
        assert lines <= {ln for _, ln in dis.findlinestarts(original.__code__) if ln}


def test_bugs_combine_and_nest_and_restore_on_error() -> None:
    original = KVCache._pop
    with switched_on("pop-no-revalidate"):
        with switched_on("zoo-pocket-dup-entry"):
            assert patching.active_names() == ["pop-no-revalidate", "zoo-pocket-dup-entry"]
        assert patching.active_names() == ["pop-no-revalidate"]
        assert KVCache._pop is not original
    assert KVCache._pop is original
    with pytest.raises(RuntimeError), switched_on("pop-no-revalidate"):
        raise RuntimeError("the block fails")
    assert KVCache._pop is original and not patching.active()


def test_an_edit_that_no_longer_matches_fails_loudly() -> None:
    stale = SeededBug("x", (SourceEdit("kvpocket.impl.kvcache:KVCache._pop", "no such text",
                                       "pass"),))
    with pytest.raises(PatchError, match="occurs 0 times"), patched([stale]):
        pass
    twice = SeededBug("y", (SourceEdit("kvpocket.impl.kvcache:KVCache._pop", "op.", "op."),))
    with pytest.raises(PatchError, match="times"), patched([twice]):
        pass
    with pytest.raises(PatchError, match="not defined"), patched(
            [SeededBug("z", (SourceEdit("kvpocket.impl.kvcache:KVCache.nope", "a", "b"),))]):
        pass
    assert KVCache._pop.__code__.co_filename.endswith("kvcache.py")
    with pytest.raises(KeyError, match="expected one of"), switched_on("no-such-bug"):
        pass


def test_a_patched_bug_is_seen_and_the_product_code_is_not() -> None:
    # The shortest scenario of the zoo's stale block table: caught at the last resume.
    steps: list[tuple[str, dict[str, object]]] = [("create", {"seq": 0, "prompt": []}),
                                                  ("resume", {"seq": 0})]
    steps += [("resize", {"seq": 0, "capacity": h + 1, "history": h}) for h in range(8)]
    steps += [("suspend", {"seq": 0}), ("resume", {"seq": 0})]
    with switched_on("zoo-stale-block-table"), pytest.raises(Divergence):
        ls = Lockstep(PRESETS["tiny"].config)
        for action, params in steps:
            ls.step(action, params)
    clean = Lockstep(PRESETS["tiny"].config)
    for action, params in steps:
        clean.step(action, params)


def test_spawned_workers_get_the_parents_bugs() -> None:
    ctx = mp.get_context("spawn")
    with switched_on("window-off-by-one"):
        bugs = patching.active()
    with ctx.Pool(1, initializer=init_worker, initargs=(ctx.Value("q", 0), bugs)) as pool:
        assert pool.apply(patching.active_names) == ["window-off-by-one"]
    assert not patching.active()


def test_a_trace_with_seeded_bugs_replays_only_with_them_on() -> None:
    cfg = PRESETS["tiny"].config
    trace = Trace(cfg, [TraceStep("create", {"seq": 0, "prompt": []})],
                  extra={patching.TRACE_KEY: ["stale-index-entry"]})
    with pytest.raises(TraceError, match="stale-index-entry"):
        replay(trace)
    with switched_on("stale-index-entry"):
        assert replay(trace).ok
    bad = Trace(cfg, [], extra={patching.TRACE_KEY: "stale-index-entry"})
    with pytest.raises(ValueError, match="seeded_bugs"):
        replay(bad)


def test_a_trace_of_a_spec_mutant_replays_only_with_its_overrides() -> None:
    spec_mutant = {"page is uncommitted": ("always", True)}  # as model-park-committed
    trace = Trace(PRESETS["tiny"].config, [TraceStep("create", {"seq": 0, "prompt": []})],
                  extra={"model_overrides": {k: list(v) for k, v in spec_mutant.items()}})
    with pytest.raises(TraceError, match="page is uncommitted"):
        replay(trace)
    with overriding(spec_mutant):
        assert replay(trace).ok


@pytest.mark.slow
def test_a_run_with_a_bug_says_so_and_its_reproducer_reproduces_in_a_clean_shell(
        tmp_path: Path) -> None:
    """`kvpocket fuzz --mutant NAME`: the first line names the bug; the trace and the pytest
    reproducer it writes switch it on again in a fresh process with a clean environment."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT / ".devpath"),
           "HOME": str(tmp_path), "COLUMNS": "200"}
    cli = [sys.executable, "-m", "kvpocket.verify.cli"]
    out = tmp_path / "out"
    run = subprocess.run([*cli, "fuzz", "--mutant", "stale-index-entry", "--config", "tiny",
                          "--examples", "40", "--out", str(out), "--no-progress"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.splitlines()[0].startswith("seeded bug switched on: stale-index-entry")
    traces = sorted(out.glob("failure-*.jsonl"))
    tests = sorted(out.glob("test_failure_*.py"))
    assert traces and tests
    header = json.loads(traces[0].read_text().splitlines()[0])
    assert header[patching.TRACE_KEY] == ["stale-index-entry"]
    again = subprocess.run([*cli, "replay", str(traces[0])], capture_output=True, text=True,
                           env=env, cwd=tmp_path, check=False)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "stale-index-entry" in again.stdout.splitlines()[0]
    pytest_run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 str(tests[0])], capture_output=True, text=True, env=env,
                                cwd=tmp_path, check=False)
    assert pytest_run.returncode == 1 and "1 failed" in pytest_run.stdout, pytest_run.stdout
    assert "stale-index-entry" in tests[0].read_text().split("\n", 1)[0]
