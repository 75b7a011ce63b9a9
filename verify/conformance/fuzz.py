"""Fuzz campaigns: the lockstep machine under Hypothesis, with progress, a report,
rare-state coverage, and reproducers for every failure.

A failure is shrunk by Hypothesis and written twice: a trace (JSON lines) that
`kvpocket replay` runs, and a standalone pytest file that fails while the bug
is there. Several workers run as separate processes sharing one example
database (a directory, or Redis for several machines).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.errors import FailedHealthCheck, InvalidArgument
from hypothesis.stateful import get_state_machine_test

from kvpocket.model import overrides
from kvpocket.model.config import KVConfig, PocketPolicy
from kvpocket.verify import interrupts, patching
from kvpocket.verify.conformance.guards import PREFIX as GUARD_PREFIX
from kvpocket.verify.conformance.guards import can_fill_pocket, expected_guard_states
from kvpocket.verify.conformance.lockstep import CHECKS, RARE_STATES
from kvpocket.verify.conformance.profiles import PROFILES, hypothesis_settings, only_the_seed, seeded
from kvpocket.verify.conformance.progress import CampaignProgress
from kvpocket.verify.conformance.replay import OVERRIDES_KEY, replay
from kvpocket.verify.conformance.shrink import minimize
from kvpocket.verify.conformance.speed import HEAP_COMPACTED
from kvpocket.verify.conformance.stateful import STATS, drawn_machine_for, machine_for
from kvpocket.verify.traces.trace import OutputError, Trace, TraceStep, unused_path, write_atomic


def expected_rare_states(cfg: KVConfig) -> list[str]:
    """The rare states a campaign on this configuration must reach to not be vacuous: those
    of `RARE_STATES` it can reach, then every guard combination it can have
    (`guards.expected_guard_states`)."""
    return [*_expected_classic(cfg), *expected_guard_states(cfg)]


def rare_state_counts(rare: Counter[str], expected: list[str]) -> dict[str, int]:
    """A report's rare-state table: every state of `RARE_STATES`, then the guard
    combinations expected or reached, by name."""
    guards = sorted({n for n in rare if n.startswith(GUARD_PREFIX)}
                    | {n for n in expected if n.startswith(GUARD_PREFIX)})
    return {name: rare.get(name, 0) for name in (*RARE_STATES, *guards)}


def _expected_classic(cfg: KVConfig) -> list[str]:
    out = ["prefix reused", "injected failure rolled back", "shrunk by several blocks",
           HEAP_COMPACTED]
    if cfg.num_levels > 1:
        out += ["committed page dropped", "resumed from a lower level"]
        if cfg.num_sequences > 1:
            out.append("resumed from a lower level into a full GPU")
    if cfg.num_sequences > 1 and all(lc.is_swa and not lc.sink_tokens
                                     for lc in cfg.life_cycles):
        # every page of a committed block can leave the window while its node lives on
        out.append("committed onto a node whose pages were dropped")
    if cfg.num_levels > 2:
        out += ["cascade below host", "nested make-room rolled back"]
    if any(lc.is_swa for lc in cfg.life_cycles):
        out += ["several blocks left the window at once", "stale block held for committing",
                "resumed with blocks held for committing"]
    if not cfg.pocket.enabled or not any(lc.is_swa for lc in cfg.life_cycles):
        return [name for name in RARE_STATES if name in out]
    out += ["parked", "popped", "pocket drained on suspend", "pocket drained on close",
            "OutOfPages with a non-empty pocket"]
    if can_fill_pocket(cfg):  # wide-pocket has the GPU room
        out += ["pocket full", "stale page released at pocket capacity"]
    if cfg.num_levels > 1 and cfg.pocket.policy != PocketPolicy.PIN:
        # An evicted parked page is dropped or migrated, as the configuration says; either
        # way a later pop must refuse it (revalidate).
        out.append("parked page dropped" if cfg.pocket.drops_parked else "parked page migrated")
        if cfg.pocket.policy == PocketPolicy.REVALIDATE:
            out.append("pop refused")
    return [name for name in RARE_STATES if name in out]


def open_database(spec: str | None, namespace: str = "") -> ExampleDatabase | None:
    """`DIR` or `redis://host:port/db`; None for no database. A namespace (a matrix cell)
    keeps one configuration's examples apart from another's: a sub-folder, or a key prefix."""
    if not spec:
        return None
    if spec.startswith("redis://"):
        # optional: the redis package, for a redis:// database only
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase

        prefix = f"hypothesis-example:{namespace}:" if namespace else "hypothesis-example:"
        return RedisExampleDatabase(redis.Redis.from_url(spec), key_prefix=prefix.encode())
    return DirectoryBasedExampleDatabase(str(Path(spec) / namespace) if namespace else spec)


class CampaignUsageError(Exception):
    """Hypothesis refused to run the campaign as asked (a failed health check, an invalid
    setting): a usage problem, reported with exit status 2, never as a found bug."""


class CampaignInterrupted(KeyboardInterrupt):
    """Ctrl-C during a campaign; `report` holds what ran before it (marked interrupted)."""

    def __init__(self, report: CampaignReport) -> None:
        super().__init__("interrupted")
        self.report = report


@dataclass
class Failure:
    message: str
    trace: str
    test: str
    steps: int
    unwritten: str = ""  # why its trace or reproducer could not be written (a full disk)


@dataclass
class CampaignReport:
    config: str
    policy: str
    backend: str
    seed: int
    workers: int
    examples: int = 0
    steps: int = 0
    seconds: float = 0.0
    steps_per_second: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    rare_states: dict[str, int] = field(default_factory=dict)
    coverage_gaps: list[str] = field(default_factory=list)
    max_pocket_occupancy: int = 0
    interrupted: bool = False  # Ctrl-C: the counts are those of the part that ran
    # Rare state -> the 1-based index of the first example that reached it (in the order
    # this worker ran its examples).
    first_reached: dict[str, int] = field(default_factory=dict)
    # Check (`lockstep.CHECKS`) -> the examples that ran it.
    checks: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CampaignSpec:
    """Everything a (worker) campaign needs, picklable."""

    config_name: str
    cfg: KVConfig
    profile: str = "dev"
    examples: int | None = None
    minutes: float | None = None
    steps: int | None = None
    seed: int = 0
    backend: str = "numpy"
    database: str | None = None
    out_dir: str = "kvpocket-out"
    batch: int = 20
    tag: str | None = None  # names the failure files (default: config-policy-seed-batch)
    namespace: str = ""  # the example database's namespace (a matrix cell)
    # Non-empty: every example draws its own configuration (`configs.kv_configs`) under one
    # of these policies; `cfg` then only names the campaign's policy.
    draw_policies: tuple[PocketPolicy, ...] = ()
    event_log_every: int = 0  # every k-th example also checks the event log (0: none)
    race_check: bool = True  # the simulator's race detector, in every example
    device_mirror: bool = True  # the simulator keeps device copies of what kernels read


def write_reproducers(spec: CampaignSpec, trace: list[tuple[str, dict[str, Any]]],
                      message: str, tag: str, cfg: KVConfig | None = None,
                      event_log: bool = False) -> Failure:
    """Shrink a failing trace and write it (with its full configuration: `cfg`, the
    example's own when it was drawn) as a trace and a pytest file."""
    out = Path(spec.out_dir)
    # Seeded bugs and spec overrides switched on: the reproducer needs them too.
    bugs, spec_mutant = patching.active_names(), overrides.active()
    extra: dict[str, Any] = {"seed": spec.seed, "config_name": spec.config_name,
                             **({patching.TRACE_KEY: bugs} if bugs else {}),
                             **({OVERRIDES_KEY: spec_mutant} if spec_mutant else {})}
    if event_log:
        extra["event_log"] = True  # replay checks the event log too
    if spec.backend == "numpy":  # and runs the simulator in the modes the example ran in
        extra.update({k: True for k in ("race_check", "device_mirror") if getattr(spec, k)})
    shrunk = Trace(cfg or spec.cfg, [TraceStep(a, p) for a, p in trace], source="fuzz",
                   backend=spec.backend, eager=False, extra=extra)
    t = minimize(shrunk)
    if len(t.steps) < len(shrunk.steps):
        result = replay(t)
        message = result.report or message
    trace_path = unused_path(out / f"failure-{tag}.jsonl")
    try:
        t.write(trace_path)
    except OutputError as exc:  # the finding stands and is reported; only its files are lost
        return Failure(message, str(trace_path), "", len(t.steps), unwritten=str(exc))
    test_path = unused_path(out / f"test_failure_{trace_path.stem[8:].replace('-', '_')}.py")
    first = message.splitlines()[0] if message else "failure"
    body = "\n".join(t.lines())
    notes: list[str] = []
    contexts: list[str] = []  # what the pytest reproducer switches on around the replay
    if bugs:
        notes.append(f"seeded bug switched on: {', '.join(bugs)}")
        contexts.append(f"switched_on({', '.join(repr(b) for b in bugs)})")
    if spec_mutant:
        notes.append(f"spec overridden: {', '.join(spec_mutant)}")
        contexts.append(f"overriding({spec_mutant!r})")
    on = "; ".join(notes)
    run = "result = replay(parse_trace(TRACE.splitlines()))\n"
    text = (
        f'"""Reproducer written by `kvpocket fuzz` (config {spec.config_name}, seed '
        f'{spec.seed}' + (f'; {on}' if on else '') + f').\n\n{first}\n"""\n\n'
        + ("from kvpocket.model.overrides import overriding\n" if spec_mutant else "")
        + "from kvpocket.verify.conformance.replay import replay\n"
        + ("from kvpocket.verify.quality.patches import switched_on\n" if bugs else "")
        + "from kvpocket.verify.traces.trace import parse_trace\n\n"
        f"TRACE = r'''\n{body}\n'''\n\n\n"
        "def test_reproduces() -> None:\n"
        + (f"    with {', '.join(contexts)}:\n        {run}" if contexts else f"    {run}")
        + "    assert result.ok, result.report\n"
    )
    try:
        write_atomic(test_path, text)
    except OutputError as exc:
        return Failure(message, str(trace_path), "", len(t.steps), unwritten=str(exc))
    return Failure(message, str(trace_path), str(test_path), len(t.steps))


def run_worker(spec: CampaignSpec, progress: Any = None) -> CampaignReport:
    """One process's campaign: batches of examples until the budget is spent or a failure."""
    profile = PROFILES[spec.profile]
    if spec.draw_policies:
        machine = drawn_machine_for(spec.draw_policies, backend=spec.backend,
                                    event_log_every=spec.event_log_every,
                                    event_log_offset=spec.seed, race_check=spec.race_check,
                                    device_mirror=spec.device_mirror)
    else:
        machine = machine_for(spec.cfg, backend=spec.backend,
                              event_log_every=spec.event_log_every,
                              event_log_offset=spec.seed, race_check=spec.race_check,
                              device_mirror=spec.device_mirror)
    db = open_database(spec.database, spec.namespace)
    report = CampaignReport(spec.config_name, spec.cfg.pocket.policy.value, spec.backend,
                            spec.seed, 1)
    rare: Counter[str] = Counter()
    start = time.monotonic()
    deadline = start + spec.minutes * 60 if spec.minutes else None
    remaining = spec.examples if spec.examples is not None else None
    batch_no = 0
    try:
        while True:
            n = min(spec.batch, remaining) if remaining is not None else spec.batch
            if (deadline is None and remaining is None) or profile.derandomize:
                # A derandomized profile draws the same examples in every batch: one batch.
                n = remaining if remaining is not None else profile.max_examples
            settings = hypothesis_settings(profile, max_examples=n, steps=spec.steps, database=db)
            test = get_state_machine_test(machine, settings=settings)
            # Derandomized or not, the examples come from the campaign's seed: Hypothesis's
            # own derandomization hashes the test's source, so an unrelated edit of the
            # machine would change every `ci` run (and the seed would be ignored).
            test = seeded(test, spec.seed * 100_003 + batch_no)
            STATS.reset()
            STATS.on_step = progress
            failed: BaseException | None = None
            try:
                with only_the_seed():
                    test()
            except (FailedHealthCheck, InvalidArgument) as exc:
                raise CampaignUsageError(_usage_message(exc, spec)) from None
            except KeyboardInterrupt:
                _absorb(report, rare)
                raise
            except Exception as exc:  # a divergence (or a crash) that Hypothesis shrank
                failed = exc
            _absorb(report, rare)
            if failed is not None:
                if STATS.failure is None:  # not a step of the lockstep: no finding to write
                    raise CampaignUsageError(
                        "the campaign stopped on an error that is not a finding (no failure "
                        f"trace written): {type(failed).__name__}: {failed}") from None
                trace, message = STATS.failure
                tag = spec.tag or (f"{spec.config_name}-{spec.cfg.pocket.policy.value}-"
                                   f"{spec.seed}-{batch_no}")
                report.failures.append(write_reproducers(
                    spec, trace, message, tag, STATS.failure_config, STATS.failure_event_log))
                break
            batch_no += 1
            if remaining is not None:
                remaining -= n
                if remaining <= 0:
                    break
            elif deadline is None or time.monotonic() >= deadline:
                break
    except KeyboardInterrupt:
        report.interrupted = True
        _finish(report, rare, spec, start)
        raise CampaignInterrupted(report) from None
    _finish(report, rare, spec, start)
    return report


def _absorb(report: CampaignReport, rare: Counter[str]) -> None:
    """Fold the batch that just ran (STATS) into the worker's report."""
    for name, index in STATS.first_reached.items():
        report.first_reached.setdefault(name, report.examples + index)
    report.examples += STATS.examples
    report.steps += STATS.steps
    rare.update(STATS.rare)
    report.max_pocket_occupancy = max(report.max_pocket_occupancy, STATS.max_pocket)
    add_checks(report.checks, STATS.checks)


def add_checks(into: dict[str, int], more: dict[str, int]) -> None:
    """Add examples per check (every check of `lockstep.CHECKS` named, in that order)."""
    for name in CHECKS:
        into[name] = into.get(name, 0) + more.get(name, 0)


def _finish(report: CampaignReport, rare: Counter[str], spec: CampaignSpec, start: float
            ) -> None:
    report.seconds = time.monotonic() - start
    report.steps_per_second = report.steps / report.seconds if report.seconds else 0.0
    report.rare_states = rare_state_counts(
        rare, [] if spec.draw_policies else expected_rare_states(spec.cfg))
    report.coverage_gaps = [] if spec.draw_policies else [
        name for name in expected_rare_states(spec.cfg) if not rare.get(name)]


def _usage_message(exc: BaseException, spec: CampaignSpec) -> str:
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    hint = ""
    if isinstance(exc, FailedHealthCheck) and spec.steps:
        hint = f" (with --steps {spec.steps}; try fewer steps per example)"
    return f"Hypothesis refused the campaign{hint}: {type(exc).__name__}: {first}"


_SHARED_STEPS: Any = None  # a multiprocessing.Value, inherited by each worker


def init_worker(counter: Any, bugs: tuple[patching.SeededBug, ...] = (),
                spec_mutant: dict[str, overrides.Override] | None = None) -> None:
    """A worker process: the shared step counter, and the seeded bugs and spec overrides
    its parent had on."""
    global _SHARED_STEPS
    _SHARED_STEPS = counter
    patching.install(bugs)
    overrides.install(spec_mutant or {})
    interrupts.worker_ctrl_c()


def worker_entry(spec: CampaignSpec) -> CampaignReport:
    pending = 0

    def tick(steps: int) -> None:
        nonlocal pending
        pending += steps
        if pending >= 25:  # a shared counter update every few steps is plenty for a bar
            with _SHARED_STEPS.get_lock():
                _SHARED_STEPS.value += pending
            pending = 0

    try:
        with interrupts.working():
            return run_worker(spec, progress=tick)
    except CampaignInterrupted as exc:  # Ctrl-C reaches every worker: hand back the part run
        return exc.report


def merge(reports: list[CampaignReport], spec: CampaignSpec, seconds: float) -> CampaignReport:
    out = CampaignReport(spec.config_name, spec.cfg.pocket.policy.value, spec.backend,
                         spec.seed, len(reports))
    rare: Counter[str] = Counter()
    for r in reports:
        out.examples += r.examples
        out.steps += r.steps
        out.failures += r.failures
        rare.update(r.rare_states)
        out.max_pocket_occupancy = max(out.max_pocket_occupancy, r.max_pocket_occupancy)
        out.interrupted = out.interrupted or r.interrupted
        add_checks(out.checks, r.checks)
        for name, index in r.first_reached.items():  # the earliest in any worker's order
            out.first_reached[name] = min(index, out.first_reached.get(name, index))
    out.seconds = seconds
    out.steps_per_second = out.steps / seconds if seconds else 0.0
    out.rare_states = rare_state_counts(rare, expected_rare_states(spec.cfg))
    out.coverage_gaps = [n for n in expected_rare_states(spec.cfg) if not rare.get(n)]
    return out


def run_campaign(spec: CampaignSpec, workers: int = 1, show_progress: bool = True
                 ) -> CampaignReport:
    start = time.monotonic()
    if workers <= 1:
        with CampaignProgress(spec, show_progress) as bar:
            try:
                report = run_worker(spec, progress=bar.tick)
            except CampaignInterrupted as exc:
                report = exc.report
        return report
    ctx = mp.get_context("spawn")
    counter = ctx.Value("q", 0)
    if spec.examples is not None:
        workers = min(workers, spec.examples)  # no worker without an example to run

    def share(i: int) -> int | None:  # the examples split as evenly as they go
        if spec.examples is None:
            return None
        return spec.examples // workers + (1 if i < spec.examples % workers else 0)

    specs = [
        CampaignSpec(**{**asdict_shallow(spec), "seed": spec.seed + 7919 * i,
                        "examples": share(i), "out_dir": str(Path(spec.out_dir) / f"w{i}")})
        for i in range(workers)
    ]
    with interrupts.starting_workers():  # a Ctrl-C while they start: no traceback
        pool = ctx.Pool(workers, initializer=init_worker, initargs=(counter, patching.active(),
                                                                 overrides.active()))
    with CampaignProgress(spec, show_progress) as bar, pool:
        pending = pool.map_async(worker_entry, specs)
        try:
            while not pending.ready():
                pending.wait(0.25)
                bar.set_steps(counter.value)
            reports = pending.get()
        except KeyboardInterrupt:
            # Ctrl-C reached the workers too: each hands back the part it ran. A worker
            # that cannot is stopped with the pool; then only the shared step count is known.
            try:
                reports = pending.get(timeout=10)
            except (Exception, KeyboardInterrupt):
                reports = [CampaignReport(spec.config_name, spec.cfg.pocket.policy.value,
                                          spec.backend, spec.seed, workers,
                                          steps=int(counter.value))]
            for r in reports:
                r.interrupted = True
    return merge(reports, spec, time.monotonic() - start)


def asdict_shallow(spec: CampaignSpec) -> dict[str, Any]:
    return {f: getattr(spec, f) for f in spec.__dataclass_fields__}


def write_json(report: CampaignReport, path: str) -> None:
    write_atomic(Path(path), json.dumps(report.to_json(), indent=2) + "\n")
