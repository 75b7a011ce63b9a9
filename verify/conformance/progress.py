"""Campaign progress: the live statistics of a fuzz campaign or of the default matrix, shown
through the one progress component (`verify/terminal.py: Progress`).

The campaign runners (`fuzz.run_campaign`, `matrix.run_matrix`) own their progress: it
reads the campaign's live statistics (`stateful.STATS`); the final report is the command
line's to print (`verify/cli/render.py`). Failures come first in each line, so a narrow
terminal never cuts them off.
"""

from __future__ import annotations

from typing import Any

from kvpocket.verify.conformance.stateful import STATS
from kvpocket.verify.terminal import Progress


class CampaignProgress:
    """A fuzz campaign: failures, examples, steps, steps/s, rare states. Silent when `show`
    is False (tests, --json-only runs)."""

    def __init__(self, spec: Any, show: bool) -> None:
        self.multi = False
        self.steps = 0
        self.line = Progress(f"fuzz {spec.config_name}/{spec.cfg.pocket.policy.value}", show)

    def __enter__(self) -> CampaignProgress:
        self.line.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._refresh(force=True)
        self.line.__exit__(None, None, None)

    def tick(self, steps: int) -> None:
        self.steps += steps
        self._refresh()

    def set_steps(self, steps: int) -> None:
        """Several workers: only the shared step count is known here until they finish."""
        self.steps = steps
        self.multi = True
        self._refresh()

    def _refresh(self, force: bool = False) -> None:
        rate = self.steps / max(self.line.elapsed(), 1e-9)
        if self.multi:
            self.line.update(f"steps {self.steps}  {rate:,.0f} steps/s  (examples, rare states "
                             "and failures per worker in the table at the end)", force)
            return
        reached = sum(1 for v in STATS.rare.values() if v)
        self.line.update(f"failures {1 if STATS.failure else 0}  examples {STATS.examples}  "
                         f"steps {self.steps}  rare states {reached}  {rate:,.0f} steps/s", force)


class MatrixProgress:
    """The default campaign: failures, examples, steps, the cell running now. Silent when
    `show` is False."""

    def __init__(self, report: Any, budget_s: float, show: bool) -> None:
        self.report = report
        self.steps = 0
        self.cell = ""
        budget = f"{report.total_examples} examples" if getattr(report, "total_examples", None) \
            else f"{budget_s:g} s"
        self.line = Progress(f"fuzz matrix ({len(report.cells)} cells, budget {budget})", show)

    def __enter__(self) -> MatrixProgress:
        self.line.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.line.__exit__(None, None, None)

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
        rate = self.steps / max(self.line.elapsed(), 1e-9)
        where = f"  cell {self.cell}" if self.cell else ""
        self.line.update(f"failures {len(self.report.failures)}  examples {self.report.examples}  "
                         f"steps {self.steps}  {rate:,.0f} steps/s{where}")
