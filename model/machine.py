"""The executable model: the API an integrator reads, and a mock the verifiers drive.

`Model` owns one `State` and runs API programs on it with the concrete
executor. API calls are atomic: OutOfPages rolls the state back and returns
False; misuse raises a `UsageError` and changes nothing. Page actions can also
be applied one at a time (`apply`), which is how Z3 counterexamples replay.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from . import api
from .config import KVConfig
from .errors import OutOfPages, UsageError
from .executor import Chooser, ConcreteExecutor, LowestChooser, Step
from .incremental import IncrementalChecker
from .invariants import Invariant, Scope
from .logic import CONCRETE
from .state import Layout, State

# Arrays of the model's state longer than this are `SparseArray`s (`state.initial_state`);
# shorter ones are tuples, faster to read and cheap to copy at that size.
SPARSE_ABOVE = 256


@dataclass(frozen=True)
class RunResult:
    """What one action returned: its value (True/False for the actions that return a
    bool, else None) or the usage error it raised before changing anything."""

    value: bool | None = None
    error: UsageError | None = None

    @property
    def failed(self) -> bool:
        """OutOfPages rolled the action back."""
        return self.value is False


class Model:
    def __init__(self, cfg: KVConfig, chooser: Chooser | None = None,
                 reduce_symmetry: bool = False, sparse_above: int = SPARSE_ABOVE) -> None:
        self.cfg = cfg
        self.reduce_symmetry = reduce_symmetry  # see ConcreteExecutor
        self.layout = Layout(cfg)
        self._checker = IncrementalChecker(self.layout)
        self.ops = CONCRETE
        # arrays longer than `sparse_above` are sparse: the state costs what is in use,
        # not the declared geometry
        self.state: State = self.layout.initial_state(sparse_above)
        self.chooser: Chooser = chooser or LowestChooser()
        self.last_steps: list[Step] = []
        self.last_choices: list[tuple[str, int]] = []
        self.last_failure: str | None = None
        self.last_post: State = self.state  # where the last program got to (even midway)

    # ---- running programs ----------------------------------------------------------------
    def run(self, action: str, params: dict[str, Any], chooser: Chooser | None = None
            ) -> RunResult:
        """Run one API or environment action (`api.API`) atomically: a usage error changes
        nothing; OutOfPages rolls the state back exactly (an injected fault is consumed by
        the failure it caused) and the action returns False. A rejected recorded choice
        (`ChoiceRejected`, `MissingChoice`) or a guard violation propagates; `last_steps`
        then holds the page actions that ran before it."""
        spec = api.API.get(action)
        if spec is None:
            raise KeyError(f"unknown action '{action}'; expected one of {', '.join(api.API)}")
        args = [tuple(params[n]) if isinstance(params[n], list) else params[n]
                for n in spec.param_names]
        ex = ConcreteExecutor(self.layout, self.state, chooser or self.chooser,
                              self.reduce_symmetry)
        self.last_failure = None
        try:
            spec.program(ex, *args)
        except UsageError as exc:
            return RunResult(None, exc)
        except OutOfPages as exc:
            if exc.consumed == "alloc":
                self.state = replace(self.state, fault_alloc=False)
            elif exc.consumed == "copy":
                self.state = replace(self.state, fault_copy=False)
            self.last_failure = str(exc)
            return RunResult(False if spec.returns_bool else None)
        finally:  # also when a rejected choice or a guard stops the program midway
            self.last_steps, self.last_choices, self.last_post = ex.steps, ex.choices, ex.s
        self.state = ex.s
        return RunResult(True if spec.returns_bool else None)

    def call(self, name: str, params: dict[str, Any]) -> Any:
        """Run an action by name; a usage error is raised (traces and scripts use this)."""
        result = self.run(name, params)
        if result.error is not None:
            raise result.error
        return result.value

    def apply(self, action: str, **params: int) -> None:
        """Apply one page-layer action (its guard must hold)."""
        ex = ConcreteExecutor(self.layout, self.state, self.chooser)
        ex.do(action, **params)
        self.state = ex.s
        self.last_steps = ex.steps

    # ---- the API (the same calls, by name, for a reader and as a mock) -------------------
    def create(self, seq: int, prompt: tuple[int, ...] | list[int] = ()) -> None:
        self.call("create", {"seq": seq, "prompt": prompt})

    def resume(self, seq: int) -> bool:
        return bool(self.call("resume", {"seq": seq}))

    def resize(self, seq: int, capacity: int, history: int) -> bool:
        return bool(self.call("resize", {"seq": seq, "capacity": capacity, "history": history}))

    def commit(self, seq: int, tokens: tuple[int, ...] | list[int]) -> None:
        self.call("commit", {"seq": seq, "tokens": tokens})

    def stop_committing(self, seq: int) -> None:
        self.call("stop_committing", {"seq": seq})

    def suspend(self, seq: int) -> None:
        self.call("suspend", {"seq": seq})

    def close(self, seq: int) -> None:
        self.call("close", {"seq": seq})

    # ---- the environment ------------------------------------------------------------------
    def pressure(self, level: int, pool_group: int, slots: int) -> bool:
        return bool(self.call("pressure", {"level": level, "pool_group": pool_group,
                                           "slots": slots}))

    def advance(self, stream: int) -> None:
        self.call("advance", {"stream": stream})

    def fail_allocation(self) -> None:
        self.call("fail_allocation", {})

    def fail_copy(self) -> None:
        self.call("fail_copy", {})

    # ---- checking -------------------------------------------------------------------------
    @property
    def checker(self) -> IncrementalChecker:
        """The incremental invariant checker (read it, e.g. `speedcheck`; do not drive it)."""
        return self._checker

    def violations(self, scope: Scope = "api") -> list[Invariant]:
        return self._checker.violated(self.state, scope)

    def check(self, scope: Scope = "api") -> None:
        bad = self.violations(scope)
        if bad:
            names = ", ".join(i.name for i in bad)
            raise AssertionError(f"invariants violated: {names}")
