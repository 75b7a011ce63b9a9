"""The default campaign: a matrix of configurations and pocket policies, one time budget.

`kvpocket fuzz` with no `--config` runs this. No single configuration reaches every
hazard (a full pocket with another stale page arriving needs room for three stale
blocks; a nested make-room that fails needs three levels; (w-1) mod t != 0 needs an
offset window; two pool groups need split pools), so the campaign visits every cell
of `DEFAULT_MATRIX` in rounds: each round runs one short *slice* (a few examples) of
every cell, and rounds repeat until the budget is spent. A bug that only one cell can
reach is therefore met within the first round, a few seconds in.

Two cells draw their configuration per example (`configs.kv_configs`: several sliding
windows, sinks, full attention first or last, split pools, one to three levels), so a
shape no preset has is explored too; and one example in `EVENT_LOG_EVERY` of every
cell also checks the implementation's event log line by line with `trace check`'s
checker; every example runs the simulator's race detector and device-mirror mode.

Every slice draws its examples from (seed, cell, round) alone, and a round's slices are
planned from the rounds before it only (steering: a cell that has not reached every rare
state it can, or reached its last one late, gets more examples), so a run is
reproducible whatever the number of workers, and a run stopped by an example budget
(`total_examples`) is the same run on every machine. Every failure is shrunk and written
as a trace and a pytest file (`fuzz.write_reproducers`). The report names every rare
state no cell reached, and per cell the example at which each rare state was first
reached.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvpocket.model import overrides
from kvpocket.model.config import KVConfig, PocketPolicy
from kvpocket.verify import interrupts, patching
from kvpocket.verify.conformance.fuzz import (
    CampaignReport,
    CampaignSpec,
    add_checks,
    expected_rare_states,
    init_worker,
    rare_state_counts,
    run_worker,
    worker_entry,
)
from kvpocket.verify.conformance.guards import expected_drawn_guard_states
from kvpocket.verify.conformance.progress import MatrixProgress
from kvpocket.verify.presets import PRESETS
from kvpocket.verify.traces.trace import write_atomic

OFF = "off"  # a cell's policy when its pocket is disabled
DRAWN = "drawn"  # a cell's config_name when every example draws its own configuration


@dataclass(frozen=True)
class Cell:
    """One configuration of the matrix under one pocket policy (or with the pocket off)."""

    config_name: str
    policy: str  # a PocketPolicy value, or OFF
    reaches: str  # the hazards this cell is in the matrix for

    @property
    def name(self) -> str:
        return f"{self.config_name}/{self.policy}"

    @property
    def drawn(self) -> bool:
        return self.config_name == DRAWN

    def config(self) -> KVConfig:
        """The cell's configuration (a drawn cell: a stand-in naming its policy only)."""
        base = PRESETS["two-level" if self.drawn else self.config_name].config
        if self.policy == OFF:
            return base.with_pocket(enabled=False)
        return base.with_pocket(True, PocketPolicy.parse(self.policy))

    def expected(self) -> list[str]:
        """The rare states the cell must reach (a drawn cell: none of `RARE_STATES` is
        certain; the guard combinations of several sliding windows are, see
        `guards.expected_drawn_guard_states`)."""
        if self.drawn:
            return expected_drawn_guard_states(
                PocketPolicy.REVALIDATE if self.policy == OFF else PocketPolicy.parse(self.policy))
        return expected_rare_states(self.config())


DEFAULT_MATRIX: tuple[Cell, ...] = (
    Cell("tiny", "revalidate", "a parked page is evicted (dropped: evict_parked=drop, the "
         "default) within a few steps; pops refused"),
    Cell("tiny-migrate", "revalidate", "a parked page is evicted and migrated to host "
         "(evict_parked=migrate) within a few steps; pops refused"),
    Cell("wide-pocket", "revalidate", "a full pocket with another stale page arriving; "
         "several blocks leaving the window at once"),
    Cell("three-level", "revalidate", "a cascade two levels deep; OutOfPages at a deeper level "
         "in the middle of a cascade, rolled back"),
    Cell("offset", "revalidate", "(w-1) mod t != 0: parked pages wait several steps"),
    Cell("split-pools", "revalidate", "two pool groups, each with its own queues and allocators"),
    Cell("two-level", "pin", "two priority buckets in one pool group; pinned pocket pages"),
    Cell("sinks", "revalidate", "sink blocks that never leave the window"),
    Cell("gpu-only", "revalidate", "one level: HELD pages are never evictable"),
    Cell("two-level", OFF, "the pocket off: every new block goes through the allocator"),
    Cell(DRAWN, "revalidate", "a configuration drawn per example: one to three sliding "
         "windows of different sizes, sinks, full attention first or last, split pools, one "
         "to three levels (the pocket sometimes off)"),
    Cell(DRAWN, "pin", "drawn configurations as above, pinned pocket pages"),
)

