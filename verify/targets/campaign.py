"""The target campaign: seeded Hypothesis workloads against a real engine's manager.

Each example builds a fresh instance (`Target.build`), applies a generated list of ops
(`workload.py`), every op followed by every check, and finishes the run (free what is
left, end-of-run checks). A failing example is shrunk by Hypothesis; the shrunk op list
is written as a JSON reproducer (target, engine version, configuration, ops, message) and
a pytest file that replays it, and replaying runs exactly the same calls. Only this
module's seed chooses: examples differ by the campaign seed and the batch.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import target as steer

from kvpocket.model.config import strict_loads
from kvpocket.verify.targets.base import SCHEDULER_STEP, CheckFailure, Target, TargetConfig
from kvpocket.verify.targets.registry import load_target
from kvpocket.verify.targets.workload import Op, ops_strategy
from kvpocket.verify.terminal import Progress
from kvpocket.verify.traces.trace import unused_path, write_atomic

DEFAULT_STEPS = 40
REPRODUCER_VERSION = 1


class ReproducerError(Exception):
    """A reproducer file that cannot be read (one line: file and field)."""


@dataclass
class TargetFailure:
    check: str
    message: str
    ops: list[Op]
    reproducer: str = ""
    test: str = ""


@dataclass
class TargetReport:
    target: str
    version: str
    config: str
    seed: int
    examples: int = 0
    steps: int = 0
    seconds: float = 0.0
    coverage: dict[str, int] = field(default_factory=dict)
    failure: TargetFailure | None = None
    # The target's rare states (`Target.rare_states`): how often each was reached, the
    # 1-based example that first reached it, and those never reached (coverage gaps).
    rare_states: dict[str, int] = field(default_factory=dict)
    first_reached: dict[str, int] = field(default_factory=dict)
    coverage_gaps: list[str] = field(default_factory=list)

    @property
    def steps_per_second(self) -> float:
        """Ops per second."""
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    @property
    def scheduler_steps_per_second(self) -> float:
        steps = self.coverage.get(SCHEDULER_STEP, 0)
        return steps / self.seconds if self.seconds > 0 else 0.0

    def headline(self) -> str:
        return f"{self.target} {self.version}: config {self.config}, seed {self.seed}"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if self.failure is not None:
            d["failure"]["ops"] = [op.to_json() for op in self.failure.ops]
        d["steps_per_second"] = round(self.steps_per_second, 1)
        d["scheduler_steps_per_second"] = round(self.scheduler_steps_per_second, 1)
        return d


def known_bug(target: Target, cfg: TargetConfig, ops: list[Op]) -> str | None:
    """The known engine bug a failing run reaches, as `name: what`: the run passes on the
    target steered clear of its engine's known bugs (`without_known_bugs`), everything else
    the same; of several, the one whose avoidance alone makes it pass. None for a new
    finding, or a target that lists no known bugs."""
    steer_clear = getattr(target, "without_known_bugs", None)
    if steer_clear is None:
        return None
    safe = steer_clear()
    if safe is None or not _passes(safe, cfg, ops):
        return None
    already = set(getattr(target, "avoided", tuple)())  # those it steered clear of itself
    bugs = {name: what for name, what in safe.known_bugs().items() if name not in already}
    if len(bugs) > 1:
        for name in bugs:
            alone = steer_clear(only=(name,))
            if alone is not None and _passes(alone, cfg, ops):
                return f"{name}: {bugs[name]}"
        return "one of " + "; ".join(f"{name}: {what}" for name, what in bugs.items())
    name, what = next(iter(bugs.items()))
    return f"{name}: {what}"


def _passes(target: Target, cfg: TargetConfig, ops: list[Op]) -> bool:
    try:
        run_ops(target, cfg, ops)
    except CheckFailure:
        return False
    return True


def run_ops(target: Target, cfg: TargetConfig, ops: list[Op],
            on_step: Callable[[], None] | None = None) -> dict[str, int]:
    """One run: a fresh instance, every op, the end-of-run checks. Raises CheckFailure
    (with the index of the failing op appended to its detail); returns the coverage."""
    inst = target.build(cfg)
    for i, op in enumerate(ops):
        try:
            inst.step(op)
        except CheckFailure as exc:
            raise CheckFailure(exc.check, f"{exc.detail} (after op {i + 1} of {len(ops)}: {op})"
                               ) from None
        except Exception as exc:  # the engine refused its own state (an assertion, ...)
            raise CheckFailure("engine", f"{_raised_where(exc)} (in op {i + 1} of {len(ops)}: "
                               f"{op})") from None
        if on_step is not None:
            on_step()
    try:
        inst.finish()
    except CheckFailure as exc:
        raise CheckFailure(exc.check, f"{exc.detail} (at the end of the run)") from None
    except Exception as exc:  # the engine refused its own state while finishing
        raise CheckFailure("engine", f"{_raised_where(exc)} (at the end of the run)") from None
    return inst.stats.counts


def _raised_where(exc: BaseException) -> str:
    """`Type: message at file:line`, the innermost frame: where the engine gave up."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno} ({tb[-1].name})" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


