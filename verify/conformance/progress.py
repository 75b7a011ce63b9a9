"""Live progress lines for campaigns, on stderr and only on a terminal.

The campaign runners (`fuzz.run_campaign`, `matrix.run_matrix`) own their progress line:
it reads the campaign's live statistics (`stateful.STATS`), and the final report is the
command line's to print (`verify/cli/render.py`).
"""

from __future__ import annotations

import time
from typing import Any

from kvpocket.verify.conformance.stateful import STATS
from kvpocket.verify.terminal import progress_console, progress_line


class CampaignProgress:
    """A live progress line for a fuzz campaign: examples, steps, steps/s, rare states,
    failures. Silent when `show` is False (tests, --json-only runs)."""

    def __init__(self, spec: Any, show: bool) -> None:
        self.show = show
        self.multi = False
        self.steps = 0
        self.last = 0.0
        out, self.show = progress_console(show)
        self.progress = progress_line(out, self.show)
        self.task = self.progress.add_task(
            f"fuzz {spec.config_name}/{spec.cfg.pocket.policy.value}", total=None, stats="")

    def __enter__(self) -> CampaignProgress:
        self.start = time.monotonic()
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._refresh(force=True)
        self.progress.__exit__(None, None, None)

    def tick(self, steps: int) -> None:
        self.steps += steps
        self._refresh()

    def set_steps(self, steps: int) -> None:
        """Several workers: only the shared step count is known here until they finish."""
        self.steps = steps
        self.multi = True
        self._refresh()

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.show or (not force and now - self.last < 0.2):
            return
        self.last = now
        rate = self.steps / max(now - self.start, 1e-9)
        if self.multi:
            self.progress.update(self.task, stats=(
                f"steps {self.steps}  {rate:,.0f} steps/s  (per-worker examples, rare states "
                "and failures in the table at the end)"))
            return
        reached = sum(1 for v in STATS.rare.values() if v)
        failures = 1 if STATS.failure else 0
        self.progress.update(self.task, stats=(
            f"examples {STATS.examples}  steps {self.steps}  {rate:,.0f} steps/s  "
            f"rare states {reached}  failures {failures}"))


class MatrixProgress:
    """A live line for the default campaign: elapsed / budget, the cell running now,
    examples, steps and failures. Silent when `show` is False."""

    def __init__(self, report: Any, budget_s: float, show: bool) -> None:
        self.report = report
        self.show = show
        self.steps = 0
        self.cell = ""
        self.last = 0.0
        out, self.show = progress_console(show)
        self.progress = progress_line(out, self.show)
        budget = f"{report.total_examples} examples" if getattr(report, "total_examples", None) \
            else f"{budget_s:g} s"
        self.task = self.progress.add_task(
            f"fuzz matrix ({len(report.cells)} cells, budget {budget})", total=None, stats="")

    def __enter__(self) -> MatrixProgress:
        self.start = time.monotonic()
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def current(self, cell: str) -> None:
        self.cell = cell
        self._refresh()

    def tick(self, steps: int) -> None:
        self.steps += steps
        self._refresh()

    def set_steps(self, steps: int) -> None:
        self.steps = steps
        self._refresh()

    def _refresh(self) -> None:
        now = time.monotonic()
        if not self.show or now - self.last < 0.2:
            return
        self.last = now
        rate = self.steps / max(now - self.start, 1e-9)
        where = f"  cell {self.cell}" if self.cell else ""
        self.progress.update(self.task, stats=(
            f"steps {self.steps}  {rate:,.0f} steps/s  examples {self.report.examples}  "
            f"failures {len(self.report.failures)}{where}"))
