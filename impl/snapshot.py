"""Read-only, JSON-serialisable view of the whole manager state, and the choice record.

`build_snapshot(manager)` returns (only dicts, lists, ints, strs, bools, None):

    {
      "config": KVConfig.to_json(),
      "pages": [                       # every live page, by id
        {"id": int, "lc": int, "pool_group": int, "committed": bool,
         "level": int, "slot": int,    # slot = -1 (NO_SLOT) only for a parked page
                                       # dropped under evict_parked=drop
         "status": "LOCKED" | "HELD" | "DROPPABLE", "locks": int, "holds": int,
         "queued": bool, "priority": int,
         "owner": int | None,          # creating sequence while uncommitted, else None
         "ordinal": int,               # block index in the sequence that created it
         "key": list[int] | None,      # committed: the full token prefix up to its block
         "pocket": int | None},        # sequence whose pocket holds it
        ...],
      "slots": [                       # per (level, pool group)
        {"level": int, "pool_group": int, "capacity": int,
         "free": list[int] (sorted), "occupied": list[int] (sorted),
         "recycled": list[int] (allocator FIFO order), "next_fresh": int}, ...],
      "queues": [{"level": int, "pool_group": int, "order": list[page id]}, ...],
                                       # eviction order: priority asc, then least recent
      "pockets": [{"seq": int, "lc": int, "pages": list[page id]}, ...],  # FIFO, non-empty
      "sequences": [
        {"id": int, "status": SeqStatus name, "capacity": int, "history": int,
         "committed_tokens": list[int], "commit_state": CommitState name,
         "num_committed_blocks": int, "num_blocks": int,
         "index": list[list[int]],     # per lc, num_blocks entries, slot or -1
         "entries": list[list[None | {"page": int, "kind": "lock" | "hold"}]]}, ...],
      "tree": [{"node": int, "parent": int, "key": list[int],
                "pages": list[int | None]}, ...],   # per lc page id
    }

Choice record (`manager.last_choices()`): the tuples one API call made, in order:

    ("alloc", level, pool_group, slot)          a slot taken from an allocator
    ("evict", level, pool_group, page_id)        a victim taken from a queue
    ("migrate", page_id, src_level, dst_level, dst_slot)
    ("drop", level, page_id)                     a committed page destroyed
    ("drop_parked", level, page_id)              a parked victim's slot released, no copy
                                                 (evict_parked=drop; it stays parked)
    ("park", seq, lc, page_id)                   a stale page parked in the pocket
    ("pop", seq, lc, page_id)                    a parked page's slot reused
    ("refuse", seq, lc, page_id)                 a pop that failed revalidation
    ("fail", ExceptionClassName)                 last entry of a failed (rolled back) call
    ("undone", *choice)                          made inside a nested attempt that was
                                                 rolled back (a victim that found no room
                                                 below and was dropped instead)

`choice_labels` translates a record into the labelled choices the model makes: the
model decides a nested attempt with `can_make_room` and never makes the undone ones.

The readers of the manager take a `ManagerView` (`view.py`), not its class: `manager.py`
imports this module, so this one must not import it back.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .page import Page
    from .view import ManagerView

Where = tuple[int, int, int]  # (level, pool group, slot): the name both sides give a page


def page_locations(mgr: ManagerView) -> dict[int, Where]:
    """Where every live page sits now (call before the API call whose choices you label)."""
    return {p.pid: (p.level, p.group, p.slot) for p in mgr.storage.pages.values()}


def choice_labels(choices: list[tuple[Any, ...]], where: dict[int, Where]
                  ) -> list[tuple[str, Any]]:
    """The model-visible choices of one call's record, in order: ("slot", slot),
    ("victim", where) and ("pocket", where), each page named by where it sat when chosen
    (`where` holds the locations before the call and follows its migrations). Undone
    choices, parks, drops and the failure marker are not choices the model makes."""
    where = dict(where)
    out: list[tuple[str, Any]] = []
    for c in choices:
        tag = c[0]
        if tag == "alloc":
            out.append(("slot", int(c[3])))
        elif tag == "evict":
            out.append(("victim", where.get(int(c[3]), (-1, -1, -1))))
        elif tag == "migrate":
            pid = int(c[1])
            if pid in where:
                where[pid] = (int(c[3]), where[pid][1], int(c[4]))
        elif tag == "drop_parked":  # it stays parked, slotless
            pid = int(c[2])
            if pid in where:
                where[pid] = (where[pid][0], where[pid][1], -1)
        elif tag in ("pop", "refuse"):
            out.append(("pocket", where.get(int(c[3]), (-1, -1, -1))))
    return out


def page_record(mgr: ManagerView, p: Page) -> dict[str, Any]:
    st = mgr.storage
    queued = any(p.pid in qs[p.group] for qs in st.queues)
    return {
        "id": p.pid, "lc": p.lc, "pool_group": p.group, "committed": p.committed,
        "level": p.level, "slot": p.slot, "status": p.status.name, "locks": p.locks,
        "holds": p.holds, "queued": queued, "priority": p.priority, "owner": p.owner,
        "ordinal": p.ordinal,
        "key": st.tree.key(p.node) if p.node is not None and p.node in st.tree.nodes else None,
        "pocket": p.pocket_owner,
    }


def build_snapshot(mgr: ManagerView, sequences: Collection[int] | None = None) -> dict[str, Any]:
    """The snapshot above; `sequences` limits the per-sequence part to those ids (the
    lockstep compares only the sequences the model still names)."""
    st = mgr.storage
    slots = []
    queues = []
    for level, allocs in enumerate(st.allocs):
        for g, a in enumerate(allocs):
            slots.append({
                "level": level, "pool_group": g, "capacity": a.capacity,
                "free": a.free_slots(), "occupied": sorted(a.occupied),
                "recycled": list(a.recycled), "next_fresh": a.next_fresh,
            })
            queues.append({"level": level, "pool_group": g,
                           "order": st.queues[level][g].ordered()})
    pockets = []
    seqs = []
    for sid in sorted(mgr.seqs if sequences is None else set(sequences) & mgr.seqs.keys()):
        kv = mgr.seqs[sid]
        for lc, pocket in enumerate(kv.pocket):
            if pocket:
                pockets.append({"seq": sid, "lc": lc, "pages": [p.pid for p in pocket]})
        entries: list[list[dict[str, Any] | None]] = []
        for lc in range(len(kv.pages)):
            row: list[dict[str, Any] | None] = []
            for b, page in enumerate(kv.pages[lc]):
                row.append(None if page is None else
                           {"page": page.pid, "kind": "lock" if kv.locked[lc][b] else "hold"})
            entries.append(row)
        seqs.append({
            "id": sid, "status": kv.status.name, "capacity": kv.capacity,
            "history": kv.history, "committed_tokens": list(kv.committed),
            "commit_state": kv.commit_state.name,
            "num_committed_blocks": kv.num_committed_blocks, "num_blocks": kv.num_blocks,
            "index": [[int(x) for x in kv.index[lc, : kv.num_blocks]]
                      for lc in range(len(kv.pages))],
            "entries": entries,
        })
    tree = [{"node": n.nid, "parent": n.parent, "key": st.tree.key(n.nid),
             "pages": list(n.pages)} for n in sorted(st.tree.nodes.values(),
                                                      key=lambda n: n.nid)]
    return {
        "config": mgr.cfg.to_json(),
        "pages": [page_record(mgr, st.pages[pid]) for pid in sorted(st.pages)],
        "slots": slots,
        "queues": queues,
        "pockets": pockets,
        "sequences": seqs,
        "tree": tree,
    }
