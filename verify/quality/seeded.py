"""The seeded-bug (mutation) campaign: does the kit find realistic bugs, and how fast?

Each mutant in `MUTANTS` is a named bug switched on from outside the code it breaks. An
implementation mutant is a source patch of one or two functions of `impl/`, applied to a
copy of their source while it is on (`verify/quality/patches.py: BUGS`, same names; impl/
has no switches); a spec mutant overrides one of the model's labelled conditions from
outside (`kvpocket.model.overrides`: the spec carries no switches). For each one
`run_mutant`:

* runs the default campaign (`verify/conformance/matrix.py`: what `kvpocket fuzz` runs with no
  options, not a preset chosen for the bug) with the switch on in-process and always
  restored, stopping at the first failure; its kind names the detector;
* for a bug that corrupts KV data, runs a small paged-vs-dense attention scenario
  (`verify/oracles/attention.py`) with the switch on and records whether it notices;
* for a model-side mutant (the model's definition is wrong, so Z3 sees it too), runs
  induction (initiation, consecution of the touched page actions, safety) on a small
  configuration, then page-layer BMC within the remaining time budget ("unknown" when
  it does not finish).

A mutant is killed when some detector flags it. `killmatrix.py` (`kvpocket mutants`)
prints the kill matrix (mutant x detector, with time-to-kill and shrunk trace length),
"killed K of N", and writes a JSON file whose rows carry `origin` ("seeded: <modelled
on>", or a zoo bug's tracker id).

`--zoo` runs the bug zoo instead (`verify/quality/zoo.py`: bugs reported against real managers,
recreated in `impl/`), each under the default campaign (`verify/conformance/matrix.py`), not a preset
chosen per bug; its rows also carry `hazard`.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvpocket.impl import KVCacheManager
from kvpocket.model.api import WINDOW_START
from kvpocket.model.config import KVConfig, PocketPolicy, SeqStatus
from kvpocket.model.overrides import Override, overriding
from kvpocket.model.pages import POCKET_NOT_FULL, STILL_VALID
from kvpocket.model.state import Layout
from kvpocket.verify.conformance.lockstep import MIRROR, RACE
from kvpocket.verify.interrupts import stop_if_interrupted
from kvpocket.verify.oracles.attention import AttentionOracle
from kvpocket.verify.presets import PRESETS, decode_config
from kvpocket.verify.proofs.explicit_bmc import explicit_bmc
from kvpocket.verify.proofs.obligations import prove_config
from kvpocket.verify.proofs.prove import PROVE_CONFIGS, UNSAFE_DEPTH
from kvpocket.verify.proofs.symbolic_bmc import bmc
from kvpocket.verify.quality.patches import switched_on
from kvpocket.verify.traces.trace import read_trace

# Campaign configurations: the presets, plus one with room for a full pocket (3+ stale
# blocks at once), which the presets' small GPU pools never reach.
CONFIGS: dict[str, KVConfig] = {
    **{name: p.config for name, p in PRESETS.items()},
    "wide-pocket": decode_config(slots=(10, 4), blocks=12),
}

# What the default campaign's lockstep can flag, then the checks outside it.
CAMPAIGN_DETECTORS = ("invariant", "divergence", "crash", "race detector", "device mirror",
                      "data oracle")
DETECTORS = (*CAMPAIGN_DETECTORS, "attention", "z3", "explicit-bmc")


def torch_available() -> bool:
    """The attention detector needs torch, an optional extra."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False

# Divergence.kind (see lockstep.py) -> detector.
KIND_DETECTOR = {
    "model invariant violated": "invariant",
    "implementation invariant violated": "invariant",
    "abstract states differ": "divergence",
    "different outcomes": "divergence",
    "different choices": "divergence",
    "the model rejects the implementation's choice": "divergence",
    "the model failed": "divergence",
    "the implementation crashed": "crash",
    RACE: "race detector",
    MIRROR: "device mirror",
    "a speed structure differs from its meaning": "invariant",
}


