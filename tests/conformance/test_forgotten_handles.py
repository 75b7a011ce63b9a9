"""A campaign that closes more sequences than the manager keeps closed handles for
(`manager.CLOSED_KEPT`): the lockstep compares no forgotten handle (a false alarm the
heap-churn rule met in the default plan, issue 31)."""

from __future__ import annotations

from kvpocket.impl.manager import CLOSED_KEPT
from kvpocket.verify.conformance.lockstep import Lockstep
from kvpocket.verify.presets import PRESETS


def test_a_forgotten_closed_handle_is_no_divergence() -> None:
    ls = Lockstep(PRESETS["tiny"].config)
    ls.step("create", {"seq": 1, "prompt": []})
    ls.step("close", {"seq": 1})
    first = ls.impl_id[1]
    for _ in range(CLOSED_KEPT + 4):  # every create of a closed slot opens a new handle
        ls.step("create", {"seq": 0, "prompt": []})
        ls.step("close", {"seq": 0})
    assert first not in ls.impl.seqs, "the manager forgot sequence 1's handle"
    ls.step("resume", {"seq": 1})  # a usage error on both sides, then every check
