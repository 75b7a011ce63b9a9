"""The bug zoo: bugs reported against real KV-cache managers, recreated as patches of `impl/`.

Separate from the seeded mutants (`verify/quality/seeded.py: MUTANTS`), which were written
alongside the kit: the zoo is the kit's test of teeth on bugs it was *not* built around
(issue 12). Each `ZooBug` is one upstream report recreated as its hazard class in
kvpocket's terms, as a source patch of the `impl/` function named by `switch`, applied to
a copy of its source while the bug is on (`verify/quality/patches.py: BUGS`, same name;
`with switched_on(name):`, or `kvpocket fuzz --mutant NAME`). impl/ has no switches.

A zoo bug must be killed by the *default campaign* (`verify/conformance/matrix.py: run_matrix`, what
`kvpocket fuzz` runs with no options), not by a preset picked per bug. `preset` and
`policy` below only name where the bug is reachable, for a targeted campaign when the
matrix is unavailable and for the record. `kvpocket mutants --zoo` runs them all;
docs/bug-zoo.md has one paragraph per bug with the measured time-to-kill.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

from kvpocket.model.config import KVConfig, PocketPolicy
from kvpocket.verify.quality.patches import switched_on
from kvpocket.verify.quality.seeded import (
    CONFIGS,
    MutantResult,
    default_campaign,
    detector_of,
    lockstep_campaign,
)

HAZARDS = ("write-after-read", "use-after-free", "double free", "leak", "stale mapping",
           "aliasing", "over-credit", "duplicate entry", "lost pin")


@dataclass(frozen=True)
class ZooBug:
    name: str  # "zoo-..."
    origin: str  # tracker id, e.g. "vLLM #47282"
    description: str  # one line: what went wrong upstream
    hazard: str  # hazard class (one of HAZARDS)
    recreation: str  # the change that recreates it in kvpocket's terms
    switch: str  # "impl/<file>.py <Class.function>": the function(s) its patch edits
    counterpart: str  # "direct" or "closest: <why>"
    data: bool = False  # corrupts KV data (the data oracle is the intended detector)
    preset: str = "tiny"  # where it is reachable (a `quality.seeded.CONFIGS` name)
    policy: str = "revalidate"

    def config(self) -> KVConfig:
        return CONFIGS[self.preset].with_pocket(True, PocketPolicy.parse(self.policy))

    @property
    def switch_file(self) -> str:
        return self.switch.split()[0]


ZOO: dict[str, ZooBug] = {b.name: b for b in (
    ZooBug(
        "zoo-load-dst-no-wait", "vLLM #47282",
        "under async scheduling a freed SWA block is reused as a CPU->GPU load destination "
        "while the previous step's forward still reads it (garbled output)",
        "write-after-read",
        "a migration to GPU (resume's load-back) does not wait on the destination slot's "
        "recycled events, so the copy overwrites a slot another sequence's queued read "
        "still reads",
        "impl/storage.py Storage.migrate", "direct", data=True),
    ZooBug(
        "zoo-store-src-step-fence", "vLLM #46278",
        "store side of the same race: a block is freed under the step fence while its "
        "GPU->CPU offload is still reading it, so the stored copy gets the next owner's data",
        "write-after-read",
        "an eviction store (GPU -> host) releases the source GPU slot with the events of the "
        "page's last compute users (the step fence) instead of the store copy's own event",
        "impl/storage.py Storage.migrate",
        "closest: same spot as the seeded migrate-no-wait (which releases with no event at "
        "all); here the slot waits for the compute step but not for the copy",
        data=True),
    ZooBug(
        "zoo-swa-free-inflight", "vllm-ascend #13501",
        "with async scheduling, out-of-window SWA blocks are freed at schedule time while "
        "the in-flight step still reads them",
        "use-after-free",
        "when an SWA page dies (stale orphan not parked, drained pocket, released entry) "
        "its slot is released without fencing the streams that used it, so it is recycled "
        "as ready while their reads are queued",
        "impl/storage.py Storage.settle", "direct", data=True),
    ZooBug(
        "zoo-pocket-dup-entry", "vLLM #42761",
        "duplicate block ids in the SWA pending-store tracking: a block re-entering the "
        "window is listed twice, so the offload copies wrong data or asserts",
        "duplicate entry",
        "a pop hands the parked page's slot to the new block but leaves the page listed in "
        "the pocket, so a later pop or drain consumes (refuses, releases) it again",
        "impl/kvcache.py KVCache._pop",
        "closest: the pocket is kvpocket's per-sequence list of blocks pending reuse; there "
        "is no separate store list"),
    ZooBug(
        "zoo-offload-double-free", "vLLM #42571",
        "KV block double free with eager CPU offload + sliding window: a physical block id "
        "appended twice to the offload list is freed twice, corrupting the free queue",
        "double free",
        "when eviction offloads a parked SWA page to host, its GPU source slot is returned "
        "to the allocator's free list twice (no dedup), so two allocations can get it",
        "impl/storage.py Storage.migrate",
        "closest: kvpocket has no offload store list; the duplicate free is injected where "
        "offload frees the source slot of a parked (SWA, reused-in-window) page"),
    ZooBug(
        "zoo-stale-slot-mapping", "SGLang #27586",
        "a stale full-to-SWA index mapping (not cleared when the SWA slot moved) is used "
        "for a later free, freeing a live slot that was reused",
        "stale mapping",
        "the pocket remembers the GPU slot a page was parked at; when eviction migrated the "
        "page while parked and another page reused that GPU slot, the refusing pop frees the "
        "remembered slot (now the live page's) as well as the page's real slot",
        "impl/kvcache.py KVCache._settle_orphans, KVCache._pop",
        "closest: the mapping is the pocket's record of the parked slot (kvpocket keeps "
        "one slot per page, no full-to-SWA index table)"),
    ZooBug(
        "zoo-evicted-swa-still-cached", "SGLang #31486",
        "KV evicted by the sliding window is cached (inserted/kept in the radix cache) "
        "again: later hits read stale KV and eviction frees it twice",
        "stale mapping",
        "dropping a committed SWA page does not unlink it from its radix-tree node, so the "
        "prefix cache keeps serving an evicted page (a later match holds a dead page)",
        "impl/storage.py Storage.drop",
        "closest: kvpocket caches SWA pages per radix node; the window-evicted page stays "
        "linked instead of being inserted again"),
    ZooBug(
        "zoo-overflow-orphan-leak", "SGLang #27789",
        "the SWA pool leaks one page at a time until it is exhausted",
        "leak",
        "a stale SWA orphan that cannot be parked because the pocket is full keeps its "
        "backup hold, so one page (and its slot) leaks per overflow",
        "impl/kvcache.py KVCache._settle_orphans",
        "closest: the leak is on kvpocket's overflow path (pocket full) rather than in a "
        "batched SWA free"),
    ZooBug(
        "zoo-park-over-credit", "SGLang #38571",
        "pages owned by the per-request SWA ring were also returned to the paged "
        "allocator, over-crediting its free count",
        "over-credit",
        "parking a page also releases its GPU slot to the allocator, so the pocket and the "
        "allocator both own the slot (the next allocation aliases the parked page)",
        "impl/kvcache.py KVCache._settle_orphans",
        "closest: the pocket plays the ring; the seeded pop-slot-released-twice frees at pop "
        "time, this credits at park time"),
    ZooBug(
        "zoo-prune-live-node", "TensorRT-LLM nvbug 6625710",
        "a page whose only owner is the eviction policy is evicted and the tree prune "
        "detaches its block although a live request still references it",
        "stale mapping",
        "after a committed page is dropped, the prune looks only at that page's entry: its "
        "radix-tree node is detached although a live sequence's committed blocks (and the "
        "node's other life cycles' pages) still reference it; the next commit or close "
        "goes through a dangling node",
        "impl/radix.py RadixTree.unset_page, RadixTree._prune", "direct"),
    ZooBug(
        "zoo-resume-no-pin", "SGLang #26728",
        "without host locks during load back, eviction could evict pages whose indices a "
        "load-back had already captured",
        "lost pin",
        "resume does not take its targets off the eviction queues before making room, so "
        "making room for the load-back evicts the very pages it brings back",
        "impl/kvcache.py KVCache._resume",
        "direct", preset="two-level"),
    ZooBug(
        "zoo-requeue-wrong-level", "TensorRT-LLM #12297",
        "claimBlock ran after the offload swap and erased the block from the wrong free "
        "list, corrupting the free-block counters",
        "stale mapping",
        "after an eviction migrates a victim one level down, its queue entry is written to "
        "the level it left, so the upper queue lists a page that lives below",
        "impl/storage.py Storage.evict",
        "closest: kvpocket's per-level eviction queues stand for the free-block lists",
        preset="two-level"),
    ZooBug(
        "zoo-stale-block-table", "vLLM #42273",
        "SWA eviction leaves stale block-table entries that still point at freed blocks",
        "stale mapping",
        "resume rebuilds the page-index table from every held entry, including "
        "out-of-window blocks kept for a later commit, which then map slots the sequence "
        "does not lock",
        "impl/kvcache.py KVCache._resume",
        "closest: the seeded stale-index-entry leaves the entry at unlock; this one "
        "re-creates it when the table is rebuilt"),
)}


# ---- running one zoo bug ---------------------------------------------------------------


def run_zoo_bug(bug: ZooBug, budget_s: float = 60.0, seed: int = 0, workers: int = 1,
                out_dir: str | None = None, targeted: bool = False,
                examples: int | None = None) -> MutantResult:
    """The default campaign (`run_matrix`, stopping at the first failure) with the bug
    switched on; the failure's Divergence kind names the detector. `targeted=True` runs
    the ci lockstep campaign on the bug's own preset instead (a diagnosis aid, not what
    the zoo is judged by), and says so in `campaign`."""
    res = MutantResult(bug.name, "impl", origin=bug.origin, hazard=bug.hazard)
    out = out_dir or tempfile.mkdtemp(prefix="kvpocket-zoo-")
    with switched_on(bug.name):
        if not targeted:
            c = default_campaign(budget_s, seed=seed, workers=workers, out_dir=out,
                                 examples=examples)
            res.campaign = f"default campaign, {c.detail}: killed: {c.kind}" if c.killed \
                else c.detail
            if c.killed:
                res.killed = True
                res.detectors.append(detector_of(c.kind))
                res.seconds, res.trace_length, res.trace = c.seconds, c.steps, c.trace
                res.examples = c.examples
        else:
            c = lockstep_campaign(bug.config(), bug.preset, budget_s, out_dir=out)
            where = f"targeted {bug.preset}/{bug.policy}"
            res.campaign = f"{where}: killed: {c.kind}" if c.killed else f"{where}: {c.detail}"
            if c.killed:
                res.killed = True
                res.detectors.append(detector_of(c.kind))
                res.seconds, res.trace_length, res.trace = c.seconds, c.steps, c.trace
    return res