def detector_of(kind: str) -> str:
    if kind.startswith("data oracle"):
        return "data oracle"
    return KIND_DETECTOR.get(kind, "divergence")


@dataclass(frozen=True)
class Mutant:
    name: str
    layer: str  # "impl" (the implementation is wrong) or "model" (the spec is wrong)
    description: str
    modelled_on: str
    switch: str  # where it lives: the function its patch edits, or the overridden spec
    preset: str  # lockstep campaign configuration (a `CONFIGS` name)
    policy: str = "revalidate"
    data: bool = False  # corrupts KV data: the attention check runs too
    actions: tuple[str, ...] = ()  # model mutants: page actions whose consecution Z3 checks
    prove_config: str = "gpu-host"  # model mutants: `prove.PROVE_CONFIGS` name
    overrides: dict[str, Override] = field(default_factory=dict)  # model mutants: label -> override

    def config(self) -> KVConfig:
        return CONFIGS[self.preset].with_pocket(True, PocketPolicy.parse(self.policy))


ALWAYS: Override = ("always", True)  # a spec mutant that drops a labelled condition

MUTANTS: dict[str, Mutant] = {m.name: m for m in (
    # ---- the implementation ------------------------------------------------------------
    Mutant("pop-no-revalidate", "impl",
           "pop takes a parked page's slot id without re-checking it is still a GPU slot",
           "PR #16288 review finding (pocketed page evicted to host, slot id reused at GPU)",
           "impl/kvcache.py KVCache._pop", "tiny", data=True),
    Mutant("suspend-no-drain", "impl", "suspend() leaves the pocket full",
           "PR #16288 claim 'drained on suspend()' + review nitpick (untested)",
           "impl/kvcache.py KVCache.suspend", "tiny"),
    Mutant("close-no-drain", "impl", "close() leaves the pocket full (parked pages leak)",
           "PR #16288 claim 'drained on close()' + review nitpick (untested)",
           "impl/kvcache.py KVCache._close", "tiny"),
    Mutant("pocket-pop-not-rolled-back", "impl",
           "the pocket is consumed on the OutOfPages path: a failed resize loses popped pages",
           "PR #16288 claim 'consumed only on success paths so the OutOfPagesError revert is "
           "unaffected' + review nitpick", "impl/kvcache.py KVCache._pop", "tiny"),
    Mutant("pocket-no-capacity", "impl", "the pocket's capacity (2 per life cycle) is not enforced",
           "PR #16288 '2 pages per life cycle' bound + review nitpick (untested)",
           "impl/kvcache.py KVCache._parkable", "wide-pocket"),
    Mutant("park-committed", "impl", "a committed (radix-tree) page is parked and its slot reused",
           "PR #16288 'committed pages kept for prefix reuse are never touched'",
           "impl/kvcache.py KVCache._parkable", "tiny"),
    Mutant("park-while-committing", "impl",
           "a stale block still needed for committing is orphaned and parked",
           "PR #16288 'only when committing is disallowed'; PR #14478 stale-range holder",
           "impl/kvcache.py KVCache._stale_transition, _parkable", "tiny"),
    Mutant("migrate-no-wait", "impl",
           "a migrated page's source slot is recycled without the copy's event",
           "upstream §2.6 _batched_migrate (src slot released with the copy's ready event)",
           "impl/storage.py Storage.migrate", "tiny", data=True),
    Mutant("pop-slot-released-twice", "impl",
           "the popped page keeps its slot id, so the slot is released while the new block uses it",
           "upstream Slot double-release assertion (§1.1 / invariant 'slot owned once')",
           "impl/kvcache.py KVCache._pop", "tiny", data=True),
    Mutant("queue-stale-head", "impl",
           "the eviction queue returns a stale (removed) head although live pages remain",
           "upstream §4 latent defect: pop leaves an empty priority bucket in front",
           "impl/eviction.py EvictionQueue.first", "two-level"),
    Mutant("cascade-no-requeue", "impl",
           "victims taken from a queue are not re-queued when a deeper level runs out",
           "upstream §7 'Other records': _prepare_free_slots 'Do we need to revert the "
           "eviction we did before? Maybe not.'", "impl/storage.py Storage.evict", "three-level"),
    Mutant("stale-index-entry", "impl",
           "an unlocked (stale) block stays mapped in the page-index table",
           "upstream §3.3 resize: stale blocks get BAD_PAGE_INDEX (invariant 'index matches "
           "locks')", "impl/kvcache.py KVCache._unlock", "tiny"),
    Mutant("window-off-by-one", "impl",
           "the manager's window drops the +1: block b stale iff (b+1)t <= h - w",
           "upstream §3.2 SWA window arithmetic (attention at position h sees [h+1-w, h])",
           "impl/window.py out_of_window", "tiny"),
    Mutant("suspend-not-evictable", "impl", "a suspended sequence's HELD pages are not queued",
           "upstream §3.5 suspend (pages become evictable); PR #15931 host tier fills up",
           "impl/kvcache.py KVCache.suspend", "tiny"),
    Mutant("resume-no-wait", "impl",
           "resume locks a page without waiting on its earlier users' events",
           "found by this kit's lockstep: missing wait on resume for a reused prefix page",
           "impl/kvcache.py KVCache._resume", "offset", data=True),
    Mutant("offload-parked-step-fence", "impl",
           "the GPU slot of an offloaded parked page goes back to the pool with its writers' "
           "events, not the copy's: the next block may overwrite it while the copy still "
           "reads it (a race no data check sees: the host copy of a parked page is never read)",
           "upstream §2.6 _batched_migrate (a source slot is released with the copy's ready "
           "event); zoo-store-src-step-fence for the pages a data check cannot follow",
           "impl/storage.py Storage.migrate", "tiny-migrate"),
    Mutant("resume-index-not-dirty", "impl",
           "resume writes the slots it locks straight into the index table without marking it "
           "dirty: the page table on the device keeps its suspended rows (all BAD)",
           "CuPy `KVCache.page_table`: the device copy is uploaded again only when the index "
           "changed (`_index_dirty`); invisible on the CPU before the device-mirror mode",
           "impl/kvcache.py KVCache._resume", "tiny"),
    # ---- the model (the spec is wrong; Z3 sees the same definitions) --------------------
    Mutant("model-pop-no-revalidate", "model",
           "the spec's pop (revalidate) drops the 'parked page still valid' guard and check",
           "PR #16288 review finding, as a spec bug (= the unsafe policy under revalidate)",
           "model/pages.py g_pop, model/api.py pop_or_refuse", "tiny", actions=("pop",),
           overrides={STILL_VALID: ALWAYS}),
    Mutant("model-park-committed", "model", "the spec's park accepts a committed page",
           "PR #16288 'committed pages kept for prefix reuse are never touched'",
           "model/pages.py g_park", "tiny", actions=("park",),
           overrides={"page is uncommitted": ALWAYS}),
    Mutant("model-pocket-no-capacity", "model", "the spec's park ignores the pocket capacity",
           "PR #16288 '2 pages per life cycle' bound",
           "model/pages.py g_park, model/api.py park_or_release", "wide-pocket",
           actions=("park",), overrides={POCKET_NOT_FULL: ALWAYS}),
    Mutant("model-drop-held", "model", "the spec lets the cascade drop a HELD queued page",
           "PR #15931 / upstream §2.4: only DROPPABLE pages may be dropped (HELD ones migrate)",
           "model/pages.py g_drop", "three-level", actions=("drop",),
           overrides={"page is DROPPABLE": ALWAYS}),
    Mutant("model-drop-unparked", "model",
           "the spec's drop_parked accepts a victim that is not parked (HELD data lost, no copy)",
           "issue 14: only dead (parked) data may be dropped uncopied; upstream §2.4: HELD "
           "pages migrate", "model/pages.py g_drop_parked", "tiny", actions=("drop_parked",),
           overrides={"page is parked in a pocket": ALWAYS}),
    Mutant("model-window-off-by-one", "model", "the spec's window drops the +1",
           "upstream §3.2 SWA window arithmetic", "model/api.py _stale", "tiny",
           overrides={WINDOW_START: ("add", -1)}),
)}


