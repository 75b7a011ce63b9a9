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


# ---- sizes: every integer bounded, what a run builds estimated before it is built -------


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"life_cycles": (LifeCycle("a", window=10**30),)}, "life_cycles[0].window"),
    ({"life_cycles": (LifeCycle("a", window=2**63),)}, "life_cycles[0].window"),
    ({"life_cycles": (LifeCycle("a", window=4, sink_tokens=10**20),)},
     "life_cycles[0].sink_tokens"),
    ({"life_cycles": (LifeCycle("a", pool_group=2**64),)}, "life_cycles[0].pool_group"),
    ({"max_pages": 2**64}, "max_pages"),
])
def test_every_integer_field_has_an_upper_bound(kwargs: dict[str, object], field: str
                                                ) -> None:
    with pytest.raises(ConfigError) as info:
        KVConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.field_name == field and "an integer in [" in str(info.value)


def test_what_a_run_builds_is_refused_before_it_is_built(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpocket.model import config

    monkeypatch.setattr(config, "machine_memory", lambda: 16 << 30)
    big_t = KVConfig(tokens_per_block=4096, life_cycles=(swa_life_cycle(3),))
    config.check_fits(big_t, "impl")  # pools of 8 slots: small
    with pytest.raises(config.ConfigTooLarge) as info:
        config.check_fits(big_t, "lockstep")  # the oracle's window masks: (t+1)^2 x t
    assert info.value.field_name == "tokens_per_block"
    assert "192.1 GiB" in str(info.value) and "the limit is 8.0 GiB" in str(info.value)
    many = KVConfig(num_sequences=1 << 20)
    with pytest.raises(config.ConfigTooLarge, match="checks per example") as info:
        config.check_fits(many, "lockstep")
    assert info.value.field_name == "num_sequences"
    config.check_fits(many, "model")  # the model's stores are sparse
    huge_pools = KVConfig(slots_per_level=(1 << 24,) * 3)
    with pytest.raises(config.ConfigTooLarge, match="slots_per_level"):
        config.check_fits(huge_pools, "impl", slot_elems=1 << 10)
    config.check_fits(KVConfig(), "lockstep")


def test_a_configuration_file_states_every_field() -> None:
    from kvpocket.verify.presets import preset

    data = preset("tiny").to_json()
    assert KVConfig.from_json(data, complete=True) == preset("tiny")
    del data["pocket"]["enabled"], data["order"], data["life_cycles"][0]["priority"]
    with pytest.raises(ConfigError) as info:
        KVConfig.from_json(data, complete=True)
    text = str(info.value)
    assert "missing: order (any or lru); life_cycles[0].priority (an integer in [0, 100]); " \
           "pocket.enabled (true or false)" in text
    assert KVConfig.from_json(data).pocket.enabled is False  # a header may leave it out
