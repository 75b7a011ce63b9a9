"""The public read-only views and the operation counters, checked against the model.

The lockstep compares the implementation's *internals* (its snapshot) with the model,
but an integrator reads the manager through its views: a sequence's `block_table`,
`block_entries` and `pocket_entries`, the manager's `eviction_order`, `slot_counts` and
`pages`, and its counters (`counters_of`). A view computed wrongly (an off-by-one at the
window's edge, a stale flag, a counter left behind by a rolled-back attempt) leaves the
internals right, so the state comparison alone reports such a bug as clean. Here each
view is rebuilt from the model's abstract state (`abstraction.py`) and compared, after
every step; the counters are compared with the choices the step recorded (which the
lockstep checks against the model) and with the slots it took and freed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from kvpocket.impl.manager import KVCacheManager
from kvpocket.model.config import BAD_PAGE_INDEX, GPU_LEVEL, NO_SLOT, KVConfig, stale_range
from kvpocket.verify.conformance.abstraction import Abstract, Where

DEAD: Where = (-1, -1, -1)  # the abstraction's name for a page that is not alive

# Counter -> the choice tags (`impl/snapshot.py`) each of which it counts once.
COUNTED_CHOICES: dict[str, tuple[str, ...]] = {
    "alloc_calls": ("alloc",),
    "evictions": ("evict",),
    "migrations": ("migrate",),
    "drops": ("drop", "drop_parked"),
    "pocket_parks": ("park",),
    "pocket_pops": ("pop",),
    "pocket_refusals": ("refuse",),
}


def occupied_slots(impl: KVCacheManager) -> int:
    """Slots taken in every allocator (for the `releases` counter's balance)."""
    return sum(len(a.occupied) for allocs in impl.storage.allocs for a in allocs)


def counter_differences(before: Mapping[str, int], after: Mapping[str, int],
                        choices: Sequence[tuple[Any, ...]], occupied_before: int,
                        occupied_after: int) -> list[str]:
    """The total counters' change over one call against what the call did: nothing for a
    rolled-back call (its record ends in a "fail" entry) or one refused before it started;
    else one count per choice it made (a nested attempt's undone choices count nothing),
    and releases that balance the slots it took and freed."""
    delta = {name: after[name] - before[name] for name in after}
    failed = bool(choices) and choices[-1][0] == "fail"
    made = Counter() if failed else Counter(c[0] for c in choices)
    out: list[str] = []
    for name, tags in COUNTED_CHOICES.items():
        want = sum(made[t] for t in tags)
        if delta[name] != want:
            out.append(f"counter {name} changed by {delta[name]}, the call made {want} "
                       f"{'/'.join(tags)} choices" + (" (it was rolled back)" if failed else ""))
    freed = 0 if failed else delta["alloc_calls"] + occupied_before - occupied_after
    if delta["releases"] != freed:
        out.append(f"counter releases changed by {delta['releases']}, the call freed {freed} "
                   f"slots ({delta['alloc_calls']} taken, occupied {occupied_before} -> "
                   f"{occupied_after})")
    if failed and any(delta.values()):
        out += [f"counter {n} changed by {d} in a rolled-back call"
                for n, d in delta.items() if d and n not in COUNTED_CHOICES and n != "releases"]
    return out


def view_differences(impl: KVCacheManager, cfg: KVConfig, model: Abstract,
                     impl_id: Mapping[int, int]) -> list[str]:
    """Every public view of `impl` that disagrees with the model's abstract state
    (sequences named by model slot, `impl_id` maps them to implementation ids)."""
    out: list[str] = []
    infos = impl.pages()
    where = {p.page_id: (p.level, p.pool_group, p.slot) for p in infos}
    seq_of = {v: k for k, v in impl_id.items()}
    out += _manager_views(impl, cfg, model, where, seq_of, infos)
    pockets = {(q, lc): pages for q, lc, pages in model.pockets}
    t = cfg.tokens_per_block
    for row in model.seqs:
        q, status, history = row[0], row[1], row[3]
        index, entries = row[6], row[7]
        kv = impl.seqs.get(impl_id.get(q, -1))
        if kv is None or status not in ("ACTIVE", "SUSPENDED"):
            continue
        for lc, life in enumerate(cfg.life_cycles):
            name = f"seq {q} lc {lc}"
            table = kv.block_table(lc)
            if table != index[lc]:
                out.append(f"{name}: block_table {table}, model {index[lc]}")
            s, e = stale_range(life, history, t)
            want = [(b, None, False, s <= b < e) if ent is None else
                    (b, (ent[0][0], ent[0][2]), ent[1] == "lock", s <= b < e)
                    for b, ent in enumerate(entries[lc])]
            got = [(x.block, None if x.page_id is None else (x.level, x.slot), x.locked, x.stale)
                   for x in kv.block_entries(lc)]
            if got != want:
                out.append(f"{name}: block_entries (block, (level, slot), locked, stale) "
                           f"{got}, model {want}")
            parked = pockets.get((q, lc), ())
            want_pocket = [(*w, w != DEAD and w[0] == GPU_LEVEL and w[2] != NO_SLOT)
                           for w in parked]
            got_pocket = [(x.level, x.pool_group, x.slot, x.valid) if x.page_id in where
                          else (*DEAD, x.valid) for x in kv.pocket_entries(lc)]
            if got_pocket != want_pocket:
                out.append(f"{name}: pocket_entries (level, pool group, slot, valid) "
                           f"{got_pocket}, model {want_pocket}")
    return out


def mirror_differences(impl: KVCacheManager, cfg: KVConfig, model: Abstract,
                       impl_id: Mapping[int, int]) -> list[str]:
    """Every page table a kernel would read now (`page_table(lc)`, read as a kernel reads
    it: uploaded first if the handle thinks it changed) that differs from the model's
    index row, padded with BAD_PAGE_INDEX to `max_blocks`.

    Compared with the model, not with `block_table`: `block_table` reads the host array
    that is uploaded, so equality with it would check the upload only, and only over
    `num_blocks`; the model's row checks the upload and the host index at once, with no
    implementation code on the expected side, and the tail a kernel may also read."""
    out: list[str] = []
    pad = cfg.max_blocks
    for row in model.seqs:
        q, status, index = row[0], row[1], row[6]
        kv = impl.seqs.get(impl_id.get(q, -1))
        if kv is None or status not in ("ACTIVE", "SUSPENDED"):
            continue
        for lc in range(cfg.num_life_cycles):
            got = tuple(int(x) for x in impl.backend.to_numpy(kv.page_table(lc)).tolist())
            want = (*index[lc], *[BAD_PAGE_INDEX] * (pad - len(index[lc])))
            if got != want:
                wrong = [b for b, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
                out.append(f"seq {q} lc {lc}: page_table (what a kernel reads) differs from "
                           f"the model at blocks {wrong}: {[got[b] for b in wrong]}, model "
                           f"{[want[b] for b in wrong]}")
    return out


def _manager_views(impl: KVCacheManager, cfg: KVConfig, model: Abstract,
                   where: Mapping[int, Where], seq_of: Mapping[int, int],
                   infos: Sequence[Any]) -> list[str]:
    out: list[str] = []
    for level, pg, order in model.queues:
        got = tuple(where.get(pid, DEAD) for pid in impl.eviction_order(level, pg))
        if got != order:
            out.append(f"eviction_order({level}, {pg}) {got}, model {order}")
    # every (level, pool group), level-major, with its free and total slots: a pool left out
    # or a wrong capacity is a difference too
    want_counts = [(level, pg, cfg.slots_per_level[level] - len(slots), cfg.slots_per_level[level])
                   for level, pg, slots in model.occupied]
    got_counts = [(c.level, c.pool_group, c.free, c.capacity) for c in impl.slot_counts()]
    if got_counts != want_counts:
        out.append(f"slot_counts (level, pool group, free, capacity) {got_counts}, model "
                   f"{want_counts}")
    for level, pg, want, _ in want_counts:
        if impl.free_slots(level, pg) != want:
            out.append(f"free_slots({level}, {pg}) {impl.free_slots(level, pg)}, model {want}")

    def seq(sid: int | None) -> int | None:
        return None if sid is None else seq_of.get(sid, -1)

    # (level, pool group, slot, lc, committed, status, owner, pocket): the model's page rows
    got_pages = Counter((p.level, p.pool_group, p.slot, p.lc, p.committed, p.status,
                         None if p.committed else seq(p.owner), seq(p.pocket_owner))
                        for p in infos)
    want_pages = Counter((*r[:6], r[7], r[10]) for r in model.pages)
    if got_pages != want_pages:
        only_impl = sorted(map(repr, got_pages - want_pages))
        only_model = sorted(map(repr, want_pages - got_pages))
        out.append(f"pages() (level, pool group, slot, lc, committed, status, owner, pocket): "
                   f"only in the view {only_impl}, only in the model {only_model}")
    return out
