"""Generic mutation testing with cosmic-ray (`scripts/mutation.sh`), in two scopes: `impl`
(the implementation, judged by the default fuzz campaign) and `verifier` (the code that
decides verdicts, judged by the tests that cover it: `scripts/mutation.sh --verifier`).

The script copies the tree to a scratch directory and drives cosmic-ray there; this module
is its Python half, one subcommand per step:

    config  write the cosmic-ray TOML for the scope's mutated modules
    filter  mark mutants that cannot matter as skipped, then draw the (stratified) sample
    run     the per-mutant test command: the default fuzz campaign (impl) or the verifier's
            kill tests (verifier), with a hard timeout; exit 0 survived, 1 killed (or timed
            out), 3 an error of the campaign or test run itself (usage error, no report),
            which `report` does not count as a kill
    report  score.json and survivors.md from a finished (or interrupted) session

cosmic-ray is an optional dependency (`pip install -e ".[mutation]"`); it is imported
lazily so that the rest of the kit (and mypy) never needs it.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The modules whose mutants count (relative to the repository root).
MODULES: tuple[str, ...] = (
    "impl/kvcache.py",
    "impl/storage.py",
    "impl/eviction.py",
    "impl/allocator.py",
    "impl/radix.py",
    "impl/undo.py",
)

# The code that decides verdicts: the lockstep comparison and views, the trace checker, the
# invariants and their derived checks, the data oracle (`scripts/mutation.sh --verifier`).
VERIFIER_MODULES: tuple[str, ...] = (
    "verify/conformance/abstraction.py",
    "verify/conformance/views.py",
    "verify/conformance/lockstep.py",
    "verify/traces/tracecheck.py",
    "model/invariants.py",
    "model/fastcheck.py",
    "model/incremental.py",
    "verify/oracles/data.py",
)
SCOPES: dict[str, tuple[str, ...]] = {"impl": MODULES, "verifier": VERIFIER_MODULES}
# Modules of which only some functions decide verdicts: mutants elsewhere are filtered
# (lockstep.py also drives the two sides; its comparing parts are these).
ONLY_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "verify/conformance/lockstep.py": ("check", "_check_queries", "_collect_data", "finish"),
}
# The tests that kill verifier mutants: per module, the ones that cover it, quick enough to
# run per mutant (Hypothesis seeded, so a verdict does not depend on the run). The runner
# finds the mutated module by its content (`baseline_hashes`), so each mutant runs its
# module's tests only; the structural tests (`test_verifier_teeth.py`) come first.
TEETH = "tests/quality/test_verifier_teeth.py"
_MODEL_TESTS = (TEETH, "tests/model/test_fastcheck.py", "tests/model/test_incremental.py")
_LOCKSTEP_TESTS = (TEETH, "tests/quality/test_reach.py", "tests/conformance/test_regressions.py")
VERIFIER_KILL_TESTS: dict[str, tuple[str, ...]] = {
    "verify/conformance/abstraction.py": _LOCKSTEP_TESTS,
    "verify/conformance/views.py": _LOCKSTEP_TESTS,
    "verify/conformance/lockstep.py": _LOCKSTEP_TESTS,
    "verify/traces/tracecheck.py": (TEETH, "tests/traces/test_event_logs.py",
                                    "tests/traces/test_integrator_defects.py"),
    # the spec's catalogue (docs/spec.md) is generated from the invariants' statements
    "model/invariants.py": (*_MODEL_TESTS,
                            "tests/test_docs.py::test_generated_sections_are_current[spec.md]"),
    "model/fastcheck.py": _MODEL_TESTS,
    "model/incremental.py": _MODEL_TESTS,
    "verify/oracles/data.py": ("tests/oracles/test_oracle.py", TEETH, "tests/impl/test_stream_sim.py"),
}
VERIFIER_TESTS: tuple[str, ...] = tuple(dict.fromkeys(
    t for ts in VERIFIER_KILL_TESTS.values() for t in ts))
BASELINE = "mutation-baseline.json"  # the scope's modules' hashes, unmutated (config)

MARK = "kvpocket-mutation:"  # the runner's verdict line, read back by `report`
EXIT_SURVIVED, EXIT_KILLED, EXIT_ERROR = 0, 1, 3

# Reasons a mutant is skipped before it runs (stored as the skipped result's output).
SKIP_MESSAGE = "filtered: exception message"
SKIP_ANNOTATION = "filtered: type annotation"
SKIP_SAMPLE = "not sampled"
SKIP_SHARD = "other shard"  # run by another worker's copy (MUTATION_WORKERS > 1)
SKIP_OUTSIDE = "filtered: not verdict code"  # outside ONLY_FUNCTIONS of its module

# ---- config ----------------------------------------------------------------------------
def _toml_str(s: str) -> str:
    return json.dumps(s)  # a TOML basic string for the ASCII paths and commands used here


def config_text(test_command: str, timeout_s: float,
                exclude_operators: Sequence[str] = (), scope: str = "impl",
                modules: Sequence[str] = ()) -> str:
    """The cosmic-ray configuration: the scope's modules (or `modules` of them), the local
    distributor, one worker."""
    mods = ", ".join(_toml_str(m) for m in (modules or SCOPES[scope]))
    excl = ", ".join(_toml_str(e) for e in exclude_operators)
    return (
        "[cosmic-ray]\n"
        f"module-path = [{mods}]\n"
        f"timeout = {float(timeout_s)}\n"
        "excluded-modules = []\n"
        f"test-command = {_toml_str(test_command)}\n"
        "\n[cosmic-ray.distributor]\n"
        'name = "local"\n'
        "\n[cosmic-ray.filters.operators-filter]\n"
        f"exclude-operators = [{excl}]\n"
    )


# ---- filters ---------------------------------------------------------------------------
Pos = tuple[int, int]


def _start(n: ast.AST) -> Pos:
    return (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))


def _end(n: ast.AST) -> Pos:
    return (getattr(n, "end_lineno", None) or 0, getattr(n, "end_col_offset", None) or 0)


Span = tuple[str, Pos, Pos]


def _span(reason: str, n: ast.AST) -> Span:
    return (reason, _start(n), _end(n))


def skip_spans(tree: ast.Module) -> list[Span]:
    """Source spans whose mutants cannot change behaviour, with the reason.

    - the arguments of `raise SomeError(...)` that are string literals or f-strings, and
      `__repr__`/`__str__`: message text, which the campaign never compares (it compares
      error types and states);
    - type annotations in a module with `from __future__ import annotations`: they are
      strings at run time (`int | None` -> `int ^ None` is never evaluated).
    """
    spans: list[Span] = []
    postponed = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                    and any(a.name == "annotations" for a in n.names) for n in tree.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            spans += [_span(SKIP_MESSAGE, a)
                      for a in [*node.exc.args, *(k.value for k in node.exc.keywords)]
                      if isinstance(a, ast.JoinedStr | ast.Constant)]
        if isinstance(node, ast.FunctionDef) and node.name in ("__repr__", "__str__"):
            spans.append(_span(SKIP_MESSAGE, node))
        if postponed:
            if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
                spans.append(_span(SKIP_ANNOTATION, node.annotation))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
                spans.append(_span(SKIP_ANNOTATION, node.returns))
    return spans


def function_spans(tree: ast.Module, functions: Sequence[str]) -> list[tuple[Pos, Pos]]:
    """The spans of the functions (any nesting) named `functions`: the only code of the
    module whose mutants run."""
    return [(_start(n), _end(n)) for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name in functions]


def skip_reason(spans: Sequence[Span], start: Pos, end: Pos) -> str | None:
    """Why a mutant is filtered out before it runs, or None if it runs."""
    for reason, a, b in spans:
        if a <= start and end <= b:
            return reason
    return None


@dataclass(frozen=True)
class Mutant:
    job_id: str
    module: str
    operator: str
    occurrence: int
    start: tuple[int, int]
    end: tuple[int, int]

    @property
    def key(self) -> str:
        """A stable name: path:line:col operator#occurrence."""
        return f"{self.module}:{self.start[0]}:{self.start[1]} {self.operator}#{self.occurrence}"


