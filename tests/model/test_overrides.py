"""Spec mutants are label overrides applied from outside: the labels they name exist, an
override reaches both the guard and the program, and it is always restored."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from kvpocket.model import overrides
from kvpocket.model.api import WINDOW_START
from kvpocket.model.logic import CONCRETE
from kvpocket.model.pages import PAGE_ACTIONS, POCKET_NOT_FULL, STILL_VALID
from kvpocket.model.spec import page_action_guard_text
from kvpocket.model.state import Layout
from kvpocket.verify.presets import preset
from kvpocket.verify.quality.seeded import MUTANTS

LAY = Layout(preset("tiny"))


def _spec_labels() -> set[str]:
    labels = {WINDOW_START, STILL_VALID, POCKET_NOT_FULL}
    for name in PAGE_ACTIONS:
        labels.update(page_action_guard_text(LAY.cfg, name))
    return labels


def test_every_spec_mutant_overrides_a_label_the_spec_has() -> None:
    spec_mutants = [m for m in MUTANTS.values() if m.layer == "model"]
    assert spec_mutants and all(m.overrides for m in spec_mutants)
    known = _spec_labels()
    for m in spec_mutants:
        assert set(m.overrides) <= known, (m.name, set(m.overrides) - known)


def test_override_reaches_the_guard_and_is_restored() -> None:
    drop = PAGE_ACTIONS["drop"]
    s = LAY.initial_state()
    before = dict(drop.guard(CONCRETE, LAY, s, {"page": 0}))
    assert before["page is committed"] is False
    with overrides.overriding({"page is committed": ("always", True)}):
        assert dict(drop.guard(CONCRETE, LAY, s, {"page": 0}))["page is committed"] is True
    assert dict(drop.guard(CONCRETE, LAY, s, {"page": 0})) == before
    assert not overrides.any_override()


def test_overrides_reach_workers_by_install_never_through_the_environment() -> None:
    """The spec reads no environment: a worker gets the overrides from the process that
    starts it (the campaign's pool initializer), and a process started otherwise has none."""
    from kvpocket.verify.conformance.fuzz import init_worker

    env_before = dict(os.environ)
    mutant = {"page is committed": ("always", True)}
    ctx = multiprocessing.get_context("spawn")
    with overrides.overriding(mutant):
        assert dict(os.environ) == env_before
        with ctx.Pool(1, initializer=init_worker, initargs=(None, (), overrides.active())) as pool:
            assert pool.apply(overrides.active) == mutant
        with ctx.Pool(1) as pool:
            assert pool.apply(overrides.active) == {}


def test_shift_override_moves_an_integer_term() -> None:
    with overrides.overriding({WINDOW_START: ("add", -1)}):
        assert overrides.named(CONCRETE, WINDOW_START, 10) == 9
    assert overrides.named(CONCRETE, WINDOW_START, 10) == 10


@pytest.mark.parametrize("bad", [("never", True), ("add",), ("add", "1"), "always"])
def test_a_malformed_override_names_the_label_and_the_kinds(bad: object) -> None:
    with pytest.raises(ValueError, match=r"override of 'x'.*always, add"), \
            overrides.overriding({"x": bad}):  # type: ignore[dict-item]
        pass
    assert not overrides.any_override()
