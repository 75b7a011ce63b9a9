"""The executable model: the API an integrator reads, and a mock the verifiers drive.

`Model` owns one `State` and runs API programs on it with the concrete
executor. API calls are atomic: OutOfPages rolls the state back and returns
False; misuse raises a `UsageError` and changes nothing. Page actions can also
be applied one at a time (`apply`), which is how Z3 counterexamples replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from . import api
from .config import KVConfig
from .errors import OutOfPages
from .executor import Chooser, ConcreteExecutor, LowestChooser, Step
from .invariants import Invariant, Scope, violated
from .logic import CONCRETE
from .state import Layout, State


class Model:
    def __init__(self, cfg: KVConfig, chooser: Chooser | None = None) -> None:
        self.cfg = cfg
        self.layout = Layout(cfg)
        self.ops = CONCRETE
        self.state: State = self.layout.initial_state()
        self.chooser: Chooser = chooser or LowestChooser()
        self.last_steps: list[Step] = []
        self.last_choices: list[tuple[str, int]] = []
        self.last_failure: str | None = None

    # ---- running programs ----------------------------------------------------------------
    def _run(self, program: Callable[..., None], *args: Any) -> bool:
        ex = ConcreteExecutor(self.layout, self.state, self.chooser)
        self.last_failure = None
        try:
            program(ex, *args)
        except OutOfPages as exc:
            # Exact rollback; an injected fault is consumed by the failure it caused.
            if exc.consumed == "alloc":
                self.state = replace(self.state, fault_alloc=False)
            elif exc.consumed == "copy":
                self.state = replace(self.state, fault_copy=False)
            self.last_steps, self.last_choices = ex.steps, ex.choices
            self.last_failure = str(exc)
            return False
        self.state = ex.s
        self.last_steps, self.last_choices = ex.steps, ex.choices
        return True

    def apply(self, action: str, **params: int) -> None:
        """Apply one page-layer action (its guard must hold)."""
        ex = ConcreteExecutor(self.layout, self.state, self.chooser)
        ex.do(action, **params)
        self.state = ex.s
        self.last_steps = ex.steps

    # ---- the API --------------------------------------------------------------------------
    def create(self, seq: int, prompt: tuple[int, ...] | list[int] = ()) -> None:
        self._run(api.create, seq, tuple(prompt))

    def resume(self, seq: int) -> bool:
        return self._run(api.resume, seq)

    def resize(self, seq: int, capacity: int, history: int) -> bool:
        return self._run(api.resize, seq, capacity, history)

    def commit(self, seq: int, tokens: tuple[int, ...] | list[int]) -> None:
        self._run(api.commit, seq, tuple(tokens))

    def stop_committing(self, seq: int) -> None:
        self._run(api.stop_committing, seq)

    def suspend(self, seq: int) -> None:
        self._run(api.suspend, seq)

    def close(self, seq: int) -> None:
        self._run(api.close, seq)

    # ---- the environment ------------------------------------------------------------------
    def pressure(self, level: int, pool_group: int, slots: int) -> bool:
        return self._run(api.pressure, level, pool_group, slots)

    def advance(self, stream: int) -> None:
        self._run(api.advance, stream)

    def fail_allocation(self) -> None:
        self.state = replace(self.state, fault_alloc=True)

    def fail_copy(self) -> None:
        self.state = replace(self.state, fault_copy=True)

    def call(self, name: str, params: dict[str, Any]) -> Any:
        """Dispatch an API or environment action by name (traces and the lockstep use this)."""
        if name not in {a.name for a in api.API_ACTIONS}:
            allowed = ", ".join(a.name for a in api.API_ACTIONS)
            raise KeyError(f"unknown action '{name}'; expected one of {allowed}")
        method: Callable[..., Any] = getattr(self, name)
        return method(**params)

    # ---- checking -------------------------------------------------------------------------
    def violations(self, scope: Scope = "api") -> list[Invariant]:
        return violated(CONCRETE, self.layout, self.state, scope)

    def check(self, scope: Scope = "api") -> None:
        bad = self.violations(scope)
        if bad:
            names = ", ".join(i.name for i in bad)
            raise AssertionError(f"invariants violated: {names}")
