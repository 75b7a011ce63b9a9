"""Radix tree of committed blocks, keyed by the full token prefix.

A node is identified by (parent node, the block's own tokens), so a node's key
is the whole prefix up to and including its block without storing it. Each
node holds at most one committed page per life cycle (page ids). Nodes with
no page, no children and no live sequence referring to them are pruned
(upwards): a sequence that committed a block commits its next block under that
node, so the node must outlive its pages (cf. upstream nvbug 6625710, where a
pruned block was still a live request's parent). Simplification (documented in
the manager): committing a block whose prefix node already holds a live page
stops committing instead of rebasing onto the existing page.
"""

from __future__ import annotations

from collections.abc import Sequence

from .undo import Op

ROOT = 0


class Node:
    __slots__ = ("children", "nid", "pages", "parent", "refs", "tokens")

    def __init__(self, nid: int, parent: int, tokens: tuple[int, ...], num_lcs: int) -> None:
        self.nid = nid
        self.parent = parent
        self.tokens = tokens
        self.pages: list[int | None] = [None] * num_lcs
        self.children = 0
        self.refs = 0  # live sequences whose committed blocks include this node

    def has_page(self) -> bool:
        return any(p is not None for p in self.pages)


class RadixTree:
    def __init__(self, num_lcs: int, tokens_per_block: int) -> None:
        self.num_lcs = num_lcs
        self.tpb = tokens_per_block
        self.nodes: dict[int, Node] = {}
        self.index: dict[tuple[int, tuple[int, ...]], int] = {}
        self._next = 1

    @property
    def next_id(self) -> int:
        """The id the next node gets (every node's id is below it)."""
        return self._next

    def find(self, parent: int, tokens: tuple[int, ...]) -> int | None:
        return self.index.get((parent, tokens))

    def add(self, parent: int, tokens: tuple[int, ...], op: Op) -> int:
        nid = self._next
        op.set(self, "_next", nid + 1)
        self._link(Node(nid, parent, tokens, self.num_lcs))
        op.on_undo(self._unlink, nid)
        return nid

    def _link(self, node: Node) -> None:
        self.nodes[node.nid] = node
        self.index[(node.parent, node.tokens)] = node.nid
        if node.parent != ROOT:
            self.nodes[node.parent].children += 1

    def _unlink(self, nid: int) -> Node:
        node = self.nodes.pop(nid)
        del self.index[(node.parent, node.tokens)]
        if node.parent != ROOT:
            self.nodes[node.parent].children -= 1
        return node

    def set_page(self, nid: int, lc: int, pid: int | None, op: Op) -> None:
        op.setitem(self.nodes[nid].pages, lc, pid)

    def unset_page(self, nid: int, lc: int, op: Op) -> None:
        """Forget a dropped page; prune nodes left with no page, child or reference."""
        self.set_page(nid, lc, None, op)
        self._prune(nid, op)

    def acquire(self, nid: int, op: Op) -> None:
        """A sequence's committed blocks include this node."""
        op.set(self.nodes[nid], "refs", self.nodes[nid].refs + 1)

    def release(self, nid: int, op: Op) -> None:
        node = self.nodes[nid]
        op.set(node, "refs", node.refs - 1)
        self._prune(nid, op)

    def _prune(self, nid: int, op: Op) -> None:
        cur = nid
        while cur != ROOT:
            node = self.nodes[cur]
            if node.children or node.refs or node.has_page():
                break
            self._unlink(cur)
            op.on_undo(self._link, node)
            cur = node.parent

    def key(self, nid: int) -> list[int]:
        """The full token prefix of a node."""
        parts: list[tuple[int, ...]] = []
        cur = nid
        while cur != ROOT:
            node = self.nodes[cur]
            parts.append(node.tokens)
            cur = node.parent
        return [t for block in reversed(parts) for t in block]

    def match(self, tokens: Sequence[int]) -> list[int]:
        """Node ids of the longest run of full prompt blocks, from block 0, whose node
        has a live page for every life cycle."""
        out: list[int] = []
        parent = ROOT
        t = self.tpb
        for b in range(len(tokens) // t):
            nid = self.find(parent, tuple(tokens[b * t:(b + 1) * t]))
            if nid is None or any(p is None for p in self.nodes[nid].pages):
                break
            out.append(nid)
            parent = nid
        return out
