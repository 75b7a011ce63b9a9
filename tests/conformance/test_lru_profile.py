"""The lockstep checks kvpocket's implementation against the `lru` profile, not only the
safety spec: an implementation that leaves its own eviction order diverges, though the
same victim is safe (the safety-spec model accepts it)."""

from __future__ import annotations

from typing import Any

import pytest

from kvpocket.impl.eviction import EvictionQueue
from kvpocket.model import Model
from kvpocket.model.config import Order
from kvpocket.model.errors import ChoiceRejected
from kvpocket.model.executor import RecordedChooser
from kvpocket.verify.conformance.lockstep import Divergence, Lockstep
from kvpocket.verify.presets import preset


class MostRecentFirst:
    def choose(self, level: int, pool_group: int, queue: EvictionQueue) -> int | None:
        if not queue.entries:
            return None
        return max(queue.entries.items(), key=lambda kv: kv[1][1])[0]


SCRIPT: list[tuple[str, dict[str, Any]]] = [("create", {"seq": 0, "prompt": []}), ("resume", {"seq": 0}),
          ("resize", {"seq": 0, "capacity": 4, "history": 3}), ("suspend", {"seq": 0})]
PRESSURE: tuple[str, dict[str, Any]] = ("pressure", {"level": 0, "pool_group": 0, "slots": 3})


def test_the_lockstep_model_runs_the_lru_profile() -> None:
    ls = Lockstep(preset("tiny"), check_data=False)
    assert ls.model.cfg.order is Order.LRU and ls.cfg.order is Order.ANY


def test_another_eviction_order_diverges_in_lockstep() -> None:
    ls = Lockstep(preset("tiny"), check_data=False)
    ls.impl.victim_policy = MostRecentFirst()
    for action, params in SCRIPT:
        ls.step(action, params)
    with pytest.raises(Divergence, match="the model rejects the implementation's choice"):
        ls.step(*PRESSURE)
    # The same victim on the model alone: block 1's page at GPU slot 1, queued after block
    # 0's. The safety spec takes it; the lru profile refuses it (block 0's page is the head).
    for order, legal in ((Order.ANY, True), (Order.LRU, False)):
        m = Model(preset("tiny").with_order(order))
        for action, params in SCRIPT:
            m.call(action, params)
        newest = RecordedChooser({"victim": [(0, 0, 1)]}, by="label")
        if legal:
            assert m.run(*PRESSURE, newest).value is True and not m.violations()
        else:
            with pytest.raises(ChoiceRejected):
                m.run(*PRESSURE, newest)
