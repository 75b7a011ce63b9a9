"""Configuration vocabulary shared by the model, the implementation and the verifiers.

Every value is validated on construction; a bad value raises `ConfigError`
naming the field and the allowed range, so a typo never becomes a silently
different experiment.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum
from functools import cached_property
from typing import Any, TypeVar

GPU_LEVEL = 0
BAD_PAGE_INDEX = -1
NO_SLOT = -1
NONE = -1  # "no page", "no sequence", "no pocket" in integer-valued state

PRIORITY_MIN = 0
PRIORITY_MAX = 100
PRIORITY_DEFAULT = 35


class ConfigError(ValueError):
    """A configuration value is out of range. The message names the field."""

    def __init__(self, field_name: str, allowed: str, got: object) -> None:
        super().__init__(f"invalid config field '{field_name}': expected {allowed}, got {got!r}")
        self.field_name = field_name
        self.allowed = allowed
        self.got = got


class PageStatus(IntEnum):
    """Holder/lock status of a page (values as in the upstream manager)."""

    LOCKED = 0  # required at GPU: no eviction, no drop
    HELD = 1  # eviction (migration down) allowed, drop not allowed
    DROPPABLE = 2  # both allowed


class PocketPolicy(StrEnum):
    """How a pop from the reuse pocket protects itself against migration while parked."""

    REVALIDATE = "revalidate"  # pop re-checks level, slot, queue; unqueues; waits on the event
    PIN = "pin"  # parked pages are excluded from eviction, so they cannot move
    UNSAFE = "unsafe"  # checks only at park time (the pull request as first written): the bug

    @classmethod
    def parse(cls, value: object, field_name: str = "pocket.policy") -> PocketPolicy:
        if isinstance(value, PocketPolicy):
            return value
        try:
            return cls(str(value))
        except ValueError:
            raise ConfigError(field_name, "one of revalidate, pin, unsafe", value) from None



_E = TypeVar("_E", bound=StrEnum)


def _parse_choice(cls: type[_E], value: object, field_name: str) -> _E:
    """A member of a string enum from itself or its value; else a ConfigError naming the
    field and the allowed values."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        try:
            return cls(value)
        except ValueError:
            pass
    raise ConfigError(field_name, "one of " + ", ".join(m.value for m in cls), value)

class EvictParked(StrEnum):
    """What the eviction cascade does with a parked page it picks as a victim.

    A parked page is uncommitted and out of the window: nobody reads it again except a
    pop that reuses its GPU slot. Copying it down a level only moves dead data.
    """

    DROP = "drop"  # its slot is released at once (no copy); the pocket entry stays, slotless
    MIGRATE = "migrate"  # it migrates one level down like any HELD page (the PR as written)

    @classmethod
    def parse(cls, value: object, field_name: str = "pocket.evict_parked") -> EvictParked:
        return _parse_choice(cls, value, field_name)


class Order(StrEnum):
    """Which policy profile decides the choices the safety spec leaves free.

    The safety spec (`any`) lets eviction take any queued page of the level and pool
    group, a pop take any pocket entry and an allocation any free slot: every correct
    manager is allowed. `lru` is kvpocket's own engine on top of it: the victim is the
    head of its queue (lowest life-cycle priority, then least recently queued) and a pop
    takes the oldest pocket entry. Slots stay free under both (the implementation's slot
    policy is pluggable).
    """

    ANY = "any"
    LRU = "lru"

    @classmethod
    def parse(cls, value: object, field_name: str = "order") -> Order:
        return _parse_choice(cls, value, field_name)


class SeqStatus(IntEnum):
    """Life of a sequence's KV cache. A sequence slot starts FREE (never created)."""

    FREE = 0
    ACTIVE = 1
    SUSPENDED = 2
    CLOSED = 3


class CommitState(IntEnum):
    ALLOWED = 0
    USER_STOP = 1


INT64_MAX = 2**63 - 1  # every integer field is a signed 64-bit value at most
# A window or a sink is at most the longest sequence a config can describe (max_blocks x
# tokens_per_block at their maxima): beyond it the window arithmetic (h + 1 - w, in
# NumPy's int64 as well) means nothing, and 10**30 overflowed inside the kit.
MAX_TOKENS = (1 << 20) * 4096


