"""The abstraction function: model state and implementation snapshot, both mapped
to one canonical, comparable form.

Page ids differ between the two sides (the model reuses records; the
implementation numbers pages as it creates them), so pages are named by where
they sit: (level, pool group, slot). Sequences are named by the model's slot
index; the harness keeps the mapping to implementation ids.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from kvpocket.model.config import (
    NONE,
    CommitState,
    PageStatus,
    SeqStatus,
    num_blocks_for,
)
from kvpocket.model.machine import Model

Where = tuple[int, int, int]  # (level, pool group, slot)


@dataclass(frozen=True)
class Abstract:
    """The canonical state. Every field is plain data; equality is the conformance check."""

    pages: tuple[tuple[Any, ...], ...]  # sorted page records, see `_page_row`
    occupied: tuple[tuple[int, int, tuple[int, ...]], ...]  # (level, pg, sorted slots)
    queues: tuple[tuple[int, int, tuple[Where, ...]], ...]  # (level, pg, eviction order)
    pockets: tuple[tuple[int, int, tuple[Where, ...]], ...]  # (seq, lc, FIFO)
    seqs: tuple[tuple[Any, ...], ...]  # per model sequence slot

    def as_dict(self) -> dict[str, Any]:
        return {"pages": self.pages, "occupied": self.occupied, "queues": self.queues,
                "pockets": self.pockets, "sequences": self.seqs}


PAGE_COLUMNS = ("level", "pool_group", "slot", "lc", "committed", "status", "queued",
                "owner", "ordinal", "key", "pocket")
SEQ_COLUMNS = ("seq", "status", "capacity", "history", "committed_tokens", "commit_state",
               "index", "entries")


def _row_order(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A total order on page rows (whose optional columns may be None), one-to-one so
    equal multisets of rows sort to equal tuples on both sides."""
    return tuple((0,) if v is None else (1, v) for v in row)


def abstract_model(m: Model) -> Abstract:
    s, lay, cfg = m.state, m.layout, m.cfg
    where: dict[int, Where] = {}
    pages = []
    parked_by: dict[int, int] = {}  # page -> the sequence whose pocket holds it (first found)
    for q in range(lay.seqs):
        for c in range(lay.lcs):
            for k in range(lay.pocket_cap):
                parked_by.setdefault(s.pocket[lay.pocket_ix(m.ops, q, c, k)], q)
    for p in range(lay.pages):
        if not s.alive[p]:
            continue
        lc = s.lc[p]
        w = (s.level[p], cfg.pool_group_of(lc), s.slot[p])
        where[p] = w
        status = PageStatus.LOCKED if s.locks[p] else (
            PageStatus.HELD if s.holds[p] else PageStatus.DROPPABLE)
        pocket = parked_by.get(p)
        key = tuple(s.block_keys[s.key[p]]) if s.committed[p] else None
        owner = None if s.committed[p] else s.owner[p]
        pages.append((*w, lc, bool(s.committed[p]), status.name, bool(s.queued[p]), owner,
                      s.ordinal[p], key, pocket))
    occupied = []
    queues = []
    for level in range(cfg.num_levels):
        for pg in range(cfg.num_pool_groups):
            slots = lay.slot_range(level, pg)
            occ = tuple(i - slots.start for i in slots if s.slot_owner[i] != NONE)
            occupied.append((level, pg, occ))
            queued = [p for p in where if s.queued[p] and where[p][:2] == (level, pg)]
            order = sorted(queued, key=lambda p: (cfg.life_cycles[s.lc[p]].priority, s.stamp[p]))
            queues.append((level, pg, tuple(where[p] for p in order)))
    pockets = []
    for q in range(lay.seqs):
        for c in range(lay.lcs):
            ids = [s.pocket[lay.pocket_ix(m.ops, q, c, k)] for k in range(lay.pocket_cap)]
            entries = tuple(where.get(p, (-1, -1, -1)) for p in ids if p != NONE)
            if entries:
                pockets.append((q, c, entries))
    seqs = []
    for q in range(lay.seqs):
        seq_status = SeqStatus(s.seq_status[q])
        if seq_status == SeqStatus.FREE:
            continue
        nb = num_blocks_for(s.capacity[q], cfg.tokens_per_block)
        index: list[tuple[int, ...]] = []
        table: list[tuple[Any, ...]] = []
        for c in range(lay.lcs):
            row: list[int] = []
            ents: list[Any] = []
            for o in range(nb):
                e = lay.entry_ix(m.ops, q, c, o)
                row.append(s.index[e])
                page = s.entry[e]
                ents.append(None if page == NONE else
                            (where.get(page), "lock" if s.entry_locked[e] else "hold"))
            index.append(tuple(row))
            table.append(tuple(ents))
        seqs.append((q, seq_status.name, s.capacity[q], s.history[q], s.committed_tokens[q],
                     CommitState(s.commit_state[q]).name, tuple(index), tuple(table)))
    return Abstract(tuple(sorted(pages, key=_row_order)), tuple(occupied), tuple(queues),
                    tuple(pockets), tuple(seqs))


