"""The model-free data oracle: a stamp array standing in for the KV cache's contents.

Every token's KV depends on the token and everything before it, so its stamp is an
interned id of its whole prefix (two requests sharing a prefix write the same stamp, as
the real cache would hold the same values). Writing a scheduled token stores its stamp
(and the group that wrote it) at [block, offset] through the engine's block table;
attention reads must find their own stamp back. A wrong block id, a block freed early and
rewritten, a cache hit on the wrong content or a read through the null block all read
back a different stamp, without any model of how the manager should behave.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

NEVER_WRITTEN = 0
GROUP_BITS = 4  # a stamp holds (prefix id << GROUP_BITS) | group
ROOT_TOKEN = -(10**12)  # below every workload token: the tokens standing for a root
KEYED_TOKEN = -(2 * 10**12)  # below every root: the tokens standing for a position's key


@dataclass
class PrefixStamps:
    """Interned ids of token prefixes: `extend(parent, token)` is the id of the parent
    prefix followed by `token`; 0 is the empty prefix."""

    ids: dict[tuple[int, int], int] = field(default_factory=dict)
    roots: dict[object, int] = field(default_factory=dict)
    keys: dict[object, int] = field(default_factory=dict)

    def rooted(self, key: object) -> int:
        """The id standing for the empty prefix under `key` (0 for None): requests under
        different keys never share a stamp."""
        if key is None:
            return 0
        got = self.roots.get(key)
        if got is None:
            got = self.roots[key] = self.extend(0, ROOT_TOKEN - len(self.roots))
        return got

    def keyed(self, key: object) -> int:
        """A token stand-in for what a position holds besides a token id (an image's
        position, an embedding): equal keys, equal stand-ins; never a workload token."""
        got = self.keys.get(key)
        if got is None:
            got = self.keys[key] = KEYED_TOKEN - len(self.keys)
        return got

    def extend(self, parent: int, token: int) -> int:
        key = (parent, token)
        got = self.ids.get(key)
        if got is None:
            got = self.ids[key] = len(self.ids) + 1
        return got

    def of(self, tokens: list[int], known: list[int], root: int = 0) -> list[int]:
        """The stamps of every position of `tokens`; `known` (a previous result for a
        prefix of the same tokens) is extended in place and returned. `root` is the empty
        prefix's id under the inputs that change every token's KV besides the tokens (a
        LoRA adapter: `rooted`)."""
        parent = known[-1] if known else root
        for t in tokens[len(known):]:
            parent = self.extend(parent, t)
            known.append(parent)
        return known


class StampArray:
    """[num_blocks, block_size] stamps, written and read through block ids. A group whose
    blocks hold fewer tokens (`block_size=` on a call) uses the first cells of each row."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.cells: npt.NDArray[np.int64] = np.zeros((num_blocks, block_size), dtype=np.int64)

    @staticmethod
    def stamp(prefix_ids: npt.NDArray[np.int64], group: int) -> npt.NDArray[np.int64]:
        return (prefix_ids << GROUP_BITS) | group

    def locate(self, table: list[int], lo: int, hi: int, block_size: int | None = None
               ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        bs = block_size or self.block_size
        pos = np.arange(lo, hi, dtype=np.int64)
        blocks = np.asarray(table, dtype=np.int64)[pos // bs]
        return blocks, pos % bs

    def write(self, table: list[int], lo: int, hi: int, prefix_ids: list[int], group: int,
              block_size: int | None = None) -> None:
        blocks, offsets = self.locate(table, lo, hi, block_size)
        self.cells[blocks, offsets] = self.stamp(np.asarray(prefix_ids[lo:hi], dtype=np.int64), group)

    def mismatches(self, table: list[int], lo: int, hi: int, prefix_ids: list[int], group: int,
                   block_size: int | None = None) -> list[tuple[int, int, int, int]]:
        """(position, block, found stamp, expected stamp) for every position in [lo, hi)
        whose cell does not hold the expected stamp."""
        if hi <= lo:
            return []
        blocks, offsets = self.locate(table, lo, hi, block_size)
        want = self.stamp(np.asarray(prefix_ids[lo:hi], dtype=np.int64), group)
        got = self.cells[blocks, offsets]
        bad = np.nonzero(got != want)[0]
        return [(lo + int(i), int(blocks[i]), int(got[i]), int(want[i])) for i in bad]

    def block_row(self, block: int) -> npt.NDArray[np.int64]:
        row: npt.NDArray[np.int64] = self.cells[block]
        return row
