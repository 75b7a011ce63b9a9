"""Random API and environment calls on the model alone: invariants hold under the safe
policies after every call, and the page-life diagram covers every transition taken."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvpocket.model import Model
from kvpocket.model.config import KVConfig, PocketPolicy, SeqStatus
from kvpocket.model.errors import UsageError
from kvpocket.model.spec import PAGE_LIFE, life_of
from kvpocket.verify.presets import PRESETS

OBSERVED: set[tuple[str, str, str]] = set()


def machine_for(cfg: KVConfig) -> type[RuleBasedStateMachine]:
    class ModelMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.m = Model(cfg)

        def _call(self, name: str, *args: int) -> None:
            before = self.m.state
            try:
                getattr(self.m, name)(*args)
            except UsageError:
                assert self.m.state == before  # misuse never changes anything
                return
            lay = self.m.layout
            # Replay the page steps to see each page's life transitions.
            from kvpocket.model.executor import ConcreteExecutor, LowestChooser

            ex = ConcreteExecutor(lay, before, LowestChooser())
            for step in self.m.last_steps:
                lives = [life_of(lay, ex.s, p) for p in range(lay.pages)]
                ex.do(step.action, **step.params)
                for p in range(lay.pages):
                    after = life_of(lay, ex.s, p)
                    if after != lives[p]:
                        OBSERVED.add((step.action, lives[p].value, after.value))
                        assert (lives[p], after) in PAGE_LIFE[step.action], (
                            f"{step.action} moved page {p} {lives[p]} -> {after}, "
                            "which the page-life diagram does not list")

        seqs = st.integers(0, cfg.num_sequences - 1)

        @rule(seq=seqs, prompt=st.lists(st.integers(0, 2), max_size=6))
        def create(self, seq: int, prompt: list[int]) -> None:
            self._call("create", seq, tuple(prompt))  # type: ignore[arg-type]

        @rule(seq=seqs)
        def resume(self, seq: int) -> None:
            self._call("resume", seq)

        @rule(seq=seqs, grow=st.integers(0, 3), advance=st.integers(0, 3))
        def resize(self, seq: int, grow: int, advance: int) -> None:
            s = self.m.state
            if s.seq_status[seq] != SeqStatus.ACTIVE:
                return
            h = min(s.history[seq] + advance, cfg.max_capacity)
            cap = min(max(s.capacity[seq], h) + grow, cfg.max_capacity)
            self._call("resize", seq, cap, h)

        @rule(seq=seqs)
        def decode(self, seq: int) -> None:
            s = self.m.state
            if s.seq_status[seq] == SeqStatus.ACTIVE and s.history[seq] + 2 <= cfg.max_capacity:
                self._call("resize", seq, s.history[seq] + 2, s.history[seq] + 1)

        @rule(seq=seqs, tokens=st.lists(st.integers(0, 2), min_size=1, max_size=4))
        def commit(self, seq: int, tokens: list[int]) -> None:
            self._call("commit", seq, tokens)  # type: ignore[arg-type]

        @rule(seq=seqs)
        def stop_committing(self, seq: int) -> None:
            self._call("stop_committing", seq)

        @rule(seq=seqs)
        def suspend(self, seq: int) -> None:
            self._call("suspend", seq)

        @rule(seq=seqs)
        def close(self, seq: int) -> None:
            self._call("close", seq)

        @rule(level=st.integers(0, cfg.last_level), n=st.integers(1, 3))
        def pressure(self, level: int, n: int) -> None:
            self._call("pressure", level, 0, n)

        @rule(stream=st.integers(0, cfg.num_sequences))
        def advance(self, stream: int) -> None:
            self._call("advance", stream)

        @rule()
        def fail_allocation(self) -> None:
            self.m.fail_allocation()

        @invariant()
        def invariants_hold(self) -> None:
            assert [i.name for i in self.m.violations()] == []

    return ModelMachine


SAFE = [(name, policy) for name in ("tiny", "two-level", "three-level", "split-pools")
        for policy in (PocketPolicy.REVALIDATE, PocketPolicy.PIN)]


@pytest.mark.parametrize(("preset", "policy"), SAFE)
def test_invariants_hold_under_safe_policies(preset: str, policy: PocketPolicy) -> None:
    cfg = PRESETS[preset].config.with_pocket(True, policy)
    machine = machine_for(cfg)
    machine.TestCase.settings = settings(
        max_examples=12, stateful_step_count=40, derandomize=True, deadline=None,
        suppress_health_check=list(HealthCheck), database=None,
    )
    machine.TestCase().runTest()
