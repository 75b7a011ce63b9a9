"""Cheap checks of the mutation-testing kit (scripts/mutation.sh + verify/quality/mutation_probe.py).

Nothing here runs cosmic-ray or a campaign: the script's syntax, the configuration it
writes, the filters, the sample and the score arithmetic.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from kvpocket.verify.quality import mutation_probe as mp

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "mutation.sh"


def test_script_is_valid_bash_with_strict_mode() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    subprocess.run([bash, "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    assert "set -euo pipefail" in text
    assert "MUTATION_SAMPLE" in text and "MUTATION_WORKERS" in text and "MUTATION_BUDGET_S" in text


def test_config_names_exactly_the_six_modules(tmp_path: Path) -> None:
    out = tmp_path / "cr.toml"
    assert mp.main(["config", "--out", str(out), "--budget", "12", "--hard", "40",
                    "--exclude-operators", "core/NumberReplacer,core/RemoveDecorator"]) == 0
    cfg = tomllib.loads(out.read_text())["cosmic-ray"]
    assert cfg["module-path"] == [
        "impl/kvcache.py", "impl/storage.py", "impl/eviction.py",
        "impl/allocator.py", "impl/radix.py", "impl/undo.py",
    ]
    for m in cfg["module-path"]:
        assert (ROOT / m).is_file()
    assert cfg["distributor"]["name"] == "local"
    assert cfg["timeout"] > 40  # cosmic-ray's own timeout is only a safety net above ours
    assert "mutation_probe run --budget 12.0 --hard 40.0" in cfg["test-command"]
    assert cfg["filters"]["operators-filter"]["exclude-operators"] == [
        "core/NumberReplacer", "core/RemoveDecorator"]


def test_messages_and_annotations_are_skipped() -> None:
    src = ("from __future__ import annotations\n"
           "def f(a: int | None) -> int | None:\n"
           "    if a is None:\n"
           "        raise ValueError(f'bad {a + 1}')\n"
           "    return a + 1\n")
    tree = ast.parse(src)
    spans = mp.skip_spans(tree)
    assert mp.skip_reason(spans, (2, 13), (2, 14)) \
        == mp.SKIP_ANNOTATION
    assert mp.skip_reason(spans, (2, 29), (2, 30)) \
        == mp.SKIP_ANNOTATION
    assert mp.skip_reason(spans, (4, 30), (4, 31)) \
        == mp.SKIP_MESSAGE
    assert mp.skip_reason(spans, (5, 13), (5, 14)) is None
    eager = ast.parse(src.split("\n", 1)[1])  # without the future import they are evaluated
    assert mp.skip_reason(mp.skip_spans(eager), (1, 13), (1, 14)) is None


def _mutants(n_per_module: dict[str, int]) -> list[mp.Mutant]:
    return [mp.Mutant(f"{mod}-{i}", mod, "AddNot", 0, (i + 1, 0), (i + 1, 1))
            for mod, n in n_per_module.items() for i in range(n)]


def test_stratified_sample_is_deterministic_and_proportional() -> None:
    pool = _mutants({"impl/kvcache.py": 600, "impl/storage.py": 250, "impl/undo.py": 20})
    a = mp.stratified_sample(pool, 87, seed=12)
    b = mp.stratified_sample(list(reversed(pool)), 87, seed=12)
    assert [m.job_id for m in a] == [m.job_id for m in b]
    assert len(a) == 87 and len({m.job_id for m in a}) == 87
    per = {mod: sum(m.module == mod for m in a) for mod in ("impl/kvcache.py", "impl/storage.py",
                                                           "impl/undo.py")}
    assert per == {"impl/kvcache.py": 60, "impl/storage.py": 25, "impl/undo.py": 2}
    assert mp.stratified_sample(pool, 87, seed=13) != a
    assert len(mp.stratified_sample(pool, 10_000, seed=12)) == len(pool)
    small = mp.stratified_sample(pool, 2, seed=12)  # fewer than the modules: exactly n
    assert len(small) == 2
    three = mp.stratified_sample(pool, 3, seed=12)
    assert sorted(m.module for m in three) == ["impl/kvcache.py", "impl/storage.py", "impl/undo.py"]


def test_exit_status_mapping() -> None:
    assert mp.classify_exit(0, False) == ("survived", mp.EXIT_SURVIVED)
    assert mp.classify_exit(1, False) == ("killed", mp.EXIT_KILLED)
    assert mp.classify_exit(None, True) == ("timeout", mp.EXIT_KILLED)
    verdict, code = mp.classify_exit(2, False)  # a usage error is the probe's fault
    assert verdict.startswith("error") and code == mp.EXIT_ERROR
    assert mp.verdict_of("x\nkvpocket-mutation: error rc=2 seconds=1.5\n") == ("error rc=2", 1.5)


def test_an_example_budget_reaches_the_campaign_and_the_report(tmp_path: Path) -> None:
    """MUTATION_EXAMPLES: the campaign stops on examples (the same verdict on any machine)
    and the runner's line carries the examples-to-kill that the report summarises."""
    cmd = mp.fuzz_command(20.0, 0, str(tmp_path), examples=600)
    assert cmd[cmd.index("--total-examples") + 1] == "600" and "--minutes" not in cmd
    assert "--minutes" in mp.fuzz_command(20.0, 0, str(tmp_path))
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"failures": [{"examples": 42}]}))
    assert mp.examples_to_kill(report) == 42
    assert mp.examples_to_kill(tmp_path / "missing.json") is None
    line = "kvpocket-mutation: killed seconds=3.0 examples=42"
    assert mp.verdict_of(line) == ("killed", 3.0) and mp.kill_examples_of(line) == 42
    assert mp.kill_examples_of("kvpocket-mutation: survived seconds=9.0") is None
    text = SCRIPT.read_text()
    assert "MUTATION_EXAMPLES" in text and '--examples "$EXAMPLES"' in text


