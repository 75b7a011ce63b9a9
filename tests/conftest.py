"""Test tiers. `scripts/test.sh --fast` runs the tests not marked `slow` or `quality`; the
full command (CI) runs them all.

Tests mark themselves (`@pytest.mark.slow`, `pytestmark = pytest.mark.quality`); the
tests listed in `SLOW` below are marked `slow` here, in one place, so that the fast tier is
visible as a whole. A test belongs in `SLOW` when one run of it costs more than about
2 CPU-seconds (a fuzz campaign, a Z3 proof or BMC, a subprocess run of the CLI, a
benchmark); the figure after each entry is what it cost when it was listed (CPU seconds
of one pytest process, 2026-12-01). Patterns are `fnmatch` patterns over the test id.
"""

from __future__ import annotations

from fnmatch import fnmatch

import pytest

SLOW: dict[str, str] = {
    # campaigns and campaign workers
    "tests/lockstep/test_campaigns.py::test_safe_policies_pass_and_cover*": "8-15 each",
    "tests/lockstep/test_databases.py::test_two_workers_share_a_directory_database": "6.3",
    "tests/lockstep/test_databases.py::test_a_seeded_campaign_with_a_database_is_reproducible":
        "2.5",
    "tests/lockstep/test_databases.py::test_campaign_pools_failures_in_redis": "2.3",
    "tests/lockstep/test_matrix.py::test_failures_are_never_overwritten": "2.8",
    "tests/lockstep/test_matrix.py::test_same_seed_same_campaign": "2.3",
    "tests/lockstep/test_hypofuzz_targets.py::TestThreeLevelPin::*": "2.5",
    "tests/quality/test_patches.py::test_a_run_with_a_bug_says_so_*": "3.7",
    # Z3: induction, parametric proofs, BMC
    "tests/verify/test_z3_prove.py::test_step_invariants_are_inductive*": "10-13 each",
    "tests/verify/test_z3_prove.py::test_prove_unsafe_reports_a_violation": "5.2",
    "tests/verify/test_parametric.py::test_safe_policies_prove_the_pocket_actions*": "3-5 each",
    "tests/verify/test_parametric.py::test_weakening_a_guard_breaks_the_proof*DROPPABLE*": "2.4",
    "tests/verify/test_bmc.py::*symbolic*": "the Z3 BMC engine: tens of seconds",
    "tests/verify/test_bmc.py::test_unsafe_counterexample_from_init_at_its_minimal_depth*":
        "6.1 (explicit)",
    "tests/cli/test_output.py::test_prove_*": "6.6-26 each",
    # benchmarks and subprocess runs of an install
    "tests/bench/test_bench_smoke.py::test_json_has_required_keys": "7.3",
    "tests/cli/test_plain_install.py::*": "2.8 and more",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of `SLOW` (before `-m` deselects by marker)."""
    for item in items:
        if any(fnmatch(item.nodeid, pattern) for pattern in SLOW):
            item.add_marker(pytest.mark.slow)