@dataclass
class MutantResult:
    name: str
    layer: str
    killed: bool = False
    detectors: list[str] = field(default_factory=list)
    seconds: float | None = None  # time to kill (first detector), None if not killed
    examples: int | None = None  # the default campaign's examples up to the kill (planned order)
    trace_length: int | None = None  # shrunk lockstep trace
    campaign: str = ""  # "killed: <kind>", "survived N examples", "budget exhausted"
    attention: str = "n/a"  # "caught", "missed", "n/a", "skipped" (no torch)
    z3: dict[str, str] = field(default_factory=dict)  # obligation -> status
    trace: str | None = None
    origin: str = ""  # "seeded: <modelled on>" or a zoo bug's tracker id
    hazard: str | None = None  # zoo bugs: the hazard class

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "layer": self.layer, "origin": self.origin}
        if self.hazard is not None:
            out["hazard"] = self.hazard
        return {**out, "killed": self.killed,
                "detectors": self.detectors,
                "seconds": None if self.seconds is None else round(self.seconds, 3),
                "examples": self.examples,
                "trace_length": self.trace_length, "campaign": self.campaign,
                "attention": self.attention, "z3": self.z3, "trace": self.trace}


class BudgetExhausted(BaseException):  # a BaseException: it passes through Hypothesis
    """Raised from the progress hook to stop a campaign at its time budget."""