def test_score_excludes_errors_and_equivalents() -> None:
    ms = _mutants({"impl/kvcache.py": 10})
    outcomes = ["killed"] * 6 + ["timeout", "survived", "survived", "error"]
    rows = list(zip(ms, outcomes, strict=True))
    s = mp.summarize(rows, 10, {ms[7].key: "dead branch"})
    assert (s["killed"], s["timeout"], s["survived"], s["error"]) == (6, 1, 2, 1)
    assert s["score_raw"] == round(7 / 9, 4)
    assert s["score"] == 0.875  # 7 / (9 - 1 equivalent)
    lo, hi = s["score_ci95"]
    assert lo < 0.875 < hi


def test_cosmic_ray_operator_names_still_match() -> None:
    plugins = pytest.importorskip("cosmic_ray.plugins")
    names = {n.removeprefix("core/") for n in plugins.operator_names()}
    for name in ("AddNot", "ReplaceUnaryOperator_Delete_Not", "ReplaceAndWithOr",
                 "ReplaceOrWithAnd", "ReplaceBinaryOperator_Sub_Add",
                 "ReplaceComparisonOperator_Eq_NotEq"):
        assert name in names


# ---- the verifier scope (`scripts/mutation.sh --verifier`) ------------------------------


def test_verifier_config_names_the_verdict_modules_and_the_kill_tests(tmp_path: Path) -> None:
    out = tmp_path / "cr.toml"
    assert mp.main(["config", "--out", str(out), "--scope", "verifier", "--hard", "200"]) == 0
    cfg = tomllib.loads(out.read_text())["cosmic-ray"]
    assert cfg["module-path"] == list(mp.VERIFIER_MODULES)
    for m in (*mp.VERIFIER_MODULES, *mp.VERIFIER_TESTS):
        assert (ROOT / m.split("::")[0]).is_file(), m
    assert "--scope verifier" in cfg["test-command"]
    cmd = mp.test_command(7)
    assert "--hypothesis-seed=7" in cmd and cmd[1:3] == ["-m", "pytest"] and "-x" in cmd
    assert list(mp.VERIFIER_TESTS) == cmd[-len(mp.VERIFIER_TESTS):]
    one = tmp_path / "one.toml"
    assert mp.main(["config", "--out", str(one), "--scope", "verifier",
                    "--modules", "model/incremental.py", "--tests", "tests/model/x.py"]) == 0
    cfg = tomllib.loads(one.read_text())["cosmic-ray"]
    assert cfg["module-path"] == ["model/incremental.py"]
    assert "--tests tests/model/x.py" in cfg["test-command"]
    assert mp.main(["config", "--out", str(one), "--modules", "model/incremental.py"]) == 2


def test_only_the_comparing_functions_of_lockstep_are_mutated() -> None:
    tree = ast.parse((ROOT / "verify/conformance/lockstep.py").read_text())
    spans = mp.function_spans(tree, mp.ONLY_FUNCTIONS["verify/conformance/lockstep.py"])
    names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert set(mp.ONLY_FUNCTIONS["verify/conformance/lockstep.py"]) <= names
    assert len(spans) >= 4
    check = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                 and n.name == "check")
    step = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "step")
    inside = ((check.body[0].lineno, 0), (check.body[0].lineno, 1))
    outside = ((step.body[0].lineno, 0), (step.body[0].lineno, 1))
    assert any(a <= inside[0] and inside[1] <= b for a, b in spans)
    assert not any(a <= outside[0] and outside[1] <= b for a, b in spans)