SLICE_EXAMPLES = 8  # examples per cell per round: small, so one round visits every cell fast
MAX_SLICE_EXAMPLES = 32  # slices double per round up to this
MAX_PARTS = 3  # slices of one cell in one round (steering gives up to two more)
# One example in 16 of every cell also checks the event log (a checked example costs about
# 1.8 times an unchecked one: a second model runs the log; so ~5% of the campaign's time).
EVENT_LOG_EVERY = 16
# The default campaign's plan, all cells together: the smallest budget that kills every
# seeded, zoo, reach and hunt bug with a margin of 2x in examples (the quality tier kills
# each within half of it; the latest, zoo-resume-no-pin, at example 549: docs/bug-zoo.md).
# Counted in examples, so the run and its verdict are the same on any machine; a timed run
# that ends before doing this much is incomplete and says so.
DEFAULT_EXAMPLES = 1100


@dataclass
class MatrixFailure:
    cell: str
    message: str
    trace: str
    test: str
    steps: int  # length of the shrunk trace
    seconds: float  # from the campaign's start to the failure being written
    kind: str  # the Divergence kind (first report line), e.g. "model invariant violated"
    # Examples of the whole campaign, in its planned order, up to and including the one
    # that failed: the machine-independent measure of how fast the bug was found.
    examples: int = 0
    unwritten: str = ""  # why its trace or reproducer could not be written (a full disk)


@dataclass
class CellStats:
    examples: int = 0
    steps: int = 0
    slices: int = 0
    rare_states: dict[str, int] = field(default_factory=dict)
    expected: list[str] = field(default_factory=list)
    # Rare state -> the cell's example (1-based, in planned order) that first reached it.
    first_reached: dict[str, int] = field(default_factory=dict)
    steered: int = 0  # extra slices steering gave the cell
    checks: dict[str, int] = field(default_factory=dict)  # check -> the cell's examples that ran it


@dataclass
class MatrixReport:
    seed: int
    workers: int
    budget_s: float
    policy: str | None  # the policy every cell was switched to, or None (the matrix's own)
    backend: str
    seconds: float = 0.0
    examples: int = 0
    steps: int = 0
    cells: dict[str, CellStats] = field(default_factory=dict)
    rare_states: dict[str, int] = field(default_factory=dict)
    unreached: list[str] = field(default_factory=list)  # expected somewhere, reached nowhere
    failures: list[MatrixFailure] = field(default_factory=list)
    interrupted: bool = False
    total_examples: int | None = None  # the example budget, when the run had one
    intended_examples: int = DEFAULT_EXAMPLES  # the work the default campaign is meant to do
    ran_short: bool = False  # a timed run ended before doing the intended work (slow machine)
    checks: dict[str, int] = field(default_factory=dict)  # check -> examples that ran it

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "steps_per_second": round(self.steps_per_second, 1),
                "kind": "matrix"}


@dataclass(frozen=True)
class Slice:
    """One planned slice: its cell, its spec, and where it sits in the planned order."""

    cell: Cell
    spec: CampaignSpec
    before: int  # examples of the whole campaign planned before it
    cell_before: int  # examples of its cell planned before it


def slice_seed(seed: int, cell: Cell, rnd: int, part: int = 0) -> int:
    """Each slice's seed depends on the campaign seed, the cell, the round and the slice's
    place in the round only."""
    digest = hashlib.sha256(f"{seed}:{cell.name}:{rnd}:{part}".encode()).digest()
    return int.from_bytes(digest[:6], "big")


def matrix_cells(policy: str | None = None, cells: tuple[Cell, ...] = DEFAULT_MATRIX
                 ) -> tuple[Cell, ...]:
    """The matrix, every pocket-on cell switched to `policy` when one is given (so
    `kvpocket fuzz --policy unsafe` shows the hazard in every configuration)."""
    if policy is None:
        return cells
    PocketPolicy.parse(policy, "--policy")
    out: list[Cell] = []
    for c in cells:
        if c.policy == OFF:
            continue
        moved = Cell(c.config_name, policy, c.reaches)
        if moved.name not in {x.name for x in out}:
            out.append(moved)
    return tuple(out)


