"""Named configurations. Small ones make eviction, migration and pocket reuse
happen within a few steps; `kvpocket fuzz --list-configs` lists them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvpocket.model.config import (
    ConfigError,
    EvictParked,
    KVConfig,
    LifeCycle,
    PocketConfig,
    PocketPolicy,
    full_life_cycle,
    strict_loads,
    swa_life_cycle,
)


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    config: KVConfig


def _cfg(slots: tuple[int, ...], seqs: int = 2, lcs: tuple[LifeCycle, ...] | None = None,
         t: int = 2, blocks: int = 16, evict_parked: EvictParked = EvictParked.DROP) -> KVConfig:
    return KVConfig(
        tokens_per_block=t,
        life_cycles=lcs or (swa_life_cycle(window=3), full_life_cycle()),
        slots_per_level=slots, num_sequences=seqs, max_blocks=blocks,
        pocket=PocketConfig(enabled=True, evict_parked=evict_parked),
    )


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("tiny", "GPU + host, one SWA life cycle (window 3, 2 tokens/block), 2 sequences, "
           "4 + 4 slots: the parked page is evicted (dropped) within a few steps",
           _cfg((4, 4), lcs=(swa_life_cycle(window=3),))),
    Preset("tiny-migrate", "tiny with evict_parked=migrate: the evicted parked page is "
           "copied to host (the pull request as written) instead of dropped",
           _cfg((4, 4), lcs=(swa_life_cycle(window=3),), evict_parked=EvictParked.MIGRATE)),
    Preset("gpu-only", "GPU only, SWA + full attention, 2 sequences, 8 slots: HELD pages "
           "are never evictable", _cfg((8,))),
    Preset("two-level", "GPU + host, SWA + full attention sharing a pool group (two priority "
           "buckets), 2 sequences, 6 + 6 slots", _cfg((6, 6))),
    Preset("three-level", "GPU + host + disk, SWA + full attention, 3 sequences, 6 + 4 + 4 "
           "slots: the cascade runs two levels deep", _cfg((6, 4, 4), seqs=3)),
    Preset("sinks", "GPU + host, SWA with 2 sink tokens (window 4) + full attention, "
           "2 sequences, 10 + 6 slots (room for a block to leave the window past the sink)",
           _cfg((10, 6), lcs=(swa_life_cycle(window=4, sink_tokens=2), full_life_cycle()))),
    Preset("offset", "GPU + host, SWA window 6 with 4 tokens/block ((w-1) mod t != 0: parked "
           "pages wait several steps), 2 sequences, 5 + 5 slots",
           _cfg((5, 5), lcs=(swa_life_cycle(window=6),), t=4)),
    Preset("wide-pocket", "GPU + host, one SWA life cycle, 2 sequences, 10 + 4 slots, 12 blocks: "
           "room for three stale blocks at once, so a full pocket meets another stale page",
           _cfg((10, 4), lcs=(swa_life_cycle(window=3),), blocks=12)),
    Preset("split-pools", "GPU + host, SWA and full attention in separate pool groups, "
           "2 sequences, 4 + 4 slots per group", _cfg(
               (4, 4), lcs=(swa_life_cycle(window=3), LifeCycle("full", pool_group=1)))),
)}

DEFAULT_PRESET = "two-level"


def preset(name: str) -> KVConfig:
    try:
        return PRESETS[name].config
    except KeyError:
        raise ConfigError("config", "one of " + ", ".join(PRESETS), name) from None


class ConfigFileError(ValueError):
    """A configuration file that cannot be read or holds no valid configuration; the
    message names the file and the field (a usage error: exit status 2)."""


def is_config_file(name: str) -> bool:
    """`--config` names a JSON file rather than a preset."""
    return name not in PRESETS and (name.endswith(".json") or "/" in name or Path(name).exists())


def load_config_file(path: str | Path) -> KVConfig:
    """A configuration from a JSON file in `KVConfig.to_json`'s form (what a failure
    trace's header holds under "config"; a trace's header line alone works too). Every
    field must be given (`KVConfig.from_json(complete=True)`): a file states what it
    means; no field of the thing under test takes a default silently."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ConfigFileError(f"{p}: is a folder, not a JSON configuration file") from None
    except OSError as exc:
        raise ConfigFileError(f"{p}: cannot read the configuration file ({exc.strerror})"
                              ) from None
    except UnicodeDecodeError:
        raise ConfigFileError(f"{p}: the configuration file is not UTF-8 text") from None
    try:
        data = strict_loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigFileError(f"{p}:{exc.lineno}: invalid JSON: {exc.msg} (column "
                              f"{exc.colno})") from None
    except RecursionError:
        raise ConfigFileError(f"{p}: invalid JSON: nested too deeply") from None
    except ValueError as exc:  # a key given twice, an integer beyond 64 bits
        raise ConfigFileError(f"{p}: {exc}") from None
    if isinstance(data, dict) and "kvpocket_trace" in data and "config" in data:
        data = data["config"]  # a trace or event-log header line
    try:
        return KVConfig.from_json(data, complete=True)
    except ConfigError as exc:
        raise ConfigFileError(f"{p}: {exc}") from None
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. a number where a list goes
        raise ConfigFileError(f"{p}: not a valid configuration ({exc})") from None


def config_named(name: str) -> KVConfig:
    """`--config`'s value: a preset's name, or a JSON configuration file."""
    if is_config_file(name):
        return load_config_file(name)
    if name not in PRESETS:
        raise ConfigFileError(f"{name!r} is no preset and no file; expected a preset ("
                              f"{', '.join(PRESETS)}) or a JSON configuration file")
    return preset(name)


def decode_config(
    policy: PocketPolicy | str = PocketPolicy.REVALIDATE, enabled: bool = True,
    slots: tuple[int, ...] = (4, 4), window: int = 3, t: int = 2, seqs: int = 2,
    blocks: int = 10, evict_parked: EvictParked | str = EvictParked.DROP,
) -> KVConfig:
    """One SWA life cycle and tiny pools, for decode scenarios: every mechanism (parking,
    popping, eviction while parked, OutOfPages) shows within a few steps."""
    return KVConfig(
        tokens_per_block=t, life_cycles=(swa_life_cycle(window=window),),
        slots_per_level=slots, num_sequences=seqs, max_blocks=blocks,
        pocket=PocketConfig(enabled=enabled, policy=PocketPolicy.parse(policy),
                            evict_parked=EvictParked.parse(evict_parked)),
    )