# ---- the lockstep campaign ------------------------------------------------------------------


@dataclass
class CampaignOutcome:
    killed: bool
    kind: str
    seconds: float
    steps: int | None
    trace: str | None
    examples: int
    detail: str = ""


def lockstep_campaign(cfg: KVConfig, config_name: str, budget_s: float, examples: int = 60,
                      out_dir: str | None = None) -> CampaignOutcome:
    """The `ci` campaign on `cfg` with whatever mutants are switched on (in this process)."""
    # Hypothesis (about a second to import) only when it runs: `kvpocket --help` imports this module
    from kvpocket.verify.conformance.fuzz import CampaignSpec, run_worker
    from kvpocket.verify.conformance.replay import replay
    out = out_dir or tempfile.mkdtemp(prefix="kvpocket-mutants-")
    spec = CampaignSpec(config_name, cfg, profile="ci", examples=examples, out_dir=out)
    t0 = time.monotonic()

    exhausted = False

    def hook(_: int) -> None:
        nonlocal exhausted
        if time.monotonic() - t0 > budget_s:
            exhausted = True
            raise BudgetExhausted

    try:
        report = run_worker(spec, progress=hook)
    except BudgetExhausted:
        exhausted = True
    seconds = time.monotonic() - t0
    if exhausted:  # (Hypothesis may also report the interruption as a failure)
        return CampaignOutcome(False, "", seconds, None, None, 0,
                               f"budget of {budget_s:g} s exhausted")
    if not report.failures:
        return CampaignOutcome(False, "", seconds, None, None, report.examples,
                               f"survived {report.examples} examples")
    f = report.failures[0]
    result = replay(read_trace(f.trace))
    kind = result.kind if not result.ok else _kind_of(f.message)
    return CampaignOutcome(True, kind, seconds, f.steps, f.trace, report.examples,
                           f.message.splitlines()[0] if f.message else "")