def _slice_spec(cell: Cell, rnd: int, part: int, seed: int, examples: int, out_dir: str,
                profile: str, steps: int | None, backend: str, database: str | None,
                event_log_every: int, race_check: bool, device_mirror: bool) -> CampaignSpec:
    draw = () if not cell.drawn else (
        (PocketPolicy.REVALIDATE,) if cell.policy == OFF else (PocketPolicy.parse(cell.policy),))
    return CampaignSpec(cell.config_name, cell.config(), profile=profile, examples=examples,
                        steps=steps, seed=slice_seed(seed, cell, rnd, part), backend=backend,
                        database=database, out_dir=out_dir, batch=examples,
                        tag=f"{cell.config_name}-{cell.policy}-{seed}-r{rnd}"
                        + (f"-{part}" if part else ""),
                        namespace=cell.name, draw_policies=draw,
                        event_log_every=event_log_every, race_check=race_check,
                        device_mirror=device_mirror)


def steering_slices(stats: CellStats) -> int:
    """Extra slices a cell gets in the next round, from what its earlier rounds reached:
    one while a rare state it can reach is still unreached, one while the last rare state
    it reached was first reached in the later half of its examples (its rarest paths are
    rare: more examples find them, and what lies behind them, sooner)."""
    extra = 0
    if any(not stats.rare_states.get(x) for x in stats.expected):
        extra += 1
    if stats.first_reached and 2 * max(stats.first_reached.values()) > stats.examples:
        extra += 1
    return min(extra, MAX_PARTS - 1)


def run_matrix(seed: int = 0, budget_s: float = 60.0, workers: int = 1,
               out_dir: str = "kvpocket-out", show_progress: bool = False,
               policy: str | None = None, examples_per_cell: int | None = None,
               steps: int | None = None, profile: str = "dev", backend: str = "numpy",
               database: str | None = None, cells: tuple[Cell, ...] = DEFAULT_MATRIX,
               keep_going: bool = False,
               on_slice: Callable[[str, CampaignReport], None] | None = None,
               total_examples: int | None = None,
               event_log_every: int = EVENT_LOG_EVERY, race_check: bool = True,
               device_mirror: bool = True) -> MatrixReport:
    """Run the matrix until `budget_s` seconds are spent, or (with `total_examples`) until
    that many examples in all have run, on the same plan a timed run follows (the same
    run on every machine), or (with `examples_per_cell`) exactly that many examples per
    cell in fixed slices. `race_check` and `device_mirror` switch the simulator's checks
    (on in every example by default). Stops at the first failure unless `keep_going`. Raises
    `CampaignUsageError` for a usage problem Hypothesis reports (a health check), never
    reporting it as a found bug."""
    chosen = matrix_cells(policy, cells)
    report = MatrixReport(seed, workers, budget_s, policy, backend,
                          total_examples=total_examples)
    for c in chosen:
        report.cells[c.name] = CellStats(expected=c.expected())
    rare: Counter[str] = Counter()
    start = time.monotonic()
    fixed = examples_per_cell is not None
    timed = not fixed and total_examples is None
    slice_n = SLICE_EXAMPLES if examples_per_cell is None else min(SLICE_EXAMPLES,
                                                                   examples_per_cell)
    planned = 0  # examples of the whole campaign planned so far

    def plan(rnd: int) -> list[Slice]:
        """Round `rnd`'s slices, from the rounds before it only (complete by now)."""
        nonlocal planned
        out: list[Slice] = []
        for c in chosen:
            stats = report.cells[c.name]
            if fixed:
                assert examples_per_cell is not None
                sizes = [min(slice_n, examples_per_cell - rnd * slice_n)]
            else:
                extra = steering_slices(stats) if rnd > 0 else 0
                stats.steered += extra
                sizes = [min(slice_n << rnd, MAX_SLICE_EXAMPLES)] * (1 + extra)
            cell_before = stats.examples + sum(x.spec.examples or 0 for x in out
                                               if x.cell == c)
            for part, n in enumerate(sizes):
                if total_examples is not None:
                    n = min(n, total_examples - planned)
                if n <= 0:
                    continue
                spec = _slice_spec(c, rnd, part, seed, n, out_dir, profile, steps, backend,
                                   database, event_log_every, race_check, device_mirror)
                out.append(Slice(c, spec, planned, cell_before))
                planned += n
                cell_before += n
        return out

    def time_left() -> bool:
        return not timed or time.monotonic() - start < budget_s

    def absorb(sl: Slice, r: CampaignReport) -> None:
        """Fold one slice's report in."""
        stats = report.cells[sl.cell.name]
        stats.examples += r.examples
        stats.steps += r.steps
        stats.slices += 1
        for name, n in r.rare_states.items():
            stats.rare_states[name] = stats.rare_states.get(name, 0) + n
            rare[name] += n
        for name, index in r.first_reached.items():
            at = sl.cell_before + index
            stats.first_reached[name] = min(at, stats.first_reached.get(name, at))
        report.examples += r.examples
        report.steps += r.steps
        add_checks(stats.checks, r.checks)
        add_checks(report.checks, r.checks)
        for f in r.failures:
            report.failures.append(MatrixFailure(
                sl.cell.name, f.message, f.trace, f.test, f.steps, time.monotonic() - start,
                _kind(f.message), sl.before + r.examples, f.unwritten))
        if on_slice is not None:
            on_slice(sl.cell.name, r)

    with MatrixProgress(report, budget_s, show_progress) as bar:
        runner = _Runner(workers, bar)
        try:
            rnd = 0
            while time_left():
                if fixed and rnd * slice_n >= (examples_per_cell or 0):
                    break
                if total_examples is not None and planned >= total_examples:
                    break
                round_slices = plan(rnd)
                if not round_slices:
                    break
                found = runner.run(round_slices, time_left, absorb,
                                   lambda: bool(report.failures) and not keep_going)
                if found:
                    break
                rnd += 1
        except KeyboardInterrupt:
            report.interrupted = True
        finally:
            runner.close()
    report.seconds = time.monotonic() - start
    report.failures.sort(key=lambda f: f.examples)  # the first in planned order first
    wanted = {n for s in report.cells.values() for n in s.expected}
    report.rare_states = rare_state_counts(rare, sorted(wanted))
    report.unreached = [n for n in report.rare_states if n in wanted and not rare.get(n)]
    report.ran_short = (timed and not report.failures and not report.interrupted
                        and report.examples < report.intended_examples)
    return report


