"""Guard combinations: every API action tried from every combination of the states that
guard it which the model allows.

An API action that names a sequence (`model.api.API`, layer "api") is guarded by that
sequence's state: its status (FREE, ACTIVE, SUSPENDED, CLOSED), its commit state, its
pocket (empty, partly full, full: some life cycle's pocket at capacity), whether a
parked page has lost its GPU slot (dropped, or migrated below), and by the
configuration's shape (one or several sliding windows, sinks or none). `guard_label`
classifies one (action, pre-state) into a label such as
"guard: resize | ACTIVE | stopped | pocket full | parked without slot | 1 window |
no sinks"; the lockstep records it as a rare state of its own family, and
`expected_guard_states` lists the labels a cell must reach: every combination the model
allows (a pocket is non-empty only for an ACTIVE sequence that stopped committing; a
FREE sequence is committing, a CLOSED one stopped) and the cell's configuration can
have (a full pocket needs GPU room for it beside the windows, `pocket_can_fill`; a parked page
loses its slot only when a level below exists and the policy is not `pin`).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import product

from kvpocket.model.api import API
from kvpocket.model.config import (
    GPU_LEVEL,
    NO_SLOT,
    NONE,
    CommitState,
    KVConfig,
    LifeCycle,
    PocketPolicy,
    SeqStatus,
)
from kvpocket.model.state import Layout, State

PREFIX = "guard: "
# The guarded actions, from the API table: those of the integrator's API naming a sequence.
ACTIONS: tuple[str, ...] = tuple(a.name for a in API.values()
                                 if a.layer == "api" and "seq" in a.param_names)
STATUSES = ("FREE", "ACTIVE", "SUSPENDED", "CLOSED")
COMMITTING, STOPPED = "committing", "stopped"
EMPTY, PARTLY, FULL = "pocket empty", "pocket partly full", "pocket full"
NOTHING, WITH_SLOT, WITHOUT_SLOT = "nothing parked", "parked with slot", "parked without slot"

State4 = tuple[str, str, str, str]  # (status, commit state, pocket, parked)


def shape(cfg: KVConfig) -> tuple[str, str]:
    """The configuration's part of a label: its sliding windows and its sinks."""
    n = sum(lc.is_swa for lc in cfg.life_cycles)
    windows = "no window" if n == 0 else "1 window" if n == 1 else "2+ windows"
    return windows, "sinks" if any(lc.sink_tokens for lc in cfg.life_cycles) else "no sinks"


def seq_state(lay: Layout, s: State, seq: int) -> State4:
    """The guarding state of one sequence in a model state."""
    status = SeqStatus(s.seq_status[seq]).name
    commit = COMMITTING if s.commit_state[seq] == CommitState.ALLOWED else STOPPED
    parked: list[int] = []
    full = False
    if len(s.pocket):
        for lc in range(lay.lcs):
            pages = [s.pocket[i] for i in lay.pocket_range(seq, lc) if s.pocket[i] != NONE]
            parked += pages
            full = full or len(pages) == lay.pocket_cap
    pocket = EMPTY if not parked else FULL if full else PARTLY
    moved = any(s.level[p] != GPU_LEVEL or s.slot[p] == NO_SLOT for p in parked)
    return status, commit, pocket, NOTHING if not parked else (
        WITHOUT_SLOT if moved else WITH_SLOT)


def label(action: str, state: State4, cfg_shape: tuple[str, str]) -> str:
    return PREFIX + " | ".join((action, *state, *cfg_shape))


def guard_label(action: str, lay: Layout, pre: State, seq: object) -> str | None:
    """The combination an action on `seq` was tried from (None: not a guarded action, or
    not a sequence of the configuration)."""
    if action not in ACTIONS or isinstance(seq, bool) or not isinstance(seq, int) \
            or not 0 <= seq < lay.seqs:
        return None
    return label(action, seq_state(lay, pre, seq), shape(lay.cfg))


