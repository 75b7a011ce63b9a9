"""The simulator's two checks in the campaigns: the race detector and the device mirror.

Each is on in every example of the default campaign; a finding of either is a Divergence
of its own kind whose reproducer replays exactly (the trace header switches the check on
again), and the campaign reports count the examples each check ran in."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpocket.verify.conformance.fuzz import CampaignSpec, run_worker
from kvpocket.verify.conformance.lockstep import CHECKS, MIRROR, RACE
from kvpocket.verify.conformance.matrix import DEFAULT_MATRIX, run_matrix
from kvpocket.verify.conformance.replay import replay
from kvpocket.verify.presets import PRESETS
from kvpocket.verify.quality.patches import switched_on
from kvpocket.verify.quality.seeded import CAMPAIGN_DETECTORS, MUTANTS, detector_of
from kvpocket.verify.traces.trace import read_trace


@pytest.mark.parametrize(("bug", "kind", "header", "detector"), [
    ("offload-parked-step-fence", RACE, "race_check", "race detector"),
    ("resume-index-not-dirty", MIRROR, "device_mirror", "device mirror"),
])
def test_a_finding_is_a_divergence_that_replays_with_the_check_on(
        bug: str, kind: str, header: str, detector: str, tmp_path: Path) -> None:
    assert detector_of(kind) == detector and detector in CAMPAIGN_DETECTORS  # a kill column
    m = MUTANTS[bug]
    with switched_on(bug):
        report = run_worker(CampaignSpec(m.preset, m.config(), examples=40, seed=1,
                                         out_dir=str(tmp_path)))
        assert report.failures, f"{bug} survived {report.examples} examples"
        f = report.failures[0]
        assert f.message.splitlines()[0].endswith(kind), f.message  # not "crashed"
        trace = read_trace(f.trace)
        assert trace.extra[header] is True
        again = replay(trace)
        assert (again.ok, again.kind) == (False, kind), again.report
        del trace.extra[header]  # the same steps with the check off: it is what finds it
        assert replay(trace).kind != kind
    assert f"{bug}" in Path(f.test).read_text()  # the pytest reproducer switches it on


def test_reports_count_the_examples_each_check_ran(tmp_path: Path) -> None:
    cfg = PRESETS["tiny"].config
    on = run_worker(CampaignSpec("tiny", cfg, examples=6, event_log_every=2,
                                 out_dir=str(tmp_path)))
    n = on.examples
    assert list(on.checks) == list(CHECKS)
    assert on.checks == {"data oracle": n, "views": n, "event log": on.checks["event log"],
                         "race detector": n, "device mirror": n}
    assert 0 < on.checks["event log"] < n
    off = run_worker(CampaignSpec("tiny", cfg, examples=3, race_check=False,
                                  device_mirror=False, out_dir=str(tmp_path)))
    assert off.checks["race detector"] == off.checks["device mirror"] == 0
    assert off.to_json()["checks"]["views"] == off.examples


def test_the_matrix_reports_its_checks_per_cell_and_in_all(tmp_path: Path) -> None:
    cells = (DEFAULT_MATRIX[0], DEFAULT_MATRIX[-1])  # a preset cell and a drawn one
    report = run_matrix(examples_per_cell=2, cells=cells, out_dir=str(tmp_path))
    assert not report.failures
    for name in ("race detector", "device mirror", "data oracle", "views"):
        assert report.checks[name] == sum(c.checks[name] for c in report.cells.values())
        assert report.cells[cells[0].name].checks[name] == report.cells[cells[0].name].examples
        assert report.checks[name] > 0
    assert report.to_json()["checks"] == report.checks
