"""Images and prompt embeddings in the vLLM target (issue 37): how a workload's `Inputs`
become a vLLM `Request`'s `mm_features` and `prompt_embeds`, and what they do to the
data oracle's stamps.

A token's KV depends on everything before it, images and embeddings included, so the
oracle's stamp of a position is taken over keyed tokens: an image's placeholder position
stands for (the image, its index in the image), an embedded position for its embedding
(the table and the token it embeds), every other position for its token id. A prefix-cache
hit across different images, or across images at different positions, or across
different embeddings, then reads back a foreign stamp (check `data`, or `pool` when the
foreign block is cached under the request's own hash).

vLLM is reached only through the `api` object the target hands in (imported lazily there).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvpocket.verify.targets.base import StepStats, TargetUnavailable
from kvpocket.verify.targets.data_oracle import PrefixStamps
from kvpocket.verify.targets.workload import Identity, Inputs, Request

RARE_IMAGE_HIT = "prefix hit on a block holding an image"
RARE_EMBEDS_HIT = "prefix hit on prompt embeddings"
RARE_INPUT_STATES = (RARE_IMAGE_HIT, RARE_EMBEDS_HIT)

# Counted once per arrival whose images, embeddings or cache salt the release cannot
# carry (`carried_identity`, `Request`'s parameters): it goes in without them.
INPUTS_NOT_CARRIED = "inputs_not_carried_by_this_release"

# Counted (not rare states): the paths the hashing takes for these inputs.
IMAGE_BLOCK_BY_DECODE = "image_block_completed_by_decode"
HIDDEN_SIZE = 2  # an embedding row: (table, token), exact in float32 for workload tokens


def keyed_tokens(prefix: PrefixStamps, tokens: list[int], inputs: Inputs) -> list[int]:
    """The prompt's tokens with every image position and embedded position replaced by a
    stand-in for what the model reads there (`PrefixStamps.keyed`)."""
    out = list(tokens)
    for image in inputs.images:
        for k in range(image.length):
            out[image.offset + k] = prefix.keyed(("image", image.image, k))
    if inputs.embeds is not None:
        for p in inputs.embedded(len(tokens)):
            out[p] = prefix.keyed(("embedding", inputs.embeds.table, tokens[p]))
    return out


def embedding_rows(api: Any, tokens: list[int], inputs: Inputs) -> Any:
    """The prompt's embeddings as a `[len(tokens), HIDDEN_SIZE]` float32 tensor: the row
    of an embedded position is (table, token); a mixed prompt's token-id positions hold
    zeros (as vLLM's renderer builds the full-length tensor)."""
    if inputs.embeds is None:
        raise ValueError("embedding_rows: the inputs carry no prompt embeddings")
    if inputs.embeds.table < 1:
        raise ValueError(f"an embedding table is numbered from 1 (a zero row stands for a "
                         f"token-id position); got {inputs.embeds.table}")
    rows = api.torch.zeros((len(tokens), HIDDEN_SIZE), dtype=api.torch.float32)
    for p in inputs.embedded(len(tokens)):
        rows[p, 0] = float(inputs.embeds.table)
        rows[p, 1] = float(tokens[p])
    return rows


def carried_identity(ident: Identity, images: bool, embeds: bool, salt: bool) -> Identity:
    """The part of a request's identity a release's `Request` can carry: without images
    (before about 0.10.2) an image's placeholder tokens are plain text, without prompt
    embeddings the embedded positions are their token ids, without a cache salt (before
    about 0.9) the request is unsalted. The data oracle then keys the prompt by what was
    sent, so a release is never blamed for inputs it never got."""
    inputs = ident.inputs
    kept = dataclasses.replace(inputs, images=inputs.images if images else (),
                               embeds=inputs.embeds if embeds else None)
    return dataclasses.replace(ident, inputs=kept, salt=ident.salt if salt else None)


def request_kwargs(api: Any, req: Request) -> dict[str, Any]:
    """The keyword arguments of vLLM's `Request` that carry the request's images and
    embeddings (none for a prompt of token ids only)."""
    inputs = req.identity.inputs
    prompt = req.tokens[:req.prompt_len]
    out: dict[str, Any] = {}
    if inputs.images:
        mm = api.multimodal
        if mm is None or not hasattr(mm, "MultiModalFeatureSpec"):
            raise TargetUnavailable("this vLLM release has no MultiModalFeatureSpec: a "
                                    "request with images needs vLLM 0.10.2 or later")
        out["mm_features"] = [
            mm.MultiModalFeatureSpec(data=None, modality="image", identifier=i.image,
                                     mm_position=mm.PlaceholderRange(offset=i.offset,
                                                                     length=i.length),
                                     mm_hash=i.image)
            for i in sorted(inputs.images, key=lambda i: i.offset)]
    if inputs.embeds is not None:
        out["prompt_embeds"] = embedding_rows(api, prompt, inputs)
        if inputs.embeds.span is None:  # pure: no token ids at all
            out["prompt_token_ids"] = None
        else:
            embedded = set(inputs.embedded(len(prompt)))
            out["prompt_is_token_ids"] = [p not in embedded for p in range(len(prompt))]
    return out


def count_hit(stats: StepStats, req: Request, hit: int) -> None:
    """The rare states of a prefix hit of `hit` tokens: it covers an image position, or an
    embedded one."""
    inputs = req.identity.inputs
    if any(i.offset < hit for i in inputs.images):
        stats.hit(RARE_IMAGE_HIT)
    if any(p < hit for p in inputs.embedded(req.prompt_len)):
        stats.hit(RARE_EMBEDS_HIT)


def count_decode(stats: StepStats, req: Request, block_size: int) -> None:
    """A decode token that completes a block holding an image position (vLLM hashes that
    block as decode completes it, starting its image search mid-request)."""
    n = len(req.tokens)
    if n % block_size or n <= req.prompt_len:
        return
    lo = n - block_size
    if any(i.offset < n and lo < i.offset + i.length for i in req.identity.inputs.images):
        stats.hit(IMAGE_BLOCK_BY_DECODE)
