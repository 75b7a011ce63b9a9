"""The default campaign: a matrix of configurations and pocket policies, one time budget.

`kvpocket fuzz` with no `--config` runs this. No single configuration reaches every
hazard (a full pocket with another stale page arriving needs room for three stale
blocks; a nested make-room that fails needs three levels; (w-1) mod t != 0 needs an
offset window; two pool groups need split pools), so the campaign visits every cell
of `DEFAULT_MATRIX` in rounds: each round runs one short *slice* (a few examples) of
every cell, and rounds repeat until the budget is spent. A bug that only one cell can
reach is therefore met within the first round, a few seconds in.

Every slice draws its examples from (seed, cell, round) alone, so a run is reproducible
whatever the number of workers; every failure is shrunk and written as a trace and a
pytest file (`fuzz.write_reproducers`). Generation is steered toward rare states by
`target()` in the machine; the report names every rare state that no cell reached.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvpocket.model.config import KVConfig, PocketPolicy
from kvpocket.verify import interrupts
from kvpocket.verify.conformance.fuzz import (
    CampaignReport,
    CampaignSpec,
    expected_rare_states,
    init_worker,
    run_worker,
    worker_entry,
    write_text_atomic,
)
from kvpocket.verify.conformance.lockstep import RARE_STATES
from kvpocket.verify.presets import PRESETS

OFF = "off"  # a cell's policy when its pocket is disabled


@dataclass(frozen=True)
class Cell:
    """One configuration of the matrix under one pocket policy (or with the pocket off)."""

    config_name: str
    policy: str  # a PocketPolicy value, or OFF
    reaches: str  # the hazards this cell is in the matrix for

    @property
    def name(self) -> str:
        return f"{self.config_name}/{self.policy}"

    def config(self) -> KVConfig:
        base = PRESETS[self.config_name].config
        if self.policy == OFF:
            return base.with_pocket(enabled=False)
        return base.with_pocket(True, PocketPolicy.parse(self.policy))


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
)

SLICE_EXAMPLES = 8  # examples per cell per round: small, so one round visits every cell fast


@dataclass
class MatrixFailure:
    cell: str
    message: str
    trace: str
    test: str
    steps: int  # length of the shrunk trace
    seconds: float  # from the campaign's start to the failure being written
    kind: str  # the Divergence kind (first report line), e.g. "model invariant violated"


@dataclass
class CellStats:
    examples: int = 0
    steps: int = 0
    slices: int = 0
    rare_states: dict[str, int] = field(default_factory=dict)
    expected: list[str] = field(default_factory=list)


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

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "steps_per_second": round(self.steps_per_second, 1),
                "kind": "matrix"}


@dataclass(frozen=True)
class Slice:
    cell: int
    round: int


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
        if moved not in out:
            out.append(moved)
    return tuple(out)


def _slice_spec(cell: Cell, rnd: int, part: int, seed: int, examples: int, out_dir: str,
                profile: str, steps: int | None, backend: str, database: str | None
                ) -> CampaignSpec:
    return CampaignSpec(cell.config_name, cell.config(), profile=profile, examples=examples,
                        steps=steps, seed=slice_seed(seed, cell, rnd, part), backend=backend,
                        database=database, out_dir=out_dir, batch=examples,
                        tag=f"{cell.config_name}-{cell.policy}-{seed}-r{rnd}"
                        + (f"-{part}" if part else ""),
                        namespace=cell.name)


def run_matrix(seed: int = 0, budget_s: float = 60.0, workers: int = 1,
               out_dir: str = "kvpocket-out", show_progress: bool = False,
               policy: str | None = None, examples_per_cell: int | None = None,
               steps: int | None = None, profile: str = "dev", backend: str = "numpy",
               database: str | None = None, cells: tuple[Cell, ...] = DEFAULT_MATRIX,
               keep_going: bool = False,
               on_slice: Callable[[str, CampaignReport], None] | None = None) -> MatrixReport:
    """Run the matrix until `budget_s` seconds are spent (or, with `examples_per_cell`,
    until every cell has run that many examples). Stops at the first failure unless
    `keep_going`. Raises `CampaignUsageError` for a usage problem Hypothesis reports
    (a health check), never reporting it as a found bug."""
    chosen = matrix_cells(policy, cells)
    report = MatrixReport(seed, workers, budget_s, policy, backend)
    for c in chosen:
        report.cells[c.name] = CellStats(expected=expected_rare_states(c.config()))
    rare: Counter[str] = Counter()
    start = time.monotonic()
    slice_n = SLICE_EXAMPLES if examples_per_cell is None else min(SLICE_EXAMPLES,
                                                                   examples_per_cell)
    rounds = None if examples_per_cell is None else -(-examples_per_cell // slice_n)

    def slices() -> Iterator[tuple[Cell, CampaignSpec]]:
        rnd = 0
        while rounds is None or rnd < rounds:
            for c in chosen:
                if examples_per_cell is not None:
                    n = min(slice_n, examples_per_cell - rnd * slice_n)
                    yield c, _slice_spec(c, rnd, 0, seed, n, out_dir, profile, steps, backend,
                                         database)
                    continue
                # Time-bounded: slices grow (room for Hypothesis's target phase), and a
                # cell that has not reached every rare state it can gets a second slice.
                n = slice_n << min(rnd, 2)
                stats = report.cells[c.name]
                extra = rnd > 0 and any(not stats.rare_states.get(x) for x in stats.expected)
                for part in range(1 + extra):
                    yield c, _slice_spec(c, rnd, part, seed, n, out_dir, profile, steps,
                                         backend, database)
            rnd += 1

    def time_left() -> bool:
        return examples_per_cell is not None or time.monotonic() - start < budget_s

    def absorb(cell: Cell, r: CampaignReport) -> bool:
        """Fold one slice's report in; True when the campaign should stop."""
        stats = report.cells[cell.name]
        stats.examples += r.examples
        stats.steps += r.steps
        stats.slices += 1
        for name, n in r.rare_states.items():
            stats.rare_states[name] = stats.rare_states.get(name, 0) + n
            rare[name] += n
        report.examples += r.examples
        report.steps += r.steps
        for f in r.failures:
            report.failures.append(MatrixFailure(
                cell.name, f.message, f.trace, f.test, f.steps, time.monotonic() - start,
                _kind(f.message)))
        if on_slice is not None:
            on_slice(cell.name, r)
        return bool(r.failures) and not keep_going

    from kvpocket.verify.cli.render import MatrixProgress

    with MatrixProgress(report, budget_s, show_progress) as bar:
        try:
            if workers <= 1:
                for cell, spec in slices():
                    if not time_left():
                        break
                    bar.current(cell.name)
                    if absorb(cell, run_worker(spec, progress=bar.tick)):
                        break
            else:
                _run_pool(slices(), workers, time_left, absorb, bar)
        except KeyboardInterrupt:
            report.interrupted = True
    report.seconds = time.monotonic() - start
    report.rare_states = {name: rare.get(name, 0) for name in RARE_STATES}
    wanted = {n for s in report.cells.values() for n in s.expected}
    report.unreached = [n for n in RARE_STATES if n in wanted and not rare.get(n)]
    return report


