"""The interface between the target campaign and a real engine's KV cache manager.

A target adapts one engine (vLLM today; SGLang or another could follow) to three calls:
`build` makes a fresh manager for a configuration, `step` applies one serving operation
(`workload.Op`) and runs every check, `observe` summarises the state for reports. The
campaign (`campaign.py`) only ever talks to this interface, so a second engine needs a
new module here and an entry in `registry.py`, not a change to the campaign.
"""

from __future__ import annotations

import importlib.metadata
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvpocket.verify.targets.workload import Op, WorkloadShape


class TargetUnavailable(Exception):
    """The engine is not installed in this interpreter; the message says what to install."""


def installed_version(distributions: tuple[str, ...], install_hint: str) -> str:
    """The version of the first of `distributions` installed here, read without importing
    the engine (its import takes a minute); `TargetUnavailable(install_hint)` if none is."""
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise TargetUnavailable(install_hint)


@dataclass(frozen=True)
class KnownBug:
    """An engine bug a target still reports, with the release that fixed it (None: not
    fixed in any release the target knows); `fuzz --avoid-known` steers clear of it."""

    what: str
    fixed_in: str | None = None

    def present_in(self, version: str) -> bool:
        return self.fixed_in is None or release(version) < release(self.fixed_in)


def bugs_present(bugs: Mapping[str, KnownBug], version: str) -> dict[str, str]:
    """The known bugs of `bugs` present in `version`: name -> what."""
    return {name: bug.what for name, bug in bugs.items() if bug.present_in(version)}


def widened_avoidance(present: Iterable[str], avoided: Iterable[str],
                      only: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The known bugs a target steers clear of once it also steers clear of `only` (None:
    every bug `present` in the release) on top of those it already `avoided`; None when
    that adds none (`without_known_bugs`)."""
    have = set(avoided)
    wanted = have | (set(present) if only is None else set(only) & set(present))
    return None if wanted == have else tuple(sorted(wanted))


def release(version: str) -> tuple[int, ...]:
    """A release's number as a tuple to compare ("0.10.1.1+cpu" -> (0, 10, 1, 1),
    "0.5.15.post1" -> (0, 5, 15))."""
    out: list[int] = []
    for part in version.split("+")[0].split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def is_installed(distributions: tuple[str, ...]) -> bool:
    try:
        installed_version(distributions, "")
    except TargetUnavailable:
        return False
    return True


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
    the engine runs with EAGLE (which changes how prefix hits end). `group_block_sizes`,
    when given, is each group's own block size (vLLM's hybrid allocator with pages of
    different sizes, e.g. Gemma 4's): each a multiple of `block_size`, which stays the
    granularity prompts are hashed at. `options` are engine settings the target reads by
    name (vLLM's: docs/targets/vllm.md); an option left out takes the engine's default
    as it serves, so a reproducer replays under the release it runs on."""

    name: str
    block_size: int
    num_blocks: int
    groups: tuple[str, ...]  # "full" or "swa", one per KV cache group
    sliding_window: int
    max_model_len: int
    eagle: bool = False  # the engine keeps room for EAGLE speculative decoding
    description: str = field(default="", compare=False)
    group_block_sizes: tuple[int, ...] = ()  # empty: every group's blocks are `block_size`
    options: tuple[tuple[str, Any], ...] = ()  # (name, JSON value), sorted by name

    def option(self, name: str, default: Any) -> Any:
        return dict(self.options).get(name, default)

    def __post_init__(self) -> None:
        sizes = self.group_block_sizes
        if sizes and (len(sizes) != len(self.groups)
                      or any(s <= 0 or s % self.block_size for s in sizes)):
            raise ValueError(f"group_block_sizes {list(sizes)}: one per group "
                             f"({len(self.groups)}), each a multiple of block_size "
                             f"{self.block_size}")

    def group_block_size(self, group: int) -> int:
        """Tokens per block of KV cache group `group`."""
        return self.group_block_sizes[group] if self.group_block_sizes else self.block_size

    @property
    def mixed_block_sizes(self) -> bool:
        return len(set(self.group_block_sizes)) > 1

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "block_size": self.block_size,
                             "num_blocks": self.num_blocks,
                             "groups": list(self.groups),
                             "sliding_window": self.sliding_window,
                             "max_model_len": self.max_model_len, "eagle": self.eagle}
        if self.group_block_sizes:
            d["group_block_sizes"] = list(self.group_block_sizes)
        if self.options:
            d["options"] = dict(self.options)
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> TargetConfig:
        return TargetConfig(str(d["name"]), int(d["block_size"]), int(d["num_blocks"]),
                            tuple(str(g) for g in d["groups"]), int(d["sliding_window"]),
                            int(d["max_model_len"]), bool(d.get("eagle", False)),
                            group_block_sizes=tuple(int(s) for s in
                                                    d.get("group_block_sizes", ())),
                            options=tuple(sorted(dict(d.get("options", {})).items())))

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
    # The default command's budget in examples, chosen by measurement for this target's
    # workload (its docs page, "the default budget"): every rare state reached on every
    # preset, with a margin.
    default_examples: int

    def version(self) -> str:
        """The engine's version, as the first line of every report shows it."""

    def presets(self) -> Mapping[str, TargetConfig]:
        """The configurations `--config` may name; the first is the default."""

    def build(self, cfg: TargetConfig) -> Instance:
        """A fresh manager for `cfg` (raises `TargetUnavailable` without the engine)."""

    def rare_states(self, cfg: TargetConfig) -> tuple[str, ...]:
        """The coverage keys a campaign on `cfg` must reach to not be vacuous: the
        report counts them and names those never reached (a coverage gap, exit 3)."""
