"""The source patches that make each seeded implementation bug and each zoo bug.

`impl/` has no switches: every bug below is a few `SourceEdit`s applied to a copy of one
or two functions of `impl/` while it is switched on (`switched_on`, built on
`kvpocket.verify.patching`). The descriptions, origins and detectors of the bugs are in
`seeded.py: MUTANTS` (seeded bugs) and `zoo.py: ZOO` (bugs reported upstream); a bug of
either registry has its edits here under the same name (a test checks both ways).

To add an implementation bug:

1. describe it in `MUTANTS` (layer "impl") or `ZOO`, with `switch` naming the function;
2. add `_bug(name, edit(target, old, new), ...)` below: `old` is text copied verbatim
   (indentation included) from the target function and must occur in it exactly once;
   `new` is what the bug writes instead. Functions edited by one bug may share state
   through the dictionary `bug_state` (key entries by the bug's name, or a tuple led by it,
   so two bugs switched on together never meet);
3. `pytest tests/quality/test_patches.py` checks that every edit applies and changes the
   function; `kvpocket mutants --only NAME` (or `--zoo --only NAME`) must kill it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kvpocket.verify.patching import SeededBug, SourceEdit, patched

KVCACHE = "kvpocket.impl.kvcache:KVCache."
STORAGE = "kvpocket.impl.storage:Storage."


def edit(target: str, old: str, new: str) -> SourceEdit:
    return SourceEdit(target, old, new)


def _bug(name: str, *edits: SourceEdit) -> SeededBug:
    return SeededBug(name, edits)


BUGS: dict[str, SeededBug] = {b.name: b for b in (
    # ---- seeded mutants (verify/quality/seeded.py: MUTANTS) -----------------------------
    _bug("pop-no-revalidate", edit(
        KVCACHE + "_pop",
        "if policy is PocketPolicy.REVALIDATE and not (",
        "if False and not (")),
    _bug("suspend-no-drain", edit(
        KVCACHE + "suspend",
        "            self._drain_pocket(op)\n",
        "            pass\n")),
    _bug("close-no-drain", edit(
        KVCACHE + "_close",
        "        self._drain_pocket(op)\n",
        "        pass\n")),
    _bug("pocket-pop-not-rolled-back", edit(
        KVCACHE + "_pop",
        "            op.on_undo(pocket.appendleft, page)\n",
        "")),
    _bug("pocket-no-capacity", edit(
        KVCACHE + "_parkable",
        "and len(self.pocket[page.lc]) < pc.capacity)",
        "and True)")),
    _bug("park-committed", edit(
        KVCACHE + "_parkable",
        "and not page.committed\n",
        "and True\n")),
    _bug("park-while-committing",
         edit(KVCACHE + "_stale_transition",
              "and self.commit_state is CommitState.ALLOWED:",
              "and self.commit_state is CommitState.ALLOWED and False:"),
         edit(KVCACHE + "_parkable",
              "and self.commit_state is not CommitState.ALLOWED\n",
              "and True\n")),
    _bug("migrate-no-wait", edit(
        STORAGE + "migrate",
        ".release(src_slot, (ev,), op)",
        ".release(src_slot, (), op)")),
    _bug("pop-slot-released-twice", edit(
        KVCACHE + "_pop",
        '            op.set(page, "slot", NO_SLOT)\n',
        "")),
    _bug("queue-stale-head", edit(
        "kvpocket.impl.eviction:EvictionQueue.first",
        "if self.entries.get(pid) == (p, t):",
        "if True:")),
    _bug("cascade-no-requeue", edit(  # the removal goes to a throwaway undo log
        STORAGE + "evict",
        "self.queues[level][page.group].remove(page.pid, op)",
        "self.queues[level][page.group].remove(page.pid, Op())")),
    _bug("stale-index-entry", edit(
        KVCACHE + "_unlock",
        "        self._set_index(i, b, BAD_PAGE_INDEX, op)\n",
        "")),
    _bug("window-off-by-one", edit(  # the manager's own window arithmetic (impl/window.py)
        "kvpocket.impl.window:out_of_window",
        "first_read = history + 1 - lc.window",
        "first_read = history - lc.window")),
    _bug("suspend-not-evictable", edit(
        KVCACHE + "suspend",
        "                        self._st.requeue(page, op)\n",
        "                        pass\n")),
    _bug("resume-no-wait", edit(
        KVCACHE + "_resume",
        "            st.wait_for(self.stream, evs, op, self.seq_id)\n",
        "")),
    _bug("offload-parked-step-fence", edit(  # the copy still reads the slot handed on
        STORAGE + "migrate",
        ".release(src_slot, (ev,), op)",
        ".release(src_slot, src_evs if page.pocket_owner is not None else (ev,), op)")),
    _bug("resume-index-not-dirty", edit(  # the device's page table is not uploaded again
        KVCACHE + "_resume",
        "            self._set_index(i, b, page.slot, op)\n",
        "            op.setitem(self.index, (i, b), page.slot)\n")),
    # ---- the bug zoo (verify/quality/zoo.py: ZOO) ----------------------------------------
    _bug("zoo-load-dst-no-wait", edit(  # the load ignores the destination slot's readers
        STORAGE + "migrate",
        "        self.wait_for(cs, src_evs + dst_evs, op, seq)\n",
        "        if dst_level == GPU_LEVEL:\n"
        "            dst_evs = ()\n"
        "        self.wait_for(cs, src_evs + dst_evs, op, seq)\n")),
    _bug("zoo-store-src-step-fence", edit(  # the compute step's fence, not the store's event
        STORAGE + "migrate",
        ".release(src_slot, (ev,), op)",
        ".release(src_slot, src_evs if src_level == GPU_LEVEL else (ev,), op)")),
    _bug("zoo-swa-free-inflight", edit(  # freed at schedule time, its reads in flight
        STORAGE + "settle",
        "                self.release_slot(page, op, seq)\n",
        "                if self.cfg.life_cycles[page.lc].is_swa:\n"
        '                    op.set(page, "users", ())\n'
        "                self.release_slot(page, op, seq)\n")),
    _bug("zoo-pocket-dup-entry", edit(  # the consumed page stays listed
        KVCACHE + "_pop",
        '            op.count("pocket_pops", seq)\n',
        '            op.count("pocket_pops", seq)\n'
        "            pocket.append(page)\n"
        "            op.on_undo(pocket.pop)\n")),
    _bug("zoo-offload-double-free", edit(  # the source slot is listed free twice
        STORAGE + "migrate",
        "        self.allocs[src_level][page.group].release(src_slot, (ev,), op)\n",
        "        self.allocs[src_level][page.group].release(src_slot, (ev,), op)\n"
        "        if page.pocket_owner is not None:\n"
        "            self.allocs[src_level][page.group].recycled.append(src_slot)\n"
        "            op.on_undo(self.allocs[src_level][page.group].recycled.pop)\n")),
    _bug("zoo-stale-slot-mapping",  # the pocket remembers where a page was parked
         edit(KVCACHE + "_settle_orphans",
              '                op.count("pocket_parks", self.seq_id)\n',
              '                op.count("pocket_parks", self.seq_id)\n'
              "                bug_state[('zoo-stale-slot-mapping', id(self), page.pid)] = page.slot\n"),
         edit(KVCACHE + "_pop",
              '                op.count("pocket_refusals", seq)\n',
              '                op.count("pocket_refusals", seq)\n'
              "                if page.level != GPU_LEVEL:\n"
              "                    stale = bug_state[('zoo-stale-slot-mapping', id(self), page.pid)]\n"
              "                    if stale in st.allocs[GPU_LEVEL][page.group].occupied:\n"
              "                        st.allocs[GPU_LEVEL][page.group].release(stale, (), op)\n")),
    _bug("zoo-evicted-swa-still-cached", edit(  # a dropped SWA page stays in the tree
        STORAGE + "drop",
        "        if page.node is not None:\n",
        "        if page.node is not None and not self.cfg.life_cycles[page.lc].is_swa:\n")),
    _bug("zoo-overflow-orphan-leak", edit(  # an orphan the full pocket refuses keeps its hold
        KVCACHE + "_settle_orphans",
        "            else:\n"
        '                op.set(page, "holds", page.holds - 1)\n',
        "            else:\n"
        "                if not (park and not page.committed\n"
        "                        and len(self.pocket[page.lc]) >= self._cfg.pocket.capacity):\n"
        '                    op.set(page, "holds", page.holds - 1)\n')),
    _bug("zoo-park-over-credit", edit(  # parking also credits the slot to the allocator
        KVCACHE + "_settle_orphans",
        '                op.count("pocket_parks", self.seq_id)\n',
        '                op.count("pocket_parks", self.seq_id)\n'
        "                self._st.allocs[GPU_LEVEL][page.group].release(\n"
        "                    page.slot, self._st.fence(page, op, self.seq_id), op)\n")),
    _bug("zoo-prune-live-node", edit(  # the dropped page's node is detached, referenced or not
        "kvpocket.impl.radix:RadixTree.unset_page",
        "        self._prune(nid, op)\n",
        "        node = self.nodes[nid]\n"
        "        if nid != ROOT and not node.children:\n"
        "            self._unlink(nid)\n"
        "            op.on_undo(self._link, node)\n"
        "            nid = node.parent\n"
        "        self._prune(nid, op)\n")),
    _bug("zoo-resume-no-pin", edit(  # making room may evict what the load-back brings back
        KVCACHE + "_resume",
        "            st.unqueue(page, op)\n",
        "            pass\n")),
    _bug("zoo-requeue-wrong-level", edit(  # the queue entry is written to the level it left
        STORAGE + "evict",
        "        self.migrate(page, level + 1, op, seq)\n"
        "        self.requeue(page, op)\n",
        "        self.migrate(page, level + 1, op, seq)\n"
        "        self.queues[level][page.group].push(page.pid, page.priority, op)\n")),
    _bug("zoo-stale-block-table", edit(  # the index table rebuilt from every held entry
        KVCACHE + "_resume",
        "                    targets.append((i, b, page))\n",
        "                    targets.append((i, b, page))\n"
        "                else:\n"
        "                    self._set_index(i, b, page.slot, op)\n")),
    # ---- bugs the preset matrix could not reach (verify/quality/reach.py: REACH_BUGS) ----
    _bug("two-windows-fast-path", edit(  # the bound reads the first sliding window only
        "kvpocket.impl.window:next_window_move",
        "    for lc in lcs:\n",
        "    for lc in [x for x in lcs if x.window is not None][:1]:\n")),
    _bug("resume-forgets-sinks", edit(  # the window decided without the sink tokens
        KVCACHE + "_resume",
        "s, e = window.out_of_window(lc, self.history, self._t)",
        "s, e = window.out_of_window(__import__('dataclasses').replace(lc, sink_tokens=0), "
        "self.history, self._t)")),
    _bug("eventlog-failed-resize-true", edit(  # a rolled-back resize logged as a success
        "kvpocket.impl.eventlog:EventLog.write",
        "        line = json.dumps(obj, separators=(\",\", \":\"))\n",
        "        if obj.get(\"action\") == \"resize\" and obj.get(\"result\") is False:\n"
        "            obj = {**obj, \"result\": True}\n"
        "        line = json.dumps(obj, separators=(\",\", \":\"))\n")),
    # ---- found by a fresh-eyes hunt, reported clean before the kit was fixed (reach.py) --
    _bug("block-entries-stale-edge", edit(  # the first stale block is reported in window
        KVCACHE + "block_entries",
        "out.append(BlockEntry(b, page.pid, page.level, page.slot, locked, s <= b < e))",
        "out.append(BlockEntry(b, page.pid, page.level, page.slot, locked, s < b < e))")),
    _bug("rollback-keeps-counts", edit(  # a nested attempt's counts survive its rollback
        "kvpocket.impl.undo:Op.rollback_to",
        "        self.counts.items.clear()\n        self.counts.items.update(counts)\n",
        "")),
    _bug("recommit-node-unreferenced",  # a node found again is not referenced again
         edit(KVCACHE + "_commit",
              "            if nid is None:\n                nid = tree.add(parent, key, op)\n",
              "            found = nid is not None\n"
              "            if nid is None:\n                nid = tree.add(parent, key, op)\n"),
         edit(KVCACHE + "_commit",
              "            tree.acquire(nid, op)\n",
              "            if not found:\n                tree.acquire(nid, op)\n")),
    _bug("load-back-one-pool-group", edit(  # room for the load-back made in pool group 0
        STORAGE + "bring_to_gpu",
        "need[p.group] += 1",
        "need[0] += 1")),
    # ---- a speed structure's rare path, and a guard combination (issue 31) ---------------
    _bug("heap-compaction-drops-tickets", edit(  # the rebuilt heap keys pages by priority only
        "kvpocket.impl.eviction:EvictionQueue._compact",
        "self._heap = [(p, t, i) for i, (p, t) in self.entries.items()]",
        "self._heap = [(p, 0, i) for i, (p, t) in self.entries.items()]")),
    _bug("restop-full-pocket-forgets-slotless", edit(  # a full pocket's slotless page unlisted
        KVCACHE + "stop_committing",
        "        if self.commit_state is CommitState.USER_STOP:\n",
        "        if self.commit_state is CommitState.USER_STOP:\n"
        "            for pocket in self.pocket:\n"
        "                if len(pocket) >= self._cfg.pocket.capacity and not pocket[0].has_slot:\n"
        "                    pocket.popleft()\n")),
)}


def unknown_bug(name: str) -> str:
    """The usage-error line for a name that is not a seeded implementation bug."""
    return f"unknown seeded bug {name!r}; expected one of " + ", ".join(BUGS)


@contextmanager
def switched_on(*names: str) -> Iterator[None]:
    """Switch the named implementation bugs on for the block (and for the worker processes
    a campaign in it spawns); the product code comes back afterwards. Raises KeyError
    (with `unknown_bug`'s message) for a name that is not in `BUGS`."""
    for n in names:
        if n not in BUGS:
            raise KeyError(unknown_bug(n))
    with patched(BUGS[n] for n in names):
        yield