class _Runner:
    """Runs one round's slices, in planned order, in this process or `workers` processes
    (a pool kept for the whole campaign)."""

    def __init__(self, workers: int, bar: Any) -> None:
        self.workers, self.bar = workers, bar
        self.pool: Any = None
        self.counter: Any = None

    def run(self, slices: list[Slice], time_left: Callable[[], bool],
            absorb: Callable[[Slice, CampaignReport], None], stop: Callable[[], bool]) -> bool:
        """True when the campaign should stop (a failure found and not keep_going)."""
        if self.workers <= 1:
            for sl in slices:
                interrupts.stop_if_interrupted()  # a Ctrl-C a library swallowed stops it too
                if not time_left():
                    return False
                self.bar.current(sl.cell.name)
                absorb(sl, run_worker(sl.spec, progress=self.bar.tick))
                if stop():
                    return True
            return False
        if self.pool is None:
            ctx = mp.get_context("spawn")
            self.counter = ctx.Value("q", 0)
            with interrupts.starting_workers():  # a Ctrl-C while they start: no traceback
                self.pool = ctx.Pool(self.workers, initializer=init_worker,
                                     initargs=(self.counter, patching.active(),
                                               overrides.active()))
        todo = list(slices)
        in_flight: list[tuple[Slice, Any]] = []
        stopping = False
        while True:
            interrupts.stop_if_interrupted()  # a Ctrl-C a library swallowed stops it too
            while not stopping and todo and len(in_flight) < self.workers and time_left():
                sl = todo.pop(0)
                in_flight.append((sl, self.pool.apply_async(worker_entry, (sl.spec,))))
            if not in_flight:
                return stopping
            done = [item for item in in_flight if item[1].ready()]
            if not done:
                in_flight[0][1].wait(0.2)
                self.bar.set_steps(self.counter.value)
                continue
            for item in done:
                in_flight.remove(item)
                absorb(item[0], item[1].get())
                if stop():
                    # Nothing new starts; of the slices running, only those planned before
                    # this one may still find an earlier failure: the rest are dropped.
                    stopping = True
                    in_flight = [x for x in in_flight if x[0].before < item[0].before]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def _kind(message: str) -> str:
    first = message.splitlines()[0] if message else ""
    if first.startswith("step ") and ": " in first:
        return first.split(": ", 1)[1]
    return "the implementation crashed"


def write_matrix_json(report: MatrixReport, path: str) -> None:
    write_atomic(Path(path), json.dumps(report.to_json(), indent=2) + "\n")