def default_campaign(budget_s: float, seed: int = 0, workers: int = 1,
                     out_dir: str | None = None, examples: int | None = None
                     ) -> CampaignOutcome:
    """The default campaign (`kvpocket fuzz` with no options: the matrix, stopping at the
    first failure) with whatever mutants are switched on (in this process). With
    `examples`, it stops on that example budget instead of `budget_s` (the same run, and
    the same verdict, on any machine); `examples` of a kill is then the examples run up to
    the failing one, in the campaign's planned order."""
    # Hypothesis (about a second to import) only when it runs: `kvpocket --help` imports this module
    from kvpocket.verify.conformance.matrix import run_matrix

    out = out_dir or tempfile.mkdtemp(prefix="kvpocket-mutants-")
    t0 = time.monotonic()
    # its progress on stderr: a surviving mutant runs the whole budget, minutes
    report = run_matrix(seed=seed, budget_s=budget_s, workers=workers, out_dir=out,
                        total_examples=examples, show_progress=True)
    if report.interrupted:  # Ctrl-C: no verdict on this mutant (`verify/interrupts.py`)
        raise KeyboardInterrupt
    stop_if_interrupted()  # also when a library swallowed it
    seconds = time.monotonic() - t0
    if not report.failures:
        budget = f"{report.examples} examples" if examples is not None else \
            f"{seconds:.0f} s, {report.examples} examples"
        return CampaignOutcome(False, "", seconds, None, None, report.examples,
                               f"default campaign: survived {budget}")
    f = report.failures[0]  # the first in planned order
    return CampaignOutcome(True, f.kind, f.seconds, f.steps, f.trace, f.examples,
                           f"cell {f.cell}")


def _kind_of(message: str) -> str:
    first = message.splitlines()[0] if message else ""
    if first.startswith("step ") and ": " in first:
        return first.split(": ", 1)[1]
    return "the implementation crashed"


# ---- the attention check --------------------------------------------------------------------


def attention_scenario(cfg: KVConfig, steps: int = 24, head_dim: int = 4) -> bool:
    """Two decoding sequences under eviction pressure, suspend and resume; paged SWA
    attention through the page table must equal dense attention at every step.
    True when a mismatch (or a crash while reading the table) is seen."""
    # optional: torch (kvpocket[torch]); the detector is skipped without it
    import torch

    t = cfg.tokens_per_block
    mgr = KVCacheManager(cfg, slot_elems=2 * t * head_dim, dtype=np.float32)
    att = AttentionOracle(mgr, head_dim=head_dim)
    rng = np.random.default_rng(0)
    try:
        kvs = [mgr.create(i) for i in range(min(2, cfg.num_sequences))]
        for kv in kvs:
            kv.resume()
            kv.stop_committing()
        for h in range(min(steps, cfg.max_capacity - 1)):
            for j, kv in enumerate(kvs):
                if kv.status is not SeqStatus.ACTIVE and not kv.resume():
                    continue
                if not kv.resize(h + 1, h):
                    continue
                att.write(kv, list(range(h + 1)))  # the whole history: a reused slot is seen
                q = rng.standard_normal(head_dim).astype(np.float32)
                for lc in range(cfg.num_life_cycles):
                    if not torch.allclose(att.paged(kv, lc, q), att.dense(kv, lc, q),
                                          rtol=1e-4, atol=1e-4):
                        return True
                if (h + j) % 3 == 2:
                    mgr.pressure(0, 0, 2)
                if (h + j) % 5 == 4:
                    kv.suspend()
    except Exception:  # the scenario broke: the bug is visible, not to attention though
        return False
    return False


# ---- Z3 and explicit BMC -----------------------------------------------------------------


EXPLICIT_BMC = "bmc:api explicit"  # its verdict's key in `z3_checks` (to UNSAFE_DEPTH)