def _check_int(name: str, value: object, lo: int, hi: int = INT64_MAX) -> int:
    """An integer field in [lo, hi]: every field has an upper bound (64-bit at most)."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(name, f"an integer in [{lo}, {_num(hi)}]", value)
    return value


def _num(n: int) -> str:
    """A bound as a reader checks it: 2**k for the large powers of two."""
    return f"2**{n.bit_length() - 1}" if n >= 1 << 16 and n & (n - 1) == 0 else (
        "2**63-1" if n == INT64_MAX else str(n))


@dataclass(frozen=True)
class LifeCycle:
    """A group of layers sharing one slot per block.

    `window` is the sliding-window size in tokens (None: full attention);
    `sink_tokens` are never evicted from the window; `pool_group` selects the
    slot allocators (life cycles of equal slot size share a pool group);
    `priority` is the eviction priority of its pages (lower is evicted first).
    """

    name: str
    window: int | None = None
    sink_tokens: int = 0
    pool_group: int = 0
    priority: int = PRIORITY_DEFAULT

    def validate(self, where: str) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ConfigError(f"{where}.name", "a non-empty string", self.name)
        if self.window is not None:
            _check_int(f"{where}.window", self.window, 1, MAX_TOKENS)
        _check_int(f"{where}.sink_tokens", self.sink_tokens, 0, MAX_TOKENS)
        if self.sink_tokens and self.window is None:
            raise ConfigError(f"{where}.sink_tokens", "0 for a full-attention life cycle", 0)
        _check_int(f"{where}.pool_group", self.pool_group, 0)
        _check_int(f"{where}.priority", self.priority, PRIORITY_MIN, PRIORITY_MAX)

    @property
    def is_swa(self) -> bool:
        return self.window is not None


@dataclass(frozen=True)
class PocketConfig:
    """The SWA decode slot-reuse pocket (`enable_swa_decode_slot_reuse`).

    `evict_parked`: a parked page picked by the eviction cascade is dropped (its GPU slot
    released, no copy; the default) or migrated one level down (see `EvictParked`).
    """

    enabled: bool = False
    capacity: int = 2
    policy: PocketPolicy = PocketPolicy.REVALIDATE
    evict_parked: EvictParked = EvictParked.DROP

    def validate(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError("pocket.enabled", "true or false", self.enabled)
        _check_int("pocket.capacity", self.capacity, 1, 8)
        PocketPolicy.parse(self.policy)
        EvictParked.parse(self.evict_parked)

    @property
    def drops_parked(self) -> bool:
        """The eviction cascade drops a parked victim instead of migrating it. False under
        `pin`, which never evicts a parked page: there is nothing to drop (and the model
        and Z3 need not consider it)."""
        return self.evict_parked == EvictParked.DROP and self.policy != PocketPolicy.PIN


def swa_life_cycle(window: int, sink_tokens: int = 0, priority: int = 20) -> LifeCycle:
    return LifeCycle("swa", window=window, sink_tokens=sink_tokens, priority=priority)


def full_life_cycle(priority: int = PRIORITY_DEFAULT) -> LifeCycle:
    return LifeCycle("full", window=None, priority=priority)


@dataclass(frozen=True)
class KVConfig:
    """A bounded KV-cache configuration, read by the model, the implementation and Z3.

    `slots_per_level[L]` is the number of slots of each pool group at level L
    (level 0 is GPU, then host, then disk). `max_blocks` bounds a sequence's
    capacity (`capacity <= max_blocks * tokens_per_block`); `max_pages` bounds
    how many pages may be alive at once in the model (an implementation needs no
    such bound; it follows from the slot counts).
    """

    tokens_per_block: int = 2
    life_cycles: tuple[LifeCycle, ...] = field(
        default_factory=lambda: (swa_life_cycle(window=3), full_life_cycle())
    )
    slots_per_level: tuple[int, ...] = (6, 6)
    num_sequences: int = 2
    max_blocks: int = 6
    max_pages: int = 0  # 0: derived (`derived_max_pages`)
    pocket: PocketConfig = field(default_factory=PocketConfig)
    order: Order = Order.ANY  # the policy profile (safety spec `any`, or kvpocket's `lru`)
    # max_pages was derived (given as 0), so `with_pocket` derives it again; not compared.
    pages_derived: bool = field(default=False, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        pocket: object = self.pocket
        if isinstance(pocket, PocketConfig):  # plain strings are accepted for the enums too
            policy, evict = PocketPolicy.parse(pocket.policy), EvictParked.parse(pocket.evict_parked)
            if policy is not pocket.policy or evict is not pocket.evict_parked:
                object.__setattr__(
                    self, "pocket", replace(pocket, policy=policy, evict_parked=evict)
                )
        order: object = self.order
        if isinstance(order, str) and not isinstance(order, Order):  # a plain string
            object.__setattr__(self, "order", Order.parse(order))
        if self.max_pages == 0 and isinstance(self.slots_per_level, tuple) and all(
                isinstance(n, int) for n in self.slots_per_level):  # else `validate` names it
            object.__setattr__(self, "max_pages", self.derived_max_pages())
            object.__setattr__(self, "pages_derived", True)
        self.validate()

    def derived_max_pages(self) -> int:
        """The default bound on live pages: one per slot, plus one per pocket position when
        parked pages can be dropped (a dropped parked page lives on, slotless, in its
        pocket: HELD pages are evictable only above the last level; `pin` never evicts
        them)."""
        total = sum(self.slots_per_level) * max(1, self.num_pool_groups_unchecked())
        pocket = self.pocket
        if (isinstance(pocket, PocketConfig) and pocket.enabled and pocket.drops_parked
                and len(self.slots_per_level) > 1):
            try:
                swa = sum(1 for lc in self.life_cycles if isinstance(lc, LifeCycle) and lc.is_swa)
                total += int(self.num_sequences * swa * pocket.capacity)
            except (TypeError, ValueError):  # a bad value: `validate` names its field
                pass
        return total

    def num_pool_groups_unchecked(self) -> int:
        try:
            return 1 + max(lc.pool_group for lc in self.life_cycles)
        except (TypeError, ValueError, AttributeError):
            return 1

    def validate(self) -> None:
        _check_int("tokens_per_block", self.tokens_per_block, 1, 4096)
        if not isinstance(self.life_cycles, tuple) or not self.life_cycles:
            raise ConfigError("life_cycles", "a non-empty tuple of LifeCycle", self.life_cycles)
        names = set()
        for i, lc in enumerate(self.life_cycles):
            if not isinstance(lc, LifeCycle):
                raise ConfigError(f"life_cycles[{i}]", "a LifeCycle", lc)
            lc.validate(f"life_cycles[{i}]")
            if lc.name in names:
                raise ConfigError(f"life_cycles[{i}].name", "a unique name", lc.name)
            names.add(lc.name)
        groups = sorted({lc.pool_group for lc in self.life_cycles})
        if groups != list(range(len(groups))):
            raise ConfigError(
                "life_cycles.pool_group", "pool groups numbered 0..G-1 without gaps", groups
            )
        if not isinstance(self.slots_per_level, tuple) or not 1 <= len(self.slots_per_level) <= 3:
            raise ConfigError(
                "slots_per_level", "a tuple of 1 to 3 slot counts (GPU, host, disk)",
                self.slots_per_level,
            )
        for i, n in enumerate(self.slots_per_level):
            _check_int(f"slots_per_level[{i}]", n, 1, 1 << 24)
        _check_int("num_sequences", self.num_sequences, 1, 1 << 20)
        _check_int("max_blocks", self.max_blocks, 1, 1 << 20)
        _check_int("max_pages", self.max_pages, 1, 1 << 26)
        if not isinstance(self.pocket, PocketConfig):
            raise ConfigError("pocket", "a PocketConfig", self.pocket)
        self.pocket.validate()
        Order.parse(self.order)

    # ---- derived quantities -------------------------------------------------------------
    @property
    def num_levels(self) -> int:
        return len(self.slots_per_level)

    @property
    def last_level(self) -> int:
        return self.num_levels - 1

    @cached_property  # read on every slot index the model computes
    def num_pool_groups(self) -> int:
        return 1 + max(lc.pool_group for lc in self.life_cycles)

    @property
    def num_life_cycles(self) -> int:
        return len(self.life_cycles)

    @property
    def max_capacity(self) -> int:
        return self.max_blocks * self.tokens_per_block

    def pool_group_of(self, lc: int) -> int:
        return self.life_cycles[lc].pool_group

    def with_pocket(
        self, enabled: bool = True, policy: PocketPolicy | str | None = None,
        capacity: int | None = None, evict_parked: EvictParked | str | None = None,
    ) -> KVConfig:
        """The same configuration with the pocket switched; unnamed settings are kept."""
        pocket = PocketConfig(
            enabled=enabled,
            capacity=self.pocket.capacity if capacity is None else capacity,
            policy=self.pocket.policy if policy is None else PocketPolicy.parse(policy),
            evict_parked=(self.pocket.evict_parked if evict_parked is None
                          else EvictParked.parse(evict_parked)),
        )
        # A derived page bound is derived again for the new pocket; an explicit one stays.
        return replace(self, pocket=pocket, max_pages=0 if self.pages_derived else self.max_pages)

    def with_order(self, order: Order | str) -> KVConfig:
        """The same configuration under another policy profile (`Order`)."""
        out = replace(self, order=Order.parse(order))
        object.__setattr__(out, "pages_derived", self.pages_derived)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens_per_block": self.tokens_per_block,
            "life_cycles": [
                {"name": lc.name, "window": lc.window, "sink_tokens": lc.sink_tokens,
                 "pool_group": lc.pool_group, "priority": lc.priority}
                for lc in self.life_cycles
            ],
            "slots_per_level": list(self.slots_per_level),
            "num_sequences": self.num_sequences,
            "max_blocks": self.max_blocks,
            "max_pages": self.max_pages,
            "pocket": {"enabled": self.pocket.enabled, "capacity": self.pocket.capacity,
                       "policy": self.pocket.policy.value,
                       "evict_parked": self.pocket.evict_parked.value},
            "order": self.order.value,
        }

    @staticmethod
    def from_json(data: object, complete: bool = False) -> KVConfig:
        """Build a config from `to_json` output; unknown fields are named. `complete`
        (a configuration file): every field must be given, a missing one is an error
        listing what is missing and the values allowed (no silent default for the thing
        under test: a pocket without "enabled" would run with the pocket off). Otherwise
        (a trace or log header) fields written by later versions may be left out."""
        if not isinstance(data, dict):
            raise ConfigError("config", "a JSON object", data)
        cfg = KVConfig._from_json(data)  # the values given are checked first
        if complete:
            _require_all(data)
        return cfg

    @staticmethod
    def _from_json(data: dict[Any, Any]) -> KVConfig:
        _closed(data, FIELDS, "")
        kwargs: dict[str, Any] = {}
        for key in ("tokens_per_block", "num_sequences", "max_blocks", "max_pages"):
            if key in data:
                kwargs[key] = data[key]
        if "order" in data:
            kwargs["order"] = Order.parse(data["order"])
        if "slots_per_level" in data:
            if not isinstance(data["slots_per_level"], list):
                raise ConfigError("slots_per_level", "a list of integers", data["slots_per_level"])
            kwargs["slots_per_level"] = tuple(data["slots_per_level"])
        if "life_cycles" in data:
            lcs = data["life_cycles"]
            if not isinstance(lcs, list):
                raise ConfigError("life_cycles", "a list of objects", lcs)
            built = []
            for i, item in enumerate(lcs):
                if not isinstance(item, dict):
                    raise ConfigError(f"life_cycles[{i}]", "an object", item)
                _closed(item, LIFE_CYCLE_FIELDS, f"life_cycles[{i}].")
                if "name" not in item:
                    raise ConfigError(f"life_cycles[{i}].name", "a non-empty string", None)
                built.append(LifeCycle(**item))
            kwargs["life_cycles"] = tuple(built)
        if "pocket" in data:
            p = data["pocket"]
            if not isinstance(p, dict):
                raise ConfigError("pocket", "an object", p)
            _closed(p, POCKET_FIELDS, "pocket.")
            kwargs["pocket"] = PocketConfig(
                enabled=p.get("enabled", False), capacity=p.get("capacity", 2),
                policy=PocketPolicy.parse(p.get("policy", "revalidate")),
                evict_parked=EvictParked.parse(p.get("evict_parked", "drop")),
            )
        return KVConfig(**kwargs)


# A configuration file's fields and the values each takes (the message for a missing or
# unknown one lists them).
FIELDS = {
    "tokens_per_block": "an integer in [1, 4096]",
    "life_cycles": "a list of life cycles",
    "slots_per_level": "a list of 1 to 3 slot counts, each in [1, 2**24]",
    "num_sequences": "an integer in [1, 2**20]",
    "max_blocks": "an integer in [1, 2**20]",
    "max_pages": "an integer in [1, 2**26], or 0 to derive it",
    "pocket": "an object",
    "order": "any or lru",
}
LIFE_CYCLE_FIELDS = {
    "name": "a non-empty string",
    "window": f"null (full attention) or an integer in [1, {_num(MAX_TOKENS)}]",
    "sink_tokens": f"an integer in [0, {_num(MAX_TOKENS)}]",
    "pool_group": "an integer, pool groups numbered 0..G-1",
    "priority": f"an integer in [{PRIORITY_MIN}, {PRIORITY_MAX}]",
}
POCKET_FIELDS = {
    "enabled": "true or false",
    "capacity": "an integer in [1, 8]",
    "policy": "revalidate, pin or unsafe",
    "evict_parked": "drop or migrate",
}


def _closed(data: dict[Any, Any], fields: dict[str, str], prefix: str) -> None:
    """No unknown field."""
    for key in data:
        if key not in fields:
            raise FieldSetError(f"{prefix}{key}", f"unknown config field '{prefix}{key}'; "
                                "expected one of " + ", ".join(f"{prefix}{k}" for k in fields))


def _require_all(data: dict[str, Any]) -> None:
    """Every field of a configuration file given (all the missing ones named at once)."""
    missing = [(k, FIELDS[k]) for k in FIELDS if k not in data]
    for i, lc in enumerate(data.get("life_cycles", [])):
        missing += [(f"life_cycles[{i}].{k}", v) for k, v in LIFE_CYCLE_FIELDS.items()
                    if k not in lc]
    if "pocket" in data:
        missing += [(f"pocket.{k}", v) for k, v in POCKET_FIELDS.items()
                    if k not in data["pocket"]]
    if missing:
        raise FieldSetError(missing[0][0], "a configuration file states every field; "
                            "missing: " + "; ".join(f"{k} ({v})" for k, v in missing))


class FieldSetError(ConfigError):
    """An unknown or a missing field of a configuration object (the message says which)."""

    def __init__(self, field_name: str, message: str) -> None:
        ValueError.__init__(self, message)
        self.field_name, self.allowed, self.got = field_name, message, None


# ---- reading JSON that a user writes once (a configuration file, a header) ------------

class JsonValueError(ValueError):
    """A JSON text that parses but says something twice or cannot be read as a number
    (the caller adds the file and line)."""


_LONG_INT = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:\s*\[?[\s\d,-]*?-?(\d{20,})')


def huge_int_message(text: str) -> str:
    """What to say of a JSON text holding an integer beyond Python's int-string limit
    (`json.loads` raises a bare ValueError): its length and, where it is a field's value
    (or in a field's list), the field."""
    for m in _LONG_INT.finditer(text):
        if len(m.group(2)) > sys.get_int_max_str_digits():
            return (f"field \"{m.group(1)}\": an integer of {len(m.group(2))} digits is out "
                    "of range (a signed 64-bit value is expected)")
    return (f"an integer of more than {sys.get_int_max_str_digits()} digits is out of range "
            "(a signed 64-bit value is expected)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JsonValueError(f"the key {json.dumps(key)} is given twice in one object "
                                 "(which one is meant?)")
        out[key] = value
    return out


def strict_loads(text: str) -> Any:
    """`json.loads` for what a user writes once and kvpocket reads as a whole (a
    configuration file, a header, a reproducer): a key given twice in one object raises
    `JsonValueError`, and so does an integer beyond Python's int-string limit (its field
    named); bad JSON raises `json.JSONDecodeError` as usual. Integers up to that limit
    are returned, for the field's own check to name the field and its range. (Event
    lines, read by the million, keep the plain parser: see `huge_int_message`.)"""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except JsonValueError:
        raise
    except json.JSONDecodeError:
        raise
    except ValueError:  # Python's int-string limit
        raise JsonValueError(huge_int_message(text)) from None


# ---- what a run would build: estimated, and refused, before anything is built -------------

BUILDS = ("model", "impl", "lockstep")  # what a command builds from a configuration
ITEM_BYTES = 4  # a slot element, a stamp, a page-table entry: float32 / uint32 / int32
# The lockstep checks every slot and every sequence's page table after every step, and a
# rule may run a step per sequence: about sequences x (slots + table cells) checks per
# example. 2**20 is a few seconds an example on one core (measured: 2 sequences with
# 2 x 2**17 slots, 0.5 s; 256 sequences of 16 blocks, 5.5 s).
LOCKSTEP_MAX_CHECKS = 1 << 20


class ConfigTooLarge(ConfigError):
    """A configuration whose structures would not fit the machine (or whose lockstep would
    not finish an example promptly): the message names the field that drives the size,
    the estimate and the limit."""

    def __init__(self, field_name: str, estimate: str, limit: str) -> None:
        ValueError.__init__(self, f"config field '{field_name}' is too large for this run: "
                            f"{estimate}, and the limit is {limit}")
        self.field_name, self.allowed, self.got = field_name, limit, estimate


def machine_memory() -> int:
    """This machine's physical memory in bytes (8 GiB when the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 8 << 30


def memory_limit() -> int:
    """What one run may build: half the machine's memory (the rest is Python, Hypothesis,
    the copies a step makes, and other work)."""
    return machine_memory() // 2


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def build_estimate(cfg: KVConfig, builds: str = "impl", slot_elems: int | None = None
                   ) -> dict[str, int]:
    """Bytes a run would allocate, by the field that drives each part. `model`: nothing
    of size (the model's slot and page stores are sparse); `impl`: the slot pools (slots x
    levels x pool groups x slot size) and the sequences' page tables; `lockstep`: those,
    plus the data oracle's expected stamps and its window masks ((t + 1)^2 x t)."""
    if builds == "model":
        return {}
    t = cfg.tokens_per_block
    elems = max(8, t) if slot_elems is None else slot_elems  # the implementation's default
    slots = sum(cfg.slots_per_level) * cfg.num_pool_groups
    table = cfg.num_sequences * cfg.num_life_cycles * cfg.max_blocks
    out = {"slots_per_level": slots * elems * ITEM_BYTES, "num_sequences": table * ITEM_BYTES}
    if builds == "lockstep":
        out["num_sequences"] += table * max(1, elems // t) * ITEM_BYTES
        out["tokens_per_block"] = 3 * (t + 1) ** 2 * t  # bool masks and their temporaries
    return out


def check_fits(cfg: KVConfig, builds: str = "impl", slot_elems: int | None = None) -> None:
    """Refuse (`ConfigTooLarge`) a configuration whose structures would exceed
    `memory_limit()`, or, for the lockstep, whose checks per example would exceed
    LOCKSTEP_MAX_CHECKS: before anything is built, never a MemoryError half-way or a run
    that prints nothing for minutes."""
    parts = build_estimate(cfg, builds, slot_elems)
    total, limit = sum(parts.values()), memory_limit()
    if total > limit:
        field_name = max(parts, key=lambda k: parts[k])
        raise ConfigTooLarge(field_name, f"it would build about {_gib(total)} ("
                             + ", ".join(f"{k}: {_gib(v)}" for k, v in parts.items() if v)
                             + ")", f"{_gib(limit)} (half of this machine's "
                             f"{_gib(machine_memory())})")
    if builds == "lockstep":
        slots = sum(cfg.slots_per_level) * cfg.num_pool_groups
        table = cfg.num_sequences * cfg.num_life_cycles * cfg.max_blocks
        checks = cfg.num_sequences * (slots + table)
        if checks > LOCKSTEP_MAX_CHECKS:
            field_name = "slots_per_level" if slots >= table else "num_sequences"
            raise ConfigTooLarge(
                field_name, f"the lockstep would make about {checks:,} checks per example "
                "(sequences x (slots + sequences x life cycles x blocks))",
                f"{LOCKSTEP_MAX_CHECKS:,} (a few seconds an example; the small presets "
                "reach every hazard, docs/small-scope.md)")


# ---- window arithmetic (upstream `AttnLifeCycle.get_stale_range`) -------------------------


def num_blocks_for(capacity: int, tokens_per_block: int) -> int:
    return -(-capacity // tokens_per_block)


def stale_range(lc: LifeCycle, history: int, tokens_per_block: int) -> tuple[int, int]:
    """Half-open range of out-of-window blocks for history length `history`.

    Block b is stale iff (b+1)*t <= h+1-w: attention always runs on the token
    at position h, so the live window is [h+1-w, h]. Sink blocks never leave.
    """
    t = tokens_per_block
    sink_blocks = -(-lc.sink_tokens // t)
    start = min(-(-history // t), sink_blocks)
    if lc.window is None:
        return start, start
    end = max(start, (history + 1 - lc.window) // t)
    return start, end
