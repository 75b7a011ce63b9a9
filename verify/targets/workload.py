"""Engine-neutral serving workloads: what a scheduler asks of a KV cache manager.

A workload is a list of `Op`s that any list is a valid one of (request indices are taken
modulo the live requests, lengths are clipped), so Hypothesis can shrink it freely and a
shrunk list replays exactly. Token content is a pure function of the ops: prompts take a
prefix of one of a few shared token sequences plus fresh tokens, and decoding appends a
token computed from the two before it (greedy decoding: the same context decodes the same
token), so prefix-cache hits happen on prompts and on decoded text alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

OP_KINDS = ("arrive", "schedule", "preempt", "finish", "reset", "again", "load", "fill")
NUM_SHARED_PREFIXES = 3


# A vision model's image placeholder token: an image's positions in the prompt hold it, and
# a prompt may hold it as text too (token ids sent as they are), with no image behind it.
PLACEHOLDER_TOKEN = 40_000


@dataclass(frozen=True)
class Image:
    """An image of the prompt: `length` placeholder tokens from position `offset`, its
    content named by `image` (the engine's hash of it)."""

    image: str
    offset: int
    length: int


@dataclass(frozen=True)
class Embeds:
    """Prompt embeddings given instead of token ids, looked up in embedding table `table`
    (1 or more; the embedding of a position is a function of the table and the token the
    workload put there): for the whole prompt (`span` None, no token ids at all) or for the
    positions [start, end) of `span`, token ids elsewhere (a mixed prompt)."""

    table: int
    span: tuple[int, int] | None = None


@dataclass(frozen=True)
class Inputs:
    """What a prompt carries besides token ids: images, placeholder tokens sent as text,
    prompt embeddings. Positions are the prompt's; `fit` drops what a prompt is too short
    for (an image that does not fit whole, placeholders past its end) and clips a span."""

    images: tuple[Image, ...] = ()
    placeholders: tuple[int, ...] = ()
    embeds: Embeds | None = None

    def fit(self, n: int) -> Inputs:
        embeds = self.embeds
        if embeds is not None and embeds.span is not None:
            lo, hi = embeds.span[0], min(embeds.span[1], n)
            embeds = Embeds(embeds.table, (lo, hi)) if lo < hi else None
        return Inputs(tuple(i for i in self.images if i.offset + i.length <= n),
                      tuple(p for p in self.placeholders if p < n), embeds)

    def placeholder_positions(self) -> list[int]:
        return sorted({*self.placeholders,
                       *(p for i in self.images for p in range(i.offset, i.offset + i.length))})

    def embedded(self, n: int) -> range:
        """The embedded positions of a prompt of `n` tokens."""
        if self.embeds is None:
            return range(0)
        return range(n) if self.embeds.span is None else range(*self.embeds.span)


@dataclass(frozen=True)
class Identity:
    """What besides its tokens makes a request's KV, or its right to a cached block,
    differ: a LoRA adapter (`name`, a unique id, and the weights it loads, `path`), which
    changes the KV; a cache salt, the tenant boundary, which does not change the KV but must
    keep tenants' blocks apart; the prompt's images and embeddings (`Inputs`), which change
    the KV of their positions and of every position after them."""

    salt: str | None = None
    adapter: tuple[str, int, str] | None = None  # (name, id, path)
    inputs: Inputs = field(default_factory=Inputs)


# What two requests of the same token ids can differ in, as far as a prefix of them goes
# (`collision_kinds`): each a way for a block hash to leave an input out.
OTHER_TENANT = "another tenant"
OTHER_ADAPTER = "another adapter"
OTHER_IMAGES = "other images"
IMAGE_ELSEWHERE = "the same images shifted"
OTHER_EMBEDS = "other embeddings"
COLLISION_KINDS = (OTHER_TENANT, OTHER_ADAPTER, OTHER_IMAGES, IMAGE_ELSEWHERE, OTHER_EMBEDS)


def collision_kinds(mine: Identity, theirs: Identity, n: int) -> set[str]:
    """How the first `n` tokens of two requests of the same token ids differ besides them:
    the tenant, the adapter's weights, the images there (other images or another order,
    or the same images in the same order at other positions), the embeddings there (their
    tables or positions)."""
    out = set()
    if mine.salt != theirs.salt:
        out.add(OTHER_TENANT)
    if (mine.adapter and mine.adapter[2]) != (theirs.adapter and theirs.adapter[2]):
        out.add(OTHER_ADAPTER)
    a = sorted((i.offset, i.image) for i in mine.inputs.images if i.offset < n)
    b = sorted((i.offset, i.image) for i in theirs.inputs.images if i.offset < n)
    if a != b:  # the same images in the same order, shifted: only their offsets tell
        in_order = [x for _, x in a] == [x for _, x in b]
        out.add(IMAGE_ELSEWHERE if in_order else OTHER_IMAGES)
    embedded = [(p, e.table) for e in (mine.inputs.embeds,) if e is not None
                for p in mine.inputs.embedded(n) if p < n]
    theirs_embedded = [(p, e.table) for e in (theirs.inputs.embeds,) if e is not None
                       for p in theirs.inputs.embedded(n) if p < n]
    if embedded != theirs_embedded:
        out.add(OTHER_EMBEDS)
    return out


# Salts and adapter names drawn from one small set of strings, so that collisions are
# tried: two adapters share the name "a" (different weights), a salt is named "a" too.
IDENTITIES = (Identity(), Identity(salt="a"), Identity(salt="b"),
              Identity(adapter=("a", 1, "/adapters/a")),
              Identity(adapter=("a", 2, "/adapters/a-v2")),
              Identity(adapter=("b", 3, "/adapters/b")),
              Identity(salt="a", adapter=("a", 1, "/adapters/a")))
# Each identity's partner, what `again` with bit 1 of `other` set re-sends under: the
# same tokens under another tenant (unsalted to salted, one salt to another), under the
# adapter named like the salt, under the other adapter of the same name, without the
# adapter (the base model's KV).
IDENTITY_PARTNERS = (1, 3, 1, 4, 3, 0, 1)

# The inputs an arrival may carry (the `arrive` op's fifth argument), all from position 2 on
# (a prompt's first block stays shareable with plain prompts of its tokens). Pairs that
# try collisions: 1 and 2 hold the same placeholder tokens with different images (one
# image spanning a block boundary), as do 3 and 4 (two images in one block, one ending at
# 7, so that a decode step completes its last block of an odd prompt); 5 and 6 hold the
# same tokens (placeholders at 2 to 4) and the same image at offsets 2 and 3, in one block,
# the other placeholder sent as text; 7 and 8 are pure embeddings of two tables, 9 and 10 the
# same tokens with positions 2 to 4 embedded from either table.
IMG_X, IMG_Y, IMG_Z = "img-x", "img-y", "img-z"
INPUTS = (Inputs(),
          Inputs(images=(Image(IMG_X, 2, 3),)),
          Inputs(images=(Image(IMG_Y, 2, 3),)),
          Inputs(images=(Image(IMG_X, 2, 1), Image(IMG_Y, 3, 1), Image(IMG_Z, 4, 3))),
          Inputs(images=(Image(IMG_Y, 2, 1), Image(IMG_X, 3, 1), Image(IMG_Z, 4, 3))),
          Inputs(images=(Image(IMG_X, 2, 2),), placeholders=(4,)),
          Inputs(images=(Image(IMG_X, 3, 2),), placeholders=(2,)),
          Inputs(embeds=Embeds(1)),
          Inputs(embeds=Embeds(2)),
          Inputs(embeds=Embeds(1, (2, 5))),
          Inputs(embeds=Embeds(2, (2, 5))))
# Each input's partner of the same tokens: what `again` with `other` odd re-sends under.
PARTNERS = (0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9)


@dataclass(frozen=True)
class Op:
    """One serving operation. `arrive(prefix, shared, fresh, identity, inputs)`: a request
    whose prompt is the first `shared` tokens of shared sequence `prefix` and `fresh` new
    tokens, under `IDENTITIES[identity]`, carrying `INPUTS[inputs]` (each modulo their
    number; none when left out);
    `schedule(req, tokens, repeat)`: `repeat` scheduler steps of request `req`, each a
    prefill chunk of up to `tokens` or one decode token; `preempt(req)`: freed and back to waiting, recomputed
    from scratch; `finish(req)`: freed for good; `reset(under_load)`: reset the prefix
    cache, with `under_load` odd after preempting every running request first (a reset
    under load, as weight updates do it); `again(index, tokens)`: a new request re-sending
    the prompt of an earlier arrival (the `index`-th, modulo their number), whose blocks
    may have been evicted since, admitted at once with a first chunk of up to `tokens`
    (`again(index, tokens, other)`, bit 0 of `other` set: under the partner of its inputs,
    the same token ids with other images or embeddings; bit 1: under the partner of its
    salt and adapter; both to try collisions);
    `load(req, tokens, delay)`: admit the `req`-th waiting request (modulo their number,
    in the engine's waiting order)
    with up to `tokens` tokens
    past its prefix-cache hit computed elsewhere (a KV connector's load): at once when
    `delay` is 0, else asynchronously, the load completing `delay` scheduler steps later
    (meanwhile the request holds its blocks and may be finished);
    `fill(over)`: a new request of fresh tokens, admitted at once and prefilled whole,
    sized to the free blocks that hold nothing cached (`filler_length`): after it the free
    blocks are the cached ones, as in a warm server's pool, so the next allocation evicts
    cached blocks in the engine's eviction order."""

    kind: str
    args: tuple[int, ...] = ()

    def to_json(self) -> list[Any]:
        return [self.kind, *self.args]

    @staticmethod
    def from_json(v: Any) -> Op:
        if not isinstance(v, list) or not v or v[0] not in OP_KINDS \
                or not all(isinstance(a, int) and a >= 0 for a in v[1:]):
            raise ValueError(f"an op is [kind, non-negative ints...] with kind in "
                             f"{', '.join(OP_KINDS)}; got {v!r}")
        return Op(str(v[0]), tuple(int(a) for a in v[1:]))

    def __str__(self) -> str:
        return f"{self.kind}({', '.join(map(str, self.args))})"


def filler_length(room: int, over: int, group_block_sizes: list[int], max_len: int) -> int:
    """The prompt length of `fill(over)` for `room` free blocks that hold nothing cached,
    a prompt of n tokens taking ceil(n / size) blocks in each group: `over` 0, the longest
    that fits in them (a block or so may stay free when the groups' blocks do not divide
    them); `over` 1 or more, the shortest that takes them all and `over - 1` blocks
    besides, which evicts the oldest cached ones. 0: no such prompt (then no request)."""
    def blocks(n: int) -> int:
        return sum(-(-n // z) for z in group_block_sizes)

    longest = max_len - 1
    if over == 0:
        return max((n for n in range(longest + 1) if blocks(n) <= room), default=0)
    return next((n for n in range(1, longest + 1) if blocks(n) >= room + over - 1), 0)


@dataclass(frozen=True)
class WorkloadShape:
    block_size: int
    max_len: int


def shared_token(prefix: int, i: int) -> int:
    return 1 + prefix * 1000 + i


def decoded_token(tokens: list[int]) -> int:
    """Greedy decoding's stand-in: the next token from the two before it (a small alphabet,
    so different requests decode into the same text and share blocks)."""
    a = tokens[-1] if tokens else 0
    b = tokens[-2] if len(tokens) > 1 else 0
    return 50_000 + (a * 7 + b * 3) % 5


def ops_strategy(shape: WorkloadShape, max_steps: int) -> st.SearchStrategy[list[Op]]:
    bs, max_len = shape.block_size, shape.max_len
    def op_of(kind: int, a: int, b: int, c: int) -> Op:
        # Scheduling dominates, as it does in a server; resets are rare. Shrinking moves
        # `kind` to 0, a scheduling step.
        if kind < 43:
            return Op("schedule", (a % 4, 1 + b % (3 * bs), 1 + c % 8))
        if kind < 46:
            return Op("fill", (a % 3,))
        if kind < 60:
            # Inputs: none for 6 of the 14 kinds of an arrival; images twice as often as
            # embeddings (their collisions need a pair of layouts on one prefix).
            inputs = 0 if kind < 52 else 1 + ((kind - 52) * 2 + (b // 11) % 2) % (len(INPUTS) - 1)
            return Op("arrive", (a % NUM_SHARED_PREFIXES, b % (max_len // 2 + 1), c % (3 * bs + 1),
                                 (a // NUM_SHARED_PREFIXES) % len(IDENTITIES), inputs))
        if kind < 66:
            return Op("again", (a, 1 + b % (3 * bs), c % 4))
        if kind < 78:
            return Op("load", (a % 4, 1 + b % max_len, c % 4))
        if kind < 88:
            return Op("finish", (a % 4,))
        if kind < 97:
            return Op("preempt", (a % 4,))
        return Op("reset", (a % 2,))

    small = st.integers(0, 63)
    op = st.builds(op_of, st.integers(0, 99), small, small, small)
    return st.lists(op, min_size=2, max_size=max_steps)


@dataclass
class Request:
    """The scheduler's view of one request: its tokens, how many are computed (their KV
    written), and whether it is running (holds blocks) or waiting."""

    rid: str
    tokens: list[int]
    prompt_len: int
    computed: int = 0
    running: bool = False
    identity: Identity = field(default_factory=Identity)
    loading: int = 0  # scheduler steps until its asynchronous load completes (0: none)
    finished: bool = False  # finished while its load was in flight (freed when it lands)

    def next_chunk(self, budget: int, max_len: int) -> int:
        """Tokens the next step schedules: a prefill chunk, else one decode token (which
        appends the decoded token first); 0 when the request is at `max_len`."""
        if self.computed < len(self.tokens):
            return min(budget, len(self.tokens) - self.computed)
        if len(self.tokens) >= max_len:
            return 0
        self.tokens.append(decoded_token(self.tokens))
        return 1


@dataclass
class Requests:
    """The live requests, oldest first; ops pick one by index modulo their number."""

    shape: WorkloadShape
    live: list[Request] = field(default_factory=list)
    arrived: int = 0
    fresh: int = 0
    prompts: list[tuple[list[int], Identity]] = field(default_factory=list)  # every arrival's
    inputs_of: list[int] = field(default_factory=list)  # the INPUTS index of each

    def new(self, prefix: int, shared: int, fresh: int, identity: int = 0, inputs: int = 0
            ) -> Request:
        shared = min(shared, self.shape.max_len - 1)
        fresh = min(fresh, self.shape.max_len - 1 - shared)
        tokens = [shared_token(prefix, i) for i in range(shared)]
        for _ in range(fresh):
            self.fresh += 1
            tokens.append(-self.fresh)  # never seen before, never shared
        if not tokens:
            self.fresh += 1
            tokens.append(-self.fresh)
        fitted = INPUTS[inputs % len(INPUTS)].fit(len(tokens))
        for p in fitted.placeholder_positions():
            tokens[p] = PLACEHOLDER_TOKEN
        ident = IDENTITIES[identity % len(IDENTITIES)]
        return self._add(tokens, Identity(ident.salt, ident.adapter, fitted),
                         inputs % len(INPUTS))

    def filler(self, tokens: int) -> Request:
        """A request of `tokens` fresh tokens (`fill`)."""
        return self.new(0, 0, tokens)

    def again(self, index: int, other: int = 0) -> Request | None:
        """A new request with the prompt of an earlier arrival (its token ids, salt and
        adapter), with bit 0 of `other` set under the partner of its inputs (`PARTNERS`:
        the same token ids, another image or embedding, an image at another offset), with
        bit 1 set under the partner of its salt and adapter (`IDENTITY_PARTNERS`); None
        before any."""
        if not self.prompts:
            return None
        k = index % len(self.prompts)
        tokens, identity = self.prompts[k]
        inputs = self.inputs_of[k]
        own = Identity(identity.salt, identity.adapter)
        if other & 2 and own in IDENTITIES:
            partner = IDENTITIES[IDENTITY_PARTNERS[IDENTITIES.index(own)]]
            identity = Identity(partner.salt, partner.adapter, identity.inputs)
        if other % 2 and inputs:
            inputs = PARTNERS[inputs]
            fitted = INPUTS[inputs].fit(len(tokens))
            tokens = list(tokens)
            for p in fitted.placeholder_positions():
                tokens[p] = PLACEHOLDER_TOKEN
            identity = Identity(identity.salt, identity.adapter, fitted)
        return self._add(list(tokens), identity, inputs)

    def _add(self, tokens: list[int], identity: Identity, inputs: int = 0) -> Request:
        self.prompts.append((list(tokens), identity))
        self.inputs_of.append(inputs)
        req = Request(f"r{self.arrived}", tokens, len(tokens), identity=identity)
        self.arrived += 1
        self.live.append(req)
        return req

    def pick(self, index: int) -> Request | None:
        return self.live[index % len(self.live)] if self.live else None

    def remove(self, req: Request) -> None:
        self.live.remove(req)

    def summary(self) -> Mapping[str, Any]:
        return {r.rid: {"tokens": len(r.tokens), "computed": r.computed, "running": r.running}
                for r in self.live}