def run_campaign(target: Target, cfg: TargetConfig, *, examples: int, steps: int = DEFAULT_STEPS,
                 campaign_seed: int = 0, out_dir: str | None = None,
                 show_progress: bool = False) -> TargetReport:
    """`examples` examples of up to `steps` ops; stops at the first failure (shrunk).
    `show_progress`: examples and ops on stderr as it runs (`verify/terminal.py`)."""
    report = TargetReport(target.name, target.version(), cfg.name, campaign_seed)
    rare = tuple(getattr(target, "rare_states", lambda _: ())(cfg))
    last: dict[str, Any] = {}
    target.build(cfg)  # imports the engine once, outside the measured time
    start = time.monotonic()
    line = Progress(f"fuzz --target {target.name} {cfg.name}", show_progress)

    def tick() -> None:
        report.steps += 1
        line.update(f"failures {1 if last else 0}  examples {report.examples}  "
                    f"ops {report.steps}")

    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck),
              phases=(Phase.generate, Phase.target, Phase.shrink), report_multiple_bugs=False)
    @seed(campaign_seed)
    @given(ops_strategy(cfg.shape(), steps))
    def example(ops: list[Op]) -> None:
        report.examples += 1
        try:
            counts = run_ops(target, cfg, ops, tick)
        except CheckFailure as exc:
            last["failure"] = (exc, list(ops))  # the last one raised is the shrunk one
            raise
        for k, v in counts.items():
            report.coverage[k] = report.coverage.get(k, 0) + v
        reached = [name for name in rare if counts.get(name)]
        for name in reached:
            report.first_reached.setdefault(name, report.examples)
        # Steer generation toward examples that reach more rare states at once (as the
        # model campaign does).
        steer(float(len(reached)), label="distinct rare states")

    try:
        with line:
            example()
    except CheckFailure:
        exc, ops = last["failure"]
        report.failure = TargetFailure(exc.check, str(exc), ops)
        if out_dir is not None:
            write_reproducer(report, cfg, Path(out_dir))
    report.seconds = time.monotonic() - start
    report.rare_states = {name: report.coverage.get(name, 0) for name in rare}
    report.coverage_gaps = [name for name in rare if not report.coverage.get(name)]
    return report


def reproducer_json(report: TargetReport, cfg: TargetConfig) -> dict[str, Any]:
    assert report.failure is not None
    return {"kvpocket_target_reproducer": REPRODUCER_VERSION, "target": report.target,
            "version": report.version, "config": cfg.to_json(), "seed": report.seed,
            "check": report.failure.check, "message": report.failure.message,
            "ops": [op.to_json() for op in report.failure.ops]}


def write_reproducer(report: TargetReport, cfg: TargetConfig, out: Path) -> None:
    """`<target>-failure-<config>-<seed>.json` and a pytest file that replays it; never
    overwrites an earlier finding."""
    assert report.failure is not None
    out.mkdir(parents=True, exist_ok=True)
    path = unused_path(out / f"{report.target}-failure-{cfg.name}-{report.seed}.json")
    write_atomic(path, json.dumps(reproducer_json(report, cfg), indent=1) + "\n")
    test = unused_path(out / f"test_{path.stem.replace('-', '_')}.py")
    first = report.failure.message.splitlines()[0]
    write_atomic(test,
        f'"""Reproducer written by `kvpocket fuzz --target {report.target}` '
        f'({report.target} {report.version}, config {cfg.name}, seed {report.seed}).\n\n'
        f'{first}\n"""\n\n'
        "from pathlib import Path\n\n"
        "from kvpocket.verify.targets.campaign import replay_file\n\n\n"
        "def test_reproduces() -> None:\n"
        f"    failure = replay_file(Path(__file__).with_name({path.name!r}))\n"
        "    assert failure is None, failure\n")
    report.failure.reproducer, report.failure.test = str(path), str(test)


def read_reproducer(path: Path) -> tuple[str, TargetConfig, list[Op], dict[str, Any]]:
    try:
        data = strict_loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReproducerError(f"{path}: not a readable JSON reproducer ({exc})") from None
    except (ValueError, RecursionError) as exc:  # a key twice, a 5,000-digit integer
        raise ReproducerError(f"{path}: {exc or 'nested too deeply'}") from None
    if not isinstance(data, dict) or data.get("kvpocket_target_reproducer") != REPRODUCER_VERSION:
        raise ReproducerError(f"{path}: field kvpocket_target_reproducer: expected "
                              f"{REPRODUCER_VERSION} (a file written by kvpocket fuzz --target)")
    try:
        cfg = TargetConfig.from_json(data["config"])
        ops = [Op.from_json(v) for v in data["ops"]]
        target = str(data["target"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ReproducerError(f"{path}: field config/ops/target: {exc}") from None
    return target, cfg, ops, data


def replay_file(path: Path, target: Target | None = None) -> str | None:
    """Replay a reproducer: None if the run passes every check, else the failure."""
    name, cfg, ops, _ = read_reproducer(Path(path))
    tgt = target if target is not None else load_target(name)
    try:
        run_ops(tgt, cfg, ops)
    except CheckFailure as exc:
        return f"{tgt.name} {tgt.version()}: {exc}"
    return None