def _cr(name: str) -> Any:
    return importlib.import_module(name)


def _mutant(item: Any) -> Mutant:
    m = item.mutations[0]
    return Mutant(item.job_id, str(m.module_path), str(m.operator_name).removeprefix("core/"),
                  int(m.occurrence), (int(m.start_pos[0]), int(m.start_pos[1])),
                  (int(m.end_pos[0]), int(m.end_pos[1])))


def stratified_sample(mutants: Sequence[Mutant], n: int, seed: int) -> list[Mutant]:
    """Exactly `n` mutants (or all), allocated to modules in proportion to their counts
    (largest remainder; at least one per module when n allows), drawn with a fixed seed
    from a sorted list."""
    by_mod: dict[str, list[Mutant]] = defaultdict(list)
    for m in sorted(mutants, key=lambda m: (m.module, m.start, m.end, m.operator, m.occurrence)):
        by_mod[m.module].append(m)
    total = len(mutants)
    if n >= total:
        return [m for ms in by_mod.values() for m in ms]
    quota = {k: n * len(v) / total for k, v in by_mod.items()}
    alloc = {k: math.floor(q) for k, q in quota.items()}
    for k in sorted(quota, key=lambda k: (alloc[k] - quota[k], k)):  # largest remainder first
        if sum(alloc.values()) >= n:
            break
        alloc[k] += 1
    if n >= len(by_mod):  # every module gets at least one, taken from the largest share
        for k in sorted(by_mod):
            if alloc[k] == 0:
                big = max(alloc, key=lambda j: (alloc[j], j))
                alloc[big] -= 1
                alloc[k] = 1
    picked: list[Mutant] = []
    for k in sorted(by_mod):
        rng = random.Random(f"{seed}:{k}")
        picked.extend(rng.sample(by_mod[k], min(alloc[k], len(by_mod[k]))))
    return picked


