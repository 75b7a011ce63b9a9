"""The interface between the target campaign and a real engine's KV cache manager.

A target adapts one engine (vLLM today; SGLang or another could follow) to three calls:
`build` makes a fresh manager for a configuration, `step` applies one serving operation
(`workload.Op`) and runs every check, `observe` summarises the state for reports. The
campaign (`campaign.py`) only ever talks to this interface, so a second engine needs a
new module here and an entry in `registry.py`, not a change to the campaign.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvpocket.verify.targets.workload import Op, WorkloadShape


class TargetUnavailable(Exception):
    """The engine is not installed in this interpreter; the message says what to install."""


class CheckFailure(AssertionError):
    """A check failed after a step: `check` names which (data, pool, trace), `detail` why."""

    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"{check}: {detail}")
        self.check = check
        self.detail = detail


@dataclass(frozen=True)
class TargetConfig:
    """A small geometry every target understands: one pool of `num_blocks` blocks of
    `block_size` tokens (the engine's null block, if it has one, included), the attention
    kinds of its groups, the sliding window in tokens, the longest request, and whether
    the engine runs with EAGLE (which changes how prefix hits end)."""

    name: str
    block_size: int
    num_blocks: int
    groups: tuple[str, ...]  # "full" or "swa", one per KV cache group
    sliding_window: int
    max_model_len: int
    eagle: bool = False  # the engine keeps room for EAGLE speculative decoding
    description: str = field(default="", compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "block_size": self.block_size, "num_blocks": self.num_blocks,
                "groups": list(self.groups), "sliding_window": self.sliding_window,
                "max_model_len": self.max_model_len, "eagle": self.eagle}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> TargetConfig:
        return TargetConfig(str(d["name"]), int(d["block_size"]), int(d["num_blocks"]),
                            tuple(str(g) for g in d["groups"]), int(d["sliding_window"]),
                            int(d["max_model_len"]), bool(d.get("eagle", False)))

    def shape(self) -> WorkloadShape:
        return WorkloadShape(block_size=self.block_size, max_len=self.max_model_len)


# The coverage key every target counts once per call that schedules tokens (an admission
# or a running request's step): reports give scheduler steps per second from it.
SCHEDULER_STEP = "scheduler_step"


@dataclass
class StepStats:
    """What the steps of one run reached, for the campaign's coverage line."""

    counts: dict[str, int] = field(default_factory=dict)

    def hit(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n


class Instance(Protocol):
    """One engine manager under test, built fresh for every example."""

    stats: StepStats

    def step(self, op: Op) -> None:
        """Apply `op`, then run every check; raise `CheckFailure` on the first that fails."""

    def observe(self) -> dict[str, Any]:
        """A JSON-ready summary of the state (free blocks, requests, cached blocks)."""

    def finish(self) -> None:
        """End of the run: free what is left and run the end-of-run checks."""


class Target(Protocol):
    name: str

    def version(self) -> str:
        """The engine's version, as the first line of every report shows it."""

    def presets(self) -> Mapping[str, TargetConfig]:
        """The configurations `--config` may name; the first is the default."""

    def build(self, cfg: TargetConfig) -> Instance:
        """A fresh manager for `cfg` (raises `TargetUnavailable` without the engine)."""