def z3_checks(m: Mutant, bmc_depth: int = 4) -> dict[str, str]:
    """Induction (init, consecution of the touched actions, safety), explicit API-level
    BMC from Init (every invariant, so an API-layer definition is checked too), then
    page-level Z3 BMC. Statuses: proved / violated / unknown (a resource limit: counted
    in Z3's units or states, never in seconds, so the same on any machine)."""
    cfg = PROVE_CONFIGS[m.prove_config].config.with_pocket(True, PocketPolicy.parse(m.policy))
    lay = Layout(cfg)
    out: dict[str, str] = {}
    if m.actions:
        for o in prove_config(lay, m.prove_config, actions=m.actions):
            out[o.obligation] = o.status
    else:
        out["induction"] = "n/a (API-layer definition)"
    api = explicit_bmc(lay, "api", UNSAFE_DEPTH)
    out[EXPLICIT_BMC] = api.status if api.status != "unknown" else f"unknown ({api.detail})"
    if not m.actions:
        return out
    r = bmc(lay, "page", bmc_depth)
    status = {"violated": "violated", "proved": "proved"}.get(r.status, "unknown")
    if status == "unknown":
        status = f"unknown (at depth {r.depth}: {r.detail})"
    out[f"bmc:page<={bmc_depth}"] = status
    return out


# ---- one mutant ---------------------------------------------------------------------------


def run_mutant(m: Mutant, budget_s: float = 60.0, attention: bool = True,
               z3: bool = True, bmc: bool = True, out_dir: str | None = None,
               examples: int | None = None, first_kill: bool = False) -> MutantResult:
    """Every detector on one mutant, with its switch on (restored afterwards). `examples`:
    the default campaign's example budget (else it stops on `budget_s`). `first_kill`
    (with `z3` and not `bmc`): a spec mutant is tried by Z3 induction first, seconds, and
    the campaign runs only if induction does not kill it; a campaign that cannot reach a
    spec bug otherwise runs its whole budget before the proof that kills it does. The
    verdict (killed or not) is the same; fewer detectors are listed."""
    if first_kill and z3 and not bmc and m.layer == "model" and m.actions:
        with overriding(m.overrides):
            proved = _induction_only(m)
        if any(v == "violated" for v in proved.values()):
            return MutantResult(m.name, m.layer, origin=f"seeded: {m.modelled_on}",
                                killed=True, detectors=["z3"], z3=proved,
                                campaign="not run: Z3 induction killed it first")
    res = MutantResult(m.name, m.layer, origin=f"seeded: {m.modelled_on}")
    with switched_on(*([m.name] if m.layer == "impl" else [])), overriding(m.overrides):
        c = default_campaign(budget_s, out_dir=out_dir, examples=examples)
        res.campaign = f"default campaign, {c.detail}: killed: {c.kind}" if c.killed \
            else c.detail
        if c.killed:
            res.detectors.append(detector_of(c.kind))
            res.seconds, res.trace_length, res.trace = c.seconds, c.steps, c.trace
            res.examples = c.examples
        if attention and m.data and not torch_available():
            res.attention = "skipped"
        elif attention and m.data:
            caught = attention_scenario(m.config())
            res.attention = "caught" if caught else "missed"
            if caught:
                res.detectors.append("attention")
        if z3 and m.layer == "model":
            z0 = time.monotonic()
            res.z3 = z3_checks(m) if bmc else _induction_only(m)
            if res.z3.get(EXPLICIT_BMC) == "violated":
                res.detectors.append("explicit-bmc")
            if any(v == "violated" for k, v in res.z3.items() if k != EXPLICIT_BMC):
                res.detectors.append("z3")
            if res.seconds is None and any(v == "violated" for v in res.z3.values()):
                res.seconds = time.monotonic() - z0
    res.killed = bool(res.detectors)
    return res


def _induction_only(m: Mutant) -> dict[str, str]:
    if not m.actions:
        return {"induction": "n/a (API-layer definition)"}
    cfg = PROVE_CONFIGS[m.prove_config].config.with_pocket(True, PocketPolicy.parse(m.policy))
    return {o.obligation: o.status for o in prove_config(Layout(cfg), m.prove_config,
                                                         actions=m.actions)}