def per_module_sample(mutants: Sequence[Mutant], n: int, seed: int) -> list[Mutant]:
    """At most `n` mutants of each module, drawn with a fixed seed from a sorted list (a
    bounded campaign that still tries every module, the small ones included)."""
    by_mod: dict[str, list[Mutant]] = defaultdict(list)
    for m in sorted(mutants, key=lambda m: (m.module, m.start, m.end, m.operator, m.occurrence)):
        by_mod[m.module].append(m)
    return [m for k in sorted(by_mod)
            for m in random.Random(f"{seed}:{k}").sample(by_mod[k], min(n, len(by_mod[k])))]


def cmd_filter(args: argparse.Namespace) -> int:
    work_db = _cr("cosmic_ray.work_db")
    wi = _cr("cosmic_ray.work_item")
    root = Path(args.root)
    counts: Counter[str] = Counter()
    with work_db.use_db(args.session, work_db.WorkDB.Mode.open) as db:
        pending = [_mutant(item) for item in db.pending_work_items]
        cache: dict[str, tuple[list[Span], list[tuple[Pos, Pos]] | None]] = {}
        keep: list[Mutant] = []
        for m in pending:
            if m.module not in cache:
                tree = ast.parse((root / m.module).read_text())
                only = ONLY_FUNCTIONS.get(m.module)
                cache[m.module] = (skip_spans(tree),
                                   None if only is None else function_spans(tree, only))
            spans, inside = cache[m.module]
            reason = skip_reason(spans, m.start, m.end)
            if reason is None and inside is not None and not any(
                    a <= m.start and m.end <= b for a, b in inside):
                reason = SKIP_OUTSIDE
            if reason is None:
                keep.append(m)
                continue
            counts[reason] += 1
            db.set_result(m.job_id, wi.WorkResult(output=reason, worker_outcome=wi.WorkerOutcome.SKIPPED))
        if args.per_module:
            chosen = per_module_sample(keep, args.per_module, args.seed)
        else:
            chosen = keep if args.sample == "all" else \
                stratified_sample(keep, int(args.sample), args.seed)
        chosen_ids = {m.job_id for m in chosen}
        dropped = [m.job_id for m in keep if m.job_id not in chosen_ids]
        if dropped:
            db.set_multiple_results(dropped, wi.WorkResult(output=SKIP_SAMPLE,
                                                           worker_outcome=wi.WorkerOutcome.SKIPPED))
        counts[SKIP_SAMPLE] = len(dropped)
    summary = {"pending_before": len(pending), "after_filters": len(keep), "to_run": len(chosen),
               **{k: v for k, v in counts.items()},
               "to_run_per_module": dict(sorted(Counter(m.module for m in chosen).items()))}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def cmd_shard(args: argparse.Namespace) -> int:
    """Keep every `of`-th pending mutant (sorted by key) in this copy's session."""
    work_db = _cr("cosmic_ray.work_db")
    wi = _cr("cosmic_ray.work_item")
    with work_db.use_db(args.session, work_db.WorkDB.Mode.open) as db:
        pending = sorted((_mutant(item) for item in db.pending_work_items), key=lambda m: m.key)
        other = [m.job_id for n, m in enumerate(pending) if n % args.of != args.index]
        if other:
            db.set_multiple_results(other, wi.WorkResult(output=SKIP_SHARD,
                                                         worker_outcome=wi.WorkerOutcome.SKIPPED))
    print(f"shard {args.index}/{args.of}: {len(pending) - len(other)} mutants")
    return 0