def abstract_impl(snap: dict[str, Any], seq_of: dict[int, int]) -> Abstract:
    """`seq_of` maps implementation sequence ids to model sequence slots."""
    where: dict[int, Where] = {}
    pages = []
    for p in snap["pages"]:
        w = (p["level"], p["pool_group"], p["slot"])
        where[p["id"]] = w
    for p in snap["pages"]:
        owner = None if p["committed"] or p["owner"] is None else seq_of.get(p["owner"], -1)
        pocket = None if p["pocket"] is None else seq_of.get(p["pocket"], -1)
        key = tuple(p["key"]) if p["committed"] and p["key"] is not None else None
        pages.append((*where[p["id"]], p["lc"], bool(p["committed"]), p["status"],
                      bool(p["queued"]), owner, p["ordinal"], key, pocket))
    occupied = [(a["level"], a["pool_group"], tuple(a["occupied"])) for a in snap["slots"]]
    queues = [(q["level"], q["pool_group"],  # a dead page still queued: named (-1, -1, -1)
               tuple(where.get(i, (-1, -1, -1)) for i in q["order"]))
              for q in snap["queues"]]
    pockets = sorted(
        (seq_of.get(p["seq"], -1), p["lc"], tuple(where.get(i, (-1, -1, -1)) for i in p["pages"]))
        for p in snap["pockets"] if p["pages"]
    )
    seqs = []
    for sq in snap["sequences"]:
        if sq["id"] not in seq_of:
            continue
        nb = sq["num_blocks"]
        index = tuple(tuple(int(x) for x in row[:nb]) for row in sq["index"])
        entries = tuple(
            tuple(None if e is None else (where.get(e["page"]), e["kind"]) for e in row[:nb])
            for row in sq["entries"]
        )
        seqs.append((seq_of[sq["id"]], sq["status"], sq["capacity"], sq["history"],
                     len(sq["committed_tokens"]), sq["commit_state"], index, entries))
    return Abstract(tuple(sorted(pages, key=_row_order)), tuple(sorted(occupied)), tuple(sorted(queues)),
                    tuple(pockets), tuple(sorted(seqs)))


def without_forgotten(a: Abstract, forgotten: Collection[int]) -> Abstract:
    """The model's abstraction without the CLOSED sequence slots whose implementation
    handle the manager has forgotten (it keeps the newest `manager.CLOSED_KEPT` closed
    handles; a forgotten one holds nothing and refuses every call as closed)."""
    if not forgotten:
        return a
    return replace(a, seqs=tuple(q for q in a.seqs
                                 if not (q[0] in forgotten and q[1] == SeqStatus.CLOSED.name)))


def diff(model: Abstract, impl: Abstract, names: tuple[str, str] = ("model", "impl")
         ) -> list[str]:
    """Readable differences, model side (or the earlier state) first."""
    out: list[str] = []
    a, b = model.as_dict(), impl.as_dict()
    left, right = names
    for name in a:
        if a[name] == b[name]:
            continue
        if name == "pages":
            only_m = set(a[name]) - set(b[name])
            only_i = set(b[name]) - set(a[name])
            cols = ", ".join(PAGE_COLUMNS)
            out.append(f"pages differ (columns: {cols})")
            out += [f"  {left} only: {row}" for row in sorted(only_m, key=repr)]
            out += [f"  {right} only: {row}" for row in sorted(only_i, key=repr)]
            continue
        out.append(f"{name} differ:")
        out.append(f"  {left}: {a[name]}")
        out.append(f"  {right}: {b[name]}")
    return out

