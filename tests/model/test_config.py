"""Every config value is validated with an error naming the field and the allowed range."""

from __future__ import annotations

import pytest

from kvpocket.model.config import (
    ConfigError,
    KVConfig,
    LifeCycle,
    PocketConfig,
    PocketPolicy,
    swa_life_cycle,
)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"tokens_per_block": 0}, "tokens_per_block"),
    ({"slots_per_level": ()}, "slots_per_level"),
    ({"slots_per_level": (4, 0)}, "slots_per_level[1]"),
    ({"num_sequences": 0}, "num_sequences"),
    ({"max_blocks": -1}, "max_blocks"),
    ({"pocket": PocketConfig(capacity=0)}, "pocket.capacity"),
    ({"life_cycles": (LifeCycle("a", window=0),)}, "life_cycles[0].window"),
    ({"life_cycles": (LifeCycle("a", sink_tokens=2),)}, "life_cycles[0].sink_tokens"),
    ({"life_cycles": (swa_life_cycle(3), swa_life_cycle(4))}, "life_cycles[1].name"),
    ({"life_cycles": (LifeCycle("a", pool_group=1),)}, "life_cycles.pool_group"),
    ({"life_cycles": (LifeCycle("a", priority=101),)}, "life_cycles[0].priority"),
])
def test_bad_values_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        KVConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.field_name == field
    assert field in str(info.value)


def test_policy_parse_names_allowed_values() -> None:
    with pytest.raises(ConfigError, match="revalidate, pin, unsafe"):
        PocketPolicy.parse("yolo")
    assert PocketPolicy.parse("pin") is PocketPolicy.PIN


def test_json_round_trip_and_unknown_field() -> None:
    cfg = KVConfig(slots_per_level=(3, 5, 2)).with_pocket(True, "pin", capacity=3)
    assert KVConfig.from_json(cfg.to_json()) == cfg
    data = cfg.to_json()
    data["bogus"] = 1
    with pytest.raises(ConfigError, match="bogus"):
        KVConfig.from_json(data)