# ---- the per-mutant test command -------------------------------------------------------
def repo_root() -> Path:
    """The tree this module was imported from (the scratch copy when mutation runs)."""
    return Path(__file__).resolve().parents[2]


def fuzz_command(budget_s: float, seed: int, out_dir: str, python: str = sys.executable,
                 examples: int = 0) -> list[str]:
    """The default campaign on one worker: on an example budget when `examples` (the same
    verdict on any machine, and the examples-to-kill reported), else on `budget_s`."""
    budget = ["--total-examples", str(examples)] if examples else \
        ["--minutes", f"{budget_s / 60:.4f}"]
    return [python, "-m", "kvpocket.verify.cli", "fuzz", *budget, "--json",
            str(Path(out_dir) / "report.json"), "--workers", "1", "--seed", str(seed), "--out",
            out_dir, "--no-progress"]


def examples_to_kill(report: Path) -> int | None:
    """The failing example's place in the campaign's plan, from its JSON report."""
    try:
        failures = json.loads(report.read_text()).get("failures") or []
        return int(failures[0]["examples"]) if failures else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def classify_exit(rc: int | None, timed_out: bool) -> tuple[str, int]:
    """The campaign's exit status -> (verdict, exit status for cosmic-ray)."""
    if timed_out:
        return "timeout", EXIT_KILLED
    if rc == 0:
        return "survived", EXIT_SURVIVED
    if rc == 1:
        return "killed", EXIT_KILLED
    return f"error rc={rc}", EXIT_ERROR  # 2 (usage) or a signal: the probe, not the mutant


def test_command(seed: int, tests: Sequence[str] = VERIFIER_TESTS,
                 python: str = sys.executable) -> list[str]:
    """The verifier scope's kill tests: stop at the first failure, Hypothesis seeded."""
    return [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header",
            f"--hypothesis-seed={seed}", "-m", "not slow and not gpu", *tests]


def classify_pytest(rc: int | None, timed_out: bool) -> tuple[str, int]:
    """pytest's exit status -> (verdict, exit status for cosmic-ray): 1 a test failed;
    2 a collection error (the mutant broke an import: a crash); 3-5 the run itself."""
    if not timed_out and rc == 2:
        return "crashed", EXIT_KILLED
    if not timed_out and rc is not None and rc >= 3:
        return f"error rc={rc}", EXIT_ERROR
    return classify_exit(rc, timed_out)


def module_hashes(root: Path, modules: Sequence[str]) -> dict[str, str]:
    return {m: hashlib.sha256((root / m).read_bytes()).hexdigest() for m in modules}