def _run_pool(work: Iterator[tuple[Cell, CampaignSpec]], workers: int,
              time_left: Callable[[], bool], absorb: Callable[[Cell, CampaignReport], bool],
              bar: Any) -> None:
    """Keep `workers` slices in flight, in matrix order, until the budget or a failure."""
    ctx = mp.get_context("spawn")
    counter = ctx.Value("q", 0)
    with interrupts.starting_workers():  # a Ctrl-C while they start: no traceback
        pool = ctx.Pool(workers, initializer=init_worker, initargs=(counter,))
    in_flight: list[tuple[Cell, Any]] = []
    try:
        stop = False
        while not stop:
            while len(in_flight) < workers and time_left():
                nxt = next(work, None)
                if nxt is None:
                    break
                in_flight.append((nxt[0], pool.apply_async(worker_entry, (nxt[1],))))
            if not in_flight:
                break
            done = [item for item in in_flight if item[1].ready()]
            if not done:
                in_flight[0][1].wait(0.2)
                bar.set_steps(counter.value)
                continue
            for item in done:
                in_flight.remove(item)
                if absorb(item[0], item[1].get()):
                    stop = True
                    break
    finally:
        pool.terminate()
        pool.join()


def _kind(message: str) -> str:
    first = message.splitlines()[0] if message else ""
    if first.startswith("step ") and ": " in first:
        return first.split(": ", 1)[1]
    return "the implementation crashed"


def write_matrix_json(report: MatrixReport, path: str) -> None:
    write_text_atomic(Path(path), json.dumps(report.to_json(), indent=2) + "\n")