def test_per_module_sample_is_bounded_and_deterministic() -> None:
    pool = _mutants({"model/fastcheck.py": 300, "model/incremental.py": 5})
    a = mp.per_module_sample(pool, 20, seed=12)
    assert a == mp.per_module_sample(list(reversed(pool)), 20, seed=12)
    per = {m: sum(x.module == m for x in a) for m in ("model/fastcheck.py", "model/incremental.py")}
    assert per == {"model/fastcheck.py": 20, "model/incremental.py": 5}
    assert mp.per_module_sample(pool, 20, seed=13) != a


def test_pytest_exit_status_mapping() -> None:
    assert mp.classify_pytest(0, False) == ("survived", mp.EXIT_SURVIVED)
    assert mp.classify_pytest(1, False) == ("killed", mp.EXIT_KILLED)
    assert mp.classify_pytest(2, False) == ("crashed", mp.EXIT_KILLED)  # collection error
    assert mp.classify_pytest(None, True) == ("timeout", mp.EXIT_KILLED)
    for rc in (3, 4, 5):  # internal error, usage error, no tests: the probe's fault
        verdict, code = mp.classify_pytest(rc, False)
        assert verdict.startswith("error") and code == mp.EXIT_ERROR


@pytest.mark.slow
def test_the_verifier_scope_runs_end_to_end(tmp_path: Path) -> None:
    """scripts/mutation.sh --verifier on a tiny scope: one module, two mutants drawn by
    seed, killed (or not) by one quick test file; it reports a score."""
    venv_python = ROOT / ".venv" / "bin" / "python"
    if not venv_python.exists() or subprocess.run(
            [str(venv_python), "-c", "import cosmic_ray"], capture_output=True).returncode:
        pytest.skip("cosmic-ray is not installed in .venv (pip install -e '.[mutation]')")
    bash = shutil.which("bash")
    assert bash is not None
    out = tmp_path / "out"
    env = {**__import__("os").environ, "MUTATION_MODULES": "model/incremental.py",
           "MUTATION_PER_MODULE": "2", "MUTATION_SEED": "3",
           "MUTATION_TESTS": "tests/model/test_incremental.py",
           "MUTATION_WORK": str(tmp_path / "work"), "MUTATION_OUT": str(out)}
    proc = subprocess.run([bash, str(SCRIPT), "--verifier"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    score = json.loads((out / "score.json").read_text())
    assert score["scope"] == "verifier"
    assert score["killed"] + score["crashed"] + score["timeout"] + score["survived"] == 2
    assert score["score"] is not None and 0 <= score["score"] <= 1
    assert set(score["per_module"]) == set(mp.VERIFIER_MODULES)
    assert json.loads((out / "filter.json").read_text())["to_run_per_module"] == {
        "model/incremental.py": 2}
    bad = subprocess.run([bash, str(SCRIPT), "--verify"], cwd=ROOT, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "--verifier" in bad.stderr


def test_each_verifier_mutant_runs_its_modules_tests(tmp_path: Path) -> None:
    """The runner finds the mutated module by content (against the hashes config wrote next
    to the configuration) and runs the tests that cover it; unmutated (the baseline), all."""
    for m in mp.VERIFIER_MODULES:
        (tmp_path / m).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / m, tmp_path / m)
    assert mp.mutated_modules(tmp_path) == list(mp.VERIFIER_MODULES)  # no baseline yet
    (tmp_path / mp.BASELINE).write_text(json.dumps(mp.module_hashes(tmp_path,
                                                                    mp.VERIFIER_MODULES)))
    assert mp.mutated_modules(tmp_path) == list(mp.VERIFIER_MODULES)  # nothing mutated
    target = tmp_path / "verify/traces/tracecheck.py"
    target.write_text(target.read_text().replace("!=", "==", 1))
    assert mp.mutated_modules(tmp_path) == ["verify/traces/tracecheck.py"]
    tests = mp.kill_tests(["verify/traces/tracecheck.py"])
    assert tests[0] == mp.TEETH and "tests/traces/test_event_logs.py" in tests
    assert set(mp.VERIFIER_KILL_TESTS) == set(mp.VERIFIER_MODULES)
    assert mp.kill_tests(list(mp.VERIFIER_MODULES)) == list(mp.VERIFIER_TESTS)
    out = tmp_path / "cfg" / "cr.toml"
    out.parent.mkdir()
    assert mp.main(["config", "--out", str(out), "--scope", "verifier"]) == 0
    assert set(json.loads((out.parent / mp.BASELINE).read_text())) == set(mp.VERIFIER_MODULES)