def mutated_modules(root: Path) -> list[str]:
    """The verifier modules whose content differs from the baseline config wrote (the one
    cosmic-ray mutated); every module when there is no baseline."""
    try:
        base = json.loads((root / BASELINE).read_text())
    except (OSError, ValueError):
        return list(VERIFIER_MODULES)
    now = module_hashes(root, list(base))
    return [m for m in base if now[m] != base[m]] or list(VERIFIER_MODULES)


def kill_tests(modules: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(t for m in modules for t in VERIFIER_KILL_TESTS.get(m, ())))


def cmd_run(args: argparse.Namespace) -> int:
    root = repo_root()
    env = dict(os.environ, PYTHONPATH=str(root / ".devpath"), PYTHONDONTWRITEBYTECODE="1")
    t0 = time.monotonic()
    verifier = args.scope == "verifier"
    with tempfile.TemporaryDirectory(prefix="kvmut-") as out:
        cmd = test_command(args.seed, _listed(args.tests) or kill_tests(mutated_modules(root))) \
            if verifier else \
            fuzz_command(args.budget, args.seed, out, examples=args.examples)
        proc = subprocess.Popen(cmd, cwd=root, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        timed_out = False
        try:
            output, _ = proc.communicate(timeout=args.hard)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                proc.kill()
            output, _ = proc.communicate()
        kill_at = examples_to_kill(Path(out) / "report.json")
    text = output.decode("utf-8", "replace")
    verdict, code = (classify_pytest if verifier else classify_exit)(proc.returncode, timed_out)
    if verifier:
        failed = [ln for ln in text.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        print("\n".join(failed[:1] or text.splitlines()[-4:]))
        print(f"{MARK} {verdict} seconds={time.monotonic() - t0:.1f}")
        return code
    if verdict == "killed" and "Traceback (most recent call last)" in text and "fuzz campaign" not in text:
        verdict = "crashed"  # the CLI died before reporting: still a kill, counted apart
    lines = text.splitlines()
    tail = [ln for ln in lines if ln.startswith("failure")][:1] or lines[-8:]
    print("\n".join(tail))
    at = f" examples={kill_at}" if kill_at is not None and verdict == "killed" else ""
    print(f"{MARK} {verdict} seconds={time.monotonic() - t0:.1f}{at}")
    return code


# ---- report ----------------------------------------------------------------------------
def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for k successes out of n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def verdict_of(output: str | None) -> tuple[str | None, float | None]:
    """The runner's verdict line: (verdict, seconds)."""
    for ln in reversed((output or "").splitlines()):
        if ln.startswith(MARK):
            words = ln[len(MARK):].split()
            secs = [float(w.split("=", 1)[1]) for w in words if w.startswith("seconds=")]
            verdict = " ".join(w for w in words
                               if not w.startswith(("seconds=", "examples=")))
            return verdict, (secs[0] if secs else None)
    return None, None


def kill_examples_of(output: str | None) -> int | None:
    """The runner's examples-to-kill (campaigns on an example budget), if it printed one."""
    for ln in reversed((output or "").splitlines()):
        if ln.startswith(MARK):
            found = [w.split("=", 1)[1] for w in ln.split() if w.startswith("examples=")]
            return int(found[0]) if found else None
    return None


def load_equivalents(path: str | None) -> dict[str, str]:
    """`key<TAB>reason` lines (see Mutant.key); '#' starts a comment."""
    if not path or not Path(path).exists():
        return {}
    eq = {}
    for ln in Path(path).read_text().splitlines():
        if ln.strip() and not ln.lstrip().startswith("#"):
            key, _, reason = ln.partition("\t")
            eq[key.strip()] = reason.strip()
    return eq


def summarize(rows: Sequence[tuple[Mutant, str]], total: int, equivalents: dict[str, str]) -> dict[str, Any]:
    """rows: (mutant, outcome) with outcome in killed/crashed/timeout/survived/error/
    incompetent/skipped:<reason>/pending."""
    c = Counter(o for _, o in rows)
    survivors = [m for m, o in rows if o == "survived"]
    equiv = [m for m in survivors if m.key in equivalents]
    killed = c["killed"] + c["crashed"] + c["timeout"]
    scored = killed + len(survivors)
    real = scored - len(equiv)
    lo, hi = wilson(killed, real)
    raw_lo, raw_hi = wilson(killed, scored)
    return {
        "mutants_total": total,
        "skipped_exception_message": c["skipped:" + SKIP_MESSAGE],
        "skipped_type_annotation": c["skipped:" + SKIP_ANNOTATION],
        "skipped_other_filters": sum(v for k, v in c.items() if k.startswith("skipped:")
                                     and k not in ("skipped:" + SKIP_MESSAGE,
                                                   "skipped:" + SKIP_ANNOTATION, "skipped:" + SKIP_SAMPLE,
                                                   "skipped:" + SKIP_OUTSIDE)),
        "skipped_not_verdict_code": c["skipped:" + SKIP_OUTSIDE],
        "not_sampled": c["skipped:" + SKIP_SAMPLE],
        "after_filters": total - sum(v for k, v in c.items() if k.startswith("skipped:")
                                     and k != "skipped:" + SKIP_SAMPLE),
        "run": scored + c["error"] + c["incompetent"],
        "pending": c["pending"],
        "killed": c["killed"],
        "crashed": c["crashed"],
        "timeout": c["timeout"],
        "survived": len(survivors),
        "survived_equivalent": len(equiv),
        "error": c["error"],
        "incompetent": c["incompetent"],
        "score_raw": round(killed / scored, 4) if scored else None,
        "score_raw_ci95": [round(raw_lo, 4), round(raw_hi, 4)],
        "score": round(killed / real, 4) if real else None,
        "score_ci95": [round(lo, 4), round(hi, 4)],
        "score_note": "killed (incl. crashed, timeout) / (killed + survived - equivalent); "
                      "error and incompetent are excluded; the interval is Wilson's (95%) over "
                      "the mutants run",
    }


def _outcome(result: Any) -> str:
    if result is None:
        return "pending"
    wo = str(getattr(result.worker_outcome, "value", result.worker_outcome))
    if wo == "skipped":
        return f"skipped:{result.output}"
    if wo in ("exception", "abnormal", "no-test"):
        return "incompetent"
    to = str(getattr(result.test_outcome, "value", result.test_outcome))
    if to == "incompetent":
        return "incompetent"
    if to == "survived":
        return "survived"
    v = verdict_of(result.output)[0] or ("timeout" if result.output == "timeout" else "killed")
    if v.startswith("error"):
        return "error"
    return v if v in ("killed", "crashed", "timeout") else "killed"


def cmd_report(args: argparse.Namespace) -> int:
    work_db = _cr("cosmic_ray.work_db")
    done: dict[str, Any] = {}
    items: dict[str, Any] = {}
    for session in args.sessions:  # shards: one copy of the same session each
        with work_db.use_db(session, work_db.WorkDB.Mode.open) as db:
            for item, res in db.completed_work_items:
                if res.output != SKIP_SHARD or item.job_id not in done:
                    done[item.job_id] = res
            items.update((item.job_id, item) for item in db.work_items)
    rows: list[tuple[Mutant, str]] = []
    diffs: dict[str, str] = {}
    for item in items.values():
        m = _mutant(item)
        res = done.get(item.job_id)
        if res is not None and res.output == SKIP_SHARD:
            res = None  # its own shard never got to it
        rows.append((m, _outcome(res)))
        if res is not None and res.diff:
            diffs[m.job_id] = res.diff
    eq = load_equivalents(args.equivalents)
    score = summarize(rows, len(items), eq)
    secs = [x for x in (verdict_of(r.output)[1] for r in done.values() if r is not None) if x is not None]
    score["seconds_per_mutant"] = round(sum(secs) / len(secs), 2) if secs else None
    score["seconds_total"] = round(sum(secs), 1)
    kills = sorted(x for x in (kill_examples_of(r.output) for r in done.values()
                               if r is not None) if x is not None)
    if kills:  # the machine-independent measure, with MUTATION_EXAMPLES
        score["examples_to_kill"] = {"median": statistics.median(kills), "worst": kills[-1]}
    score["scope"] = args.scope
    score["per_module"] = {
        mod: dict(Counter(o for m, o in rows if m.module == mod and not o.startswith("skipped")))
        for mod in SCOPES[args.scope]
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "score.json").write_text(json.dumps(score, indent=2) + "\n")
    lines = ["# Surviving mutants", ""]
    for m, o in sorted(rows, key=lambda r: r[0].key):
        if o in ("survived", "error", "incompetent"):
            tag = f" (equivalent: {eq[m.key]})" if m.key in eq else ""
            lines += [f"## {m.key} [{o}]{tag}", "", "```diff", diffs.get(m.job_id, "").strip(), "```", ""]
    (out / "survivors.md").write_text("\n".join(lines))
    print(json.dumps({k: v for k, v in score.items() if k != "per_module"}, indent=2))
    return 0


# ---- CLI -------------------------------------------------------------------------------
def _listed(text: str | None) -> list[str]:
    return [e for e in (text or "").split(",") if e]


def cmd_config(args: argparse.Namespace) -> int:
    modules = _listed(args.modules)
    unknown = [m for m in modules if m not in SCOPES[args.scope]]
    if unknown:
        print(f"mutation_probe: --modules: {', '.join(unknown)} not in the {args.scope} scope "
              f"(allowed: {', '.join(SCOPES[args.scope])})", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "kvpocket.verify.quality.mutation_probe", "run",
               "--budget", str(args.budget), "--hard", str(args.hard), "--seed", str(args.seed),
               "--examples", str(args.examples), "--scope", args.scope]
    if args.tests:
        command += ["--tests", args.tests]
    excl = _listed(args.exclude_operators)
    if args.scope == "verifier":  # what the runner (in the tree of `--out`) compares with
        (Path(args.out).parent / BASELINE).write_text(
            json.dumps(module_hashes(repo_root(), VERIFIER_MODULES)) + "\n")
    Path(args.out).write_text(config_text(" ".join(command), args.hard + 30, excl, args.scope,
                                          modules))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mutation_probe", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("config")
    c.add_argument("--out", required=True)
    c.add_argument("--budget", type=float, default=15.0)
    c.add_argument("--hard", type=float, default=45.0)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--exclude-operators", default="")
    c.add_argument("--examples", type=int, default=0)
    c.add_argument("--scope", choices=sorted(SCOPES), default="impl")
    c.add_argument("--modules", default="", help="comma-separated: only these of the scope")
    c.add_argument("--tests", default="", help="comma-separated: the verifier's kill tests "
                   "instead of VERIFIER_TESTS")
    c.set_defaults(fn=cmd_config)
    f = sub.add_parser("filter")
    f.add_argument("session")
    f.add_argument("--root", default=".")
    f.add_argument("--sample", default="all")
    f.add_argument("--seed", type=int, default=12)
    f.add_argument("--json")
    f.add_argument("--per-module", type=int, default=0,
                   help="at most this many mutants per module instead of --sample")
    f.set_defaults(fn=cmd_filter)
    sh = sub.add_parser("shard")
    sh.add_argument("session")
    sh.add_argument("--index", type=int, required=True)
    sh.add_argument("--of", type=int, required=True)
    sh.set_defaults(fn=cmd_shard)
    r = sub.add_parser("run")
    r.add_argument("--budget", type=float, default=15.0)
    r.add_argument("--hard", type=float, default=45.0)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--examples", type=int, default=0)
    r.add_argument("--scope", choices=sorted(SCOPES), default="impl")
    r.add_argument("--tests", default="")
    r.set_defaults(fn=cmd_run)
    rep = sub.add_parser("report")
    rep.add_argument("sessions", nargs="+")
    rep.add_argument("--out", required=True)
    rep.add_argument("--equivalents")
    rep.add_argument("--scope", choices=sorted(SCOPES), default="impl")
    rep.set_defaults(fn=cmd_report)
    args = p.parse_args(argv)
    code: int = args.fn(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
