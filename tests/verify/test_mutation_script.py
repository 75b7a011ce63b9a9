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
