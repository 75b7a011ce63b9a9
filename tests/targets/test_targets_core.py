"""The engine-neutral parts of the target campaign: workloads, the stamp oracle, reproducer
files, and the CLI without the engine. These run in every interpreter."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings

from kvpocket.verify.cli.commands import main
from kvpocket.verify.targets.base import TargetConfig
from kvpocket.verify.targets.campaign import ReproducerError, read_reproducer
from kvpocket.verify.targets.data_oracle import PrefixStamps, StampArray
from kvpocket.verify.targets.vllm import vllm_available
from kvpocket.verify.targets.workload import Op, Requests, WorkloadShape, ops_strategy

SHAPE = WorkloadShape(block_size=2, max_len=12)


@settings(max_examples=50)
@given(ops_strategy(SHAPE, 20))
def test_ops_round_trip_through_json(ops: list[Op]) -> None:
    assert [Op.from_json(json.loads(json.dumps(op.to_json()))) for op in ops] == ops


def test_a_bad_op_names_the_kinds() -> None:
    with pytest.raises(ValueError, match="arrive, schedule"):
        Op.from_json(["fly", 1])


def test_shared_prefixes_give_equal_prefix_stamps_and_fresh_tokens_do_not() -> None:
    reqs = Requests(SHAPE)
    a, b, c = reqs.new(0, 4, 1), reqs.new(0, 4, 2), reqs.new(1, 4, 0)
    stamps = PrefixStamps()
    sa, sb, sc = (stamps.of(r.tokens, []) for r in (a, b, c))
    assert sa[:4] == sb[:4] and sa[4] != sb[4]
    assert not set(sa) & set(sc)


def test_decoding_appends_one_token_and_stops_at_the_longest_length() -> None:
    reqs = Requests(SHAPE)
    r = reqs.new(0, 3, 0)
    assert r.next_chunk(8, SHAPE.max_len) == 3  # the prefill
    r.computed = 3
    assert r.next_chunk(8, SHAPE.max_len) == 1 and len(r.tokens) == 4
    r.tokens.extend([0] * (SHAPE.max_len - len(r.tokens)))
    r.computed = len(r.tokens)
    assert r.next_chunk(8, SHAPE.max_len) == 0


def test_the_stamp_array_finds_a_read_through_the_wrong_block() -> None:
    arr = StampArray(num_blocks=4, block_size=2)
    ids = [5, 6, 7, 8]
    arr.write([1, 2], 0, 4, ids, group=0)
    assert arr.mismatches([1, 2], 0, 4, ids, 0) == []
    bad = arr.mismatches([1, 3], 0, 4, ids, 0)  # block 3 was never written
    assert [(pos, block) for pos, block, _, _ in bad] == [(2, 3), (3, 3)]
    assert arr.mismatches([1, 2], 0, 4, ids, 1)  # the other group's KV is not ours
    assert np.array_equal(arr.block_row(1), StampArray.stamp(np.array([5, 6]), 0))


def test_groups_with_their_own_block_sizes_share_one_stamp_row_per_block() -> None:
    arr = StampArray(num_blocks=4, block_size=4)  # the widest group's blocks
    ids = [5, 6, 7, 8, 9, 10]
    arr.write([1, 2], 0, 6, ids, group=0, block_size=4)  # tokens 4, 5 in block 2
    arr.write([3, 2], 0, 4, ids, group=1, block_size=2)  # block 2 holds tokens 2, 3 now
    assert arr.mismatches([3, 2], 0, 4, ids, 1, block_size=2) == []
    # Group 1 overwrote the first half of block 2, which group 0 reads as its tokens 4, 5.
    assert [pos for pos, *_ in arr.mismatches([1, 2], 0, 6, ids, 0, block_size=4)] == [4, 5]


def test_a_config_with_group_block_sizes_round_trips_and_bad_sizes_are_named() -> None:
    cfg = TargetConfig("m", block_size=2, num_blocks=8, groups=("full", "swa"),
                       sliding_window=4, max_model_len=12, group_block_sizes=(4, 2))
    assert TargetConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg
    assert [cfg.group_block_size(g) for g in (0, 1)] == [4, 2] and cfg.mixed_block_sizes
    plain = TargetConfig("p", 2, 8, ("full",), 0, 12)
    assert "group_block_sizes" not in plain.to_json() and plain.group_block_size(0) == 2
    for sizes in ((4,), (3, 2), (0, 2)):
        with pytest.raises(ValueError, match="group_block_sizes"):
            TargetConfig("m", 2, 8, ("full", "swa"), 4, 12, group_block_sizes=sizes)


def test_a_reproducer_with_a_wrong_field_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "r.json"
    bad.write_text(json.dumps({"kvpocket_target_reproducer": 1, "target": "vllm",
                               "config": {"name": "x"}, "ops": []}))
    with pytest.raises(ReproducerError, match="config"):
        read_reproducer(bad)
    config = {"name": "m", "block_size": 2, "num_blocks": 8, "groups": ["full", "swa"],
              "sliding_window": 4, "max_model_len": 12, "group_block_sizes": [3, 2]}
    bad.write_text(json.dumps({"kvpocket_target_reproducer": 1, "target": "vllm",
                               "config": config, "ops": []}))
    with pytest.raises(ReproducerError, match="group_block_sizes"):
        read_reproducer(bad)
    bad.write_text("[]")
    with pytest.raises(ReproducerError, match="kvpocket_target_reproducer"):
        read_reproducer(bad)


@pytest.mark.skipif(vllm_available(), reason="vLLM is installed here: the message for a "
                    "missing vLLM cannot show (scripts/vllm.sh's venv has it)")
def test_without_vllm_the_target_says_what_to_install(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    assert main(["fuzz", "--target", "vllm", "--examples", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'kvpocket[vllm]'" in err[0] and "scripts/vllm.sh" in err[0]


def test_a_targets_presets_are_listed_without_the_engine(
        capsys: pytest.CaptureFixture[str]) -> None:
    from kvpocket.verify.targets.vllm import PRESETS

    assert main(["fuzz", "--target", "vllm", "--list-configs"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(PRESETS)
    assert main(["fuzz", "--target", "nope", "--list-configs"]) == 2
    out, err = capsys.readouterr()
    assert not out and "argument --target" in err and "vllm" in err


class BlockStored:  # the KV events' shapes, by name, as a router decodes them
    def __init__(self, hashes: list[int], group: int = 0) -> None:
        self.block_hashes, self.group_idx = hashes, group


class BlockRemoved(BlockStored):
    pass


class AllBlocksCleared:
    pass


def test_a_router_s_view_counts_copies_and_forgets_on_clear() -> None:
    from kvpocket.verify.targets.base import CheckFailure
    from kvpocket.verify.targets.vllm_events import ConsumerView

    view = ConsumerView()
    view.apply([BlockStored([1, 2]), BlockStored([2]), BlockStored([2], group=1)])
    assert view.blocks == {(0, 1): 1, (0, 2): 2, (1, 2): 1}
    view.apply([BlockRemoved([2])])
    assert view.blocks[(0, 2)] == 1 and view.removed_now == 1 and (0, 2) in view.ever_removed
    view.apply([AllBlocksCleared()])
    assert not view.blocks
    with pytest.raises(CheckFailure, match="no BlockStored announced"):
        view.apply([BlockRemoved([7])])


def test_again_re_sends_an_earlier_prompt() -> None:
    reqs = Requests(SHAPE)
    assert reqs.again(0) is None
    first = reqs.new(0, 3, 2)
    reqs.remove(first)
    again = reqs.again(5)
    assert again is not None and again.tokens == first.tokens and again.rid != first.rid


class _AssertsAtTheEnd:
    """A stand-in engine whose own end-of-run bookkeeping asserts."""

    name = "stand-in"

    def __init__(self) -> None:
        from kvpocket.verify.targets.base import StepStats

        self.stats = StepStats()

    def step(self, op: Op) -> None:
        self.stats.hit(op.kind)

    def observe(self) -> dict[str, object]:
        return {}

    def finish(self) -> None:
        raise AssertionError("new_prefix_len=2, len(new_indices)=0")


def test_an_engine_assertion_while_finishing_is_a_found_engine_failure() -> None:
    from kvpocket.verify.targets.base import CheckFailure
    from kvpocket.verify.targets.campaign import run_ops

    class StandIn:
        name = "stand-in"
        default_examples = 10

        def version(self) -> str:
            return "0"

        def presets(self) -> dict[str, TargetConfig]:
            return {}

        def build(self, cfg: TargetConfig) -> _AssertsAtTheEnd:
            return _AssertsAtTheEnd()

        def rare_states(self, cfg: TargetConfig) -> tuple[str, ...]:
            return ()

    cfg = TargetConfig("t", block_size=2, num_blocks=4, groups=("full",), sliding_window=0,
                       max_model_len=8)
    with pytest.raises(CheckFailure, match=r"AssertionError.*at the end of the run") as exc:
        run_ops(StandIn(), cfg, [Op("arrive", (0, 1, 1, 0))])
    assert exc.value.check == "engine"


ENGINE_CASES = sorted((Path(__file__).parent / "engine_cases").glob("*.json"))


@pytest.mark.parametrize("path", ENGINE_CASES, ids=[p.stem for p in ENGINE_CASES])
def test_each_recorded_engine_bug_is_a_reproducer_of_a_preset_that_exists(path: Path) -> None:
    """The shrunk traces the history scripts replay (scripts/*_history.sh): each names
    its target, one of its presets as it stands, the release it failed on, the failure,
    and the vLLM or SGLang tracker entry in its file name (or `unidentified` and the
    release, for a finding not yet matched to one)."""
    from kvpocket.verify.targets.registry import load_target

    target, cfg, ops, data = read_reproducer(path)
    entry = path.stem.split("-")[1]
    assert path.stem.startswith(f"{target}-") and (entry.isdigit() or (
        entry == "unidentified" and path.stem.split("-")[2] == data["version"]))
    assert load_target(target).presets()[cfg.name] == cfg
    assert ops and data["check"] and data["version"]
    assert data["message"].startswith(f"{data['check']}:")


def test_a_router_s_view_without_group_ids_keys_by_hash_alone() -> None:
    """Releases whose KV events carry no group index: the view and the engine's blocks
    are compared per hash, every group's copies together."""
    from collections import Counter

    from kvpocket.verify.targets import vllm_events
    from kvpocket.verify.targets.base import CheckFailure

    class BlockStored:  # an event of such a release: no group_idx
        def __init__(self, hashes: list[int]) -> None:
            self.block_hashes = hashes

    view = vllm_events.ConsumerView()
    view.apply([BlockStored([7, 7, 9])])
    assert not view.grouped and view.blocks == Counter({(0, 7): 2, (0, 9): 1})

    class Pool:
        def __init__(self, keys: list[tuple[int, int]]) -> None:
            self.keys = keys

        def cached_entries(self) -> list[tuple[tuple[int, int], None]]:
            return [(k, None) for k in self.keys]

        def split_key(self, key: tuple[int, int]) -> tuple[int, int]:
            return key

    vllm_events.check_kv_events(view, Pool([(7, 0), (7, 1), (9, 1)]), object())
    with pytest.raises(CheckFailure, match="never announced"):
        vllm_events.check_kv_events(view, Pool([(7, 0), (7, 1), (9, 1), (8, 0)]), object())


def test_an_older_release_gets_only_the_inputs_it_can_carry() -> None:
    from kvpocket.verify.targets.vllm_inputs import carried_identity
    from kvpocket.verify.targets.workload import IDENTITIES, INPUTS, Identity

    rich = dataclasses.replace(IDENTITIES[6], inputs=dataclasses.replace(
        next(i for i in INPUTS if i.images), embeds=next(i for i in INPUTS if i.embeds).embeds))
    assert rich.salt and rich.adapter and rich.inputs.images and rich.inputs.embeds
    assert carried_identity(rich, True, True, True) == rich
    bare = carried_identity(rich, False, False, False)
    assert bare == Identity(None, rich.adapter, dataclasses.replace(
        rich.inputs, images=(), embeds=None))
    assert carried_identity(rich, True, False, True).inputs.images == rich.inputs.images


def test_a_known_bug_is_present_before_the_release_that_fixed_it() -> None:
    from kvpocket.verify.targets.base import release
    from kvpocket.verify.targets.vllm import BUG_SALT_LORA_NAME, KNOWN_BUGS

    assert release("0.10.1.1+cpu") == (0, 10, 1, 1) < release("0.10.2") < release("0.31.0rc1")
    collision = KNOWN_BUGS[BUG_SALT_LORA_NAME]
    assert collision.present_in("0.30.0") and collision.present_in("0.9.2")
    assert not collision.present_in("0.31.0") and not collision.present_in("0.32.0+cpu")


class _FailsUnlessAvoided:
    """An instance of the stand-in below: a `finish` op fails unless bug "b" is avoided."""

    def __init__(self, avoided: set[str]) -> None:
        from kvpocket.verify.targets.base import StepStats

        self.avoided = avoided
        self.stats = StepStats()

    def step(self, op: Op) -> None:
        from kvpocket.verify.targets.base import CheckFailure

        if op.kind == "finish" and "b" not in self.avoided:
            raise CheckFailure("data", "reads a stale stamp")

    def observe(self) -> dict[str, Any]:
        return {}

    def finish(self) -> None:
        pass


class _KnownBugs:
    """A stand-in engine with two known bugs: a run of `finish` ops fails unless bug "b"
    is steered clear of, whatever is done about "a"."""

    name = "stand-in"
    default_examples = 10

    def __init__(self, only: tuple[str, ...] | None = None, avoiding: bool = False) -> None:
        self.only, self.avoiding = only, avoiding
        self.bugs = {"a": "bug a", "b": "bug b"}

    def version(self) -> str:
        return "1"

    def presets(self) -> dict[str, TargetConfig]:
        return {}

    def rare_states(self, cfg: TargetConfig) -> tuple[str, ...]:
        return ()

    def known_bugs(self) -> dict[str, str]:
        return {n: w for n, w in self.bugs.items() if self.only is None or n in self.only}

    def avoided(self) -> tuple[str, ...]:
        return tuple(self.known_bugs()) if self.avoiding else ()

    def without_known_bugs(self, only: tuple[str, ...] | None = None) -> _KnownBugs | None:
        from kvpocket.verify.targets.base import widened_avoidance

        names = widened_avoidance(self.bugs, self.avoided(), only)
        return None if names is None else _KnownBugs(names, avoiding=True)

    def build(self, cfg: TargetConfig) -> _FailsUnlessAvoided:
        return _FailsUnlessAvoided(set(self.known_bugs()) if self.avoiding else set())


def test_of_two_known_bugs_the_one_whose_avoidance_alone_passes_is_named() -> None:
    from kvpocket.verify.targets.campaign import known_bug

    cfg = TargetConfig("t", block_size=2, num_blocks=4, groups=("full",), sliding_window=0,
                       max_model_len=8)
    assert known_bug(_KnownBugs(), cfg, [Op("finish", (0,))]) == "b: bug b"
    # steering clear of "a" alone, the failure is still the known "b", named as such
    assert known_bug(_KnownBugs(("a",), avoiding=True), cfg, [Op("finish", (0,))]) == \
        "b: bug b"
    # a failure no known bug explains is a new finding
    assert known_bug(_KnownBugs(avoiding=True), cfg, [Op("finish", (0,))]) is None


def test_avoidance_widens_by_the_bugs_present_and_not_yet_avoided() -> None:
    from kvpocket.verify.targets.base import widened_avoidance

    assert widened_avoidance(("a", "b"), (), None) == ("a", "b")
    assert widened_avoidance(("a", "b"), ("a",), None) == ("a", "b")
    assert widened_avoidance(("a", "b"), ("a",), ("b",)) == ("a", "b")
    assert widened_avoidance(("a", "b"), ("a", "b"), None) is None  # nothing to add
    assert widened_avoidance(("a",), (), ("c",)) is None  # not a bug of this release


def test_avoid_known_takes_all_or_the_names_the_release_lists() -> None:
    from kvpocket.verify.targets.cli import _steered_clear

    class Usage(Exception):
        pass

    every: Any = _steered_clear(_KnownBugs(), "all", "stand-in 1", Usage)
    assert isinstance(every, _KnownBugs) and every.avoiding and set(every.known_bugs()) == {"a", "b"}
    one: Any = _steered_clear(_KnownBugs(), "b", "stand-in 1", Usage)
    assert isinstance(one, _KnownBugs) and one.known_bugs() == {"b": "bug b"}
    with pytest.raises(Usage, match=r"--avoid-known: expected 'all' or names of known bugs "
                       r"of stand-in 1 \(a, b\), got 'c'"):
        _steered_clear(_KnownBugs(), "c", "stand-in 1", Usage)


def test_a_clean_report_names_why_the_event_log_was_not_checked(
        capsys: pytest.CaptureFixture[str]) -> None:
    from kvpocket.verify.targets.campaign import TargetReport
    from kvpocket.verify.targets.cli import print_report

    report = TargetReport("vllm", "0.32.0", "hybrid-async", 0)
    report.coverage = {"decode": 3, "trace_off: steps in flight (asynchronous scheduling)": 2,
                       "trace_off: KV connector loads": 1}
    print_report(report)
    line = capsys.readouterr().out.splitlines()[-1]
    assert "event log not checked in examples with KV connector loads; steps in flight" in line