def can_fill_pocket(cfg: KVConfig) -> bool:
    """A full pocket meeting one more stale page needs GPU room for the parked pages, the
    newly stale one and the window, for every life cycle."""
    return cfg.slots_per_level[0] >= cfg.num_life_cycles * (cfg.pocket.capacity + 2) + 2


def _in_window(lc: LifeCycle, t: int) -> int:
    """The most blocks of a sliding-window life cycle inside its window (sinks apart)."""
    assert lc.window is not None
    w = lc.window
    return max(-(-(h + 1) // t) - max(0, (h + 1 - w) // t) for h in range(w, w + 2 * t))


def fill_blocks(cfg: KVConfig, lc: LifeCycle) -> int:
    """A sequence's blocks when the pocket of sliding-window life cycle `lc` is full: its
    sinks, a pocket's worth of stale blocks, and the window's."""
    t = cfg.tokens_per_block
    return -(-lc.sink_tokens // t) + cfg.pocket.capacity + _in_window(lc, t)


def pocket_can_fill(cfg: KVConfig) -> bool:
    """Some life cycle's pocket can be full: one sequence's GPU pages at that moment (the
    parked ones, the window's and sinks' blocks of every sliding window, every block of a
    full-attention life cycle) fit each pool group's GPU slots."""
    t = cfg.tokens_per_block
    for lc in cfg.life_cycles:
        if not lc.is_swa:
            continue
        need = [0] * cfg.num_pool_groups
        need[lc.pool_group] += cfg.pocket.capacity
        for other in cfg.life_cycles:
            need[other.pool_group] += (-(-other.sink_tokens // t) + _in_window(other, t)) \
                if other.is_swa else fill_blocks(cfg, lc)
        if max(need) <= cfg.slots_per_level[GPU_LEVEL]:
            return True
    return False


def allowed_states(cfg: KVConfig, full: bool | None = None) -> list[State4]:
    """The guarding states the model allows and the configuration can have (`full`: can
    it fill a pocket; None: `pocket_can_fill`)."""
    out: list[State4] = [("FREE", COMMITTING, EMPTY, NOTHING), ("CLOSED", STOPPED, EMPTY, NOTHING)]
    for status, commit in product(("ACTIVE", "SUSPENDED"), (COMMITTING, STOPPED)):
        out.append((status, commit, EMPTY, NOTHING))
    if not cfg.pocket.enabled or not any(lc.is_swa for lc in cfg.life_cycles):
        return out
    pockets = [PARTLY] if cfg.pocket.capacity > 1 else []
    if pocket_can_fill(cfg) if full is None else full:
        pockets.append(FULL)
    moved = cfg.num_levels > 1 and cfg.pocket.policy is not PocketPolicy.PIN
    for pocket in pockets:
        for parked in (WITH_SLOT, WITHOUT_SLOT) if moved else (WITH_SLOT,):
            out.append(("ACTIVE", STOPPED, pocket, parked))
    return out


def expected_guard_states(cfg: KVConfig) -> list[str]:
    """Every guard combination a campaign on this configuration must reach."""
    sh = shape(cfg)
    return [label(a, st, sh) for st in allowed_states(cfg) for a in ACTIONS]


def expected_drawn_guard_states(policy: PocketPolicy) -> list[str]:
    """The guard combinations a cell that draws its configurations must reach: those only
    drawn configurations have (several sliding windows, sinks), in the states every such
    configuration with a pocket of capacity 2 or more and a level below GPU allows (a full
    pocket needs more GPU room than most drawn shapes have: left out). Several windows
    without sinks are reported, not required: one drawn shape in eight has them, and the
    default plan met about half of their combinations (docs/campaigns.md)."""
    cfg = KVConfig(life_cycles=(LifeCycle("a", window=2), LifeCycle("b", window=3)),
                   slots_per_level=(4, 4)).with_pocket(True, policy)
    states = allowed_states(replace(cfg, pocket=replace(cfg.pocket, capacity=2)), full=False)
    return [label(a, st, ("2+ windows", "sinks")) for st in states for a in ACTIONS]
