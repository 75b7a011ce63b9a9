"""The Hypothesis state machine: rules are the lockstep alphabet, and after every
rule the implementation and the model must agree (see `lockstep.py`).

Rules take relative, shrink-friendly arguments ("advance history by 1") and
turn them into absolute parameters, so the recorded trace replays without
Hypothesis. `target()` and `event()` steer campaigns toward rare states; the
campaign runner reads the counts from `STATS`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hypothesis import event, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvpocket.model.config import GPU_LEVEL, NONE, CommitState, KVConfig, PocketPolicy, SeqStatus
from kvpocket.verify.conformance import guards
from kvpocket.verify.conformance.configs import kv_configs
from kvpocket.verify.conformance.lockstep import Divergence, Lockstep
from kvpocket.verify.traces.alphabet import alphabet

Trace = list[tuple[str, dict[str, Any]]]


@dataclass
class CampaignStats:
    """What a campaign saw; reset by the runner, filled by the machines."""

    examples: int = 0
    steps: int = 0
    rare: Counter[str] = field(default_factory=Counter)
    max_pocket: int = 0
    failure: tuple[Trace, str] | None = None  # the last failing trace (the shrunk one)
    failure_config: KVConfig | None = None  # its configuration (drawn or the machine's)
    failure_event_log: bool = False  # its example checked the event log too
    checks: Counter[str] = field(default_factory=Counter)  # check -> examples that ran it
    on_step: Callable[[int], None] | None = None  # progress hook set by the runner
    # Rare state -> the 1-based index (in this batch) of the first example reaching it.
    first_reached: dict[str, int] = field(default_factory=dict)

    def reset(self) -> None:
        self.examples, self.steps, self.max_pocket, self.failure = 0, 0, 0, None
        self.failure_config, self.failure_event_log = None, False
        self.rare.clear()
        self.checks.clear()
        self.first_reached.clear()


STATS = CampaignStats()


class LockstepMachine(RuleBasedStateMachine):
    """Parametrised by a subclass (see `machine_for`)."""

    cfg: KVConfig  # the class's configuration (a drawn one: this example's, see `start`)
    backend: ClassVar[str] = "numpy"
    eager: ClassVar[bool] = False  # streams run only when an `advance` rule says so
    # Every k-th example (0: none) also writes the implementation's event log and checks
    # each line with `kvpocket trace check`'s checker (`Lockstep(check_event_log=True)`).
    event_log_every: ClassVar[int] = 0
    event_log_offset: ClassVar[int] = 0  # which examples: those with (index + offset) % k == 0
    # The simulator's race detector and device-mirror mode, in every example: each costs
    # a few per cent of a step (docs/performance.md), too little to leave any example out.
    race_check: ClassVar[bool] = True
    device_mirror: ClassVar[bool] = True
    ls: Lockstep

    def __init__(self) -> None:
        super().__init__()
        self.trace: Trace = []
        self.max_pocket = 0
        self.failed = False
        self.reached: set[str] = set()  # rare states this example reached (steers target())
        STATS.examples += 1
        self.index = STATS.examples
        # Every k-th example from an offset (a campaign's seed picks it, so short slices of
        # many cells check different examples); never the first, Hypothesis's simplest.
        k = self.event_log_every
        self.check_event_log = k > 0 and self.index > 1 and (
            self.index + self.event_log_offset) % k == 0
        if not self.draws_config:
            self._open(self.cfg)

    draws_config: ClassVar[bool] = False

    def _open(self, cfg: KVConfig) -> None:
        self.cfg = cfg
        self.ls = Lockstep(cfg, backend=self.backend, eager=self.eager,
                           check_event_log=self.check_event_log, race_check=self.race_check,
                           device_mirror=self.device_mirror)
        STATS.checks.update(self.ls.checks)

    # ---- plumbing ------------------------------------------------------------------------
    def _step(self, action: str, params: dict[str, Any]) -> None:
        self.trace.append((action, dict(params)))
        try:
            rec = self.ls.step(action, params)
        except MemoryError:  # the machine's limit, not a finding (no trace is kept)
            raise
        except Exception as exc:  # a divergence, or a crash in either side: keep the trace
            self.failed = True
            STATS.failure = (list(self.trace), f"{type(exc).__name__}: {exc}"
                             if not isinstance(exc, Divergence) else str(exc))
            STATS.failure_config, STATS.failure_event_log = self.cfg, self.check_event_log
            raise
        STATS.steps += 1
        if STATS.on_step is not None:
            STATS.on_step(1)
        for name in rec.events:
            event(name)
            STATS.rare[name] += 1
            self.reached.add(name)
            STATS.first_reached.setdefault(name, self.index)
        self.max_pocket = max(self.max_pocket, self.ls.pocket_occupancy())
        STATS.max_pocket = max(STATS.max_pocket, self.max_pocket)

    def _state(self) -> Any:
        return self.ls.model.state

    # ---- setup: sequences start decoding more often than not ---------------------------
    @initialize(n=st.integers(0, 2), committing=st.lists(st.booleans(), max_size=2))
    def start(self, n: int, committing: list[bool]) -> None:
        """Start up to n sequences decoding; by default they stop committing (the case the
        pocket serves), unless `committing` says otherwise for that sequence."""
        for seq in range(min(n, self.cfg.num_sequences)):
            self._step("create", {"seq": seq, "prompt": []})
            self._step("resume", {"seq": seq})
            if not (seq < len(committing) and committing[seq]):
                self._step("stop_committing", {"seq": seq})

    # ---- API rules -------------------------------------------------------------------------
    def seqs(self) -> st.SearchStrategy[int]:
        return st.integers(0, self.cfg.num_sequences - 1)

    def _decode(self, seq: int) -> None:
        """One decode step: history + 1, capacity covers the in-flight token."""
        s = self._state()
        h = min(s.history[seq] + 1, self.cfg.max_capacity - 1)
        self._step("resize", {"seq": seq, "capacity": max(s.capacity[seq], h + 1), "history": h})

    @rule(data=st.data(), steps=st.integers(1, 8))
    def decode(self, data: st.DataObject, steps: int) -> None:
        """A run of decode steps of one sequence (the pocket's workload)."""
        seq = data.draw(self.seqs(), label="seq")
        for _ in range(steps):
            self._decode(seq)

    def _pocket_of(self, seq: int) -> int:
        lay, s = self.ls.model.layout, self._state()
        return sum(s.pocket[i] != NONE for i in lay.pocket_range(seq))

    def _free_gpu(self, pool_group: int) -> int:
        lay, s = self.ls.model.layout, self._state()
        return sum(s.slot_owner[i] == NONE for i in lay.slot_range(GPU_LEVEL, pool_group))

    RACES = ("pressure", "steal", "burst", "suspend", "close", "fill")

    @rule(data=st.data(), mode=st.sampled_from(("pressure", "steal")))
    def migration_race(self, data: st.DataObject, mode: str) -> None:
        """The hazard the kit exists for, drawn as often as all other races together: a
        parked page is evicted (and its GPU slot maybe taken) before the pop."""
        self.race(data, mode)

    @rule(data=st.data(), mode=st.sampled_from(RACES))
    def race(self, data: st.DataObject, mode: str) -> None:
        """The pocket's hazards as one rule: decode until a page is parked, then
        pressure:  another tenant needs its GPU slot, and the next decode step pops;
        steal:     as pressure, but another sequence takes the freed GPU slot (its next
                   block) before the pop: a blind pop would alias a live slot;
        burst:     this sequence asks for more blocks than the GPU has (OutOfPages);
        suspend:   suspend (the pocket drains) and resume;
        close:     close (the pocket drains);
        fill:      three blocks leave the window at once (the pocket's capacity bound)."""
        cfg = self.cfg
        t = cfg.tokens_per_block
        seq = data.draw(self.seqs(), label="seq")
        # Mostly the pocket's case (committing stopped); sometimes the sequence keeps
        # committing, so the blocks that leave the window are held for a commit instead.
        keep = data.draw(st.integers(0, 3), label="keep committing") == 0
        s = self._state()
        if s.seq_status[seq] != SeqStatus.ACTIVE:
            self._restart(seq, [])
        if self._state().commit_state[seq] == CommitState.ALLOWED and not keep:
            self._step("stop_committing", {"seq": seq})
        for _ in range(4 * t + 8):
            if self._pocket_of(seq) or self._state().seq_status[seq] != SeqStatus.ACTIVE:
                break
            self._decode(seq)
        s = self._state()
        cap, h = s.capacity[seq], s.history[seq]
        if mode in ("pressure", "steal"):
            pg = data.draw(st.integers(0, cfg.num_pool_groups - 1), label="pool_group")
            need = min(self._free_gpu(pg) + 1, cfg.slots_per_level[0])
            self._step("pressure", {"level": 0, "pool_group": pg, "slots": need})
            other = (seq + 1) % cfg.num_sequences
            if mode == "steal" and other != seq:
                if self._state().seq_status[other] != SeqStatus.ACTIVE:
                    self._restart(other, [])
                for _ in range(t):  # a block boundary: the other sequence allocates
                    self._decode(other)
            self._decode(seq)
        elif mode == "burst":
            grow = t * (cfg.slots_per_level[0] + 1)
            self._step("resize", {"seq": seq, "capacity": min(cap + grow, cfg.max_capacity),
                                  "history": h})
        elif mode == "suspend":
            self._step("suspend", {"seq": seq})
            self._step("resume", {"seq": seq})
        elif mode == "close":
            self._step("close", {"seq": seq})
        else:
            grown = min(cap + 3 * t, cfg.max_capacity)
            self._step("resize", {"seq": seq, "capacity": grown, "history": h})
            self._step("resize", {"seq": seq, "capacity": grown,
                                  "history": min(h + 3 * t, grown)})

    @rule()
    def decode_batch(self) -> None:
        """Every ACTIVE sequence decodes one step, as in a batch."""
        for seq in range(self.cfg.num_sequences):
            if self._state().seq_status[seq] == SeqStatus.ACTIVE:
                self._decode(seq)

    @rule(data=st.data(), tokens=st.integers(1, 8))
    def retire(self, data: st.DataObject, tokens: int) -> None:
        """History advances without new capacity: blocks leave the window and nothing pops,
        so the pocket fills up (and its capacity bound is exercised)."""
        seq = data.draw(self.seqs(), label="seq")
        s = self._state()
        self._step("resize", {"seq": seq, "capacity": s.capacity[seq],
                              "history": min(s.history[seq] + tokens, s.capacity[seq])})

    @rule(data=st.data(), grow=st.integers(-8, 8), advance=st.integers(0, 3))
    def resize(self, data: st.DataObject, grow: int, advance: int) -> None:
        """Grow, or shrink by up to eight tokens (several blocks at once), and advance."""
        seq = data.draw(self.seqs(), label="seq")
        s = self._state()
        h = min(s.history[seq] + advance, self.cfg.max_capacity)
        cap = max(0, min(s.capacity[seq] + grow, self.cfg.max_capacity))
        self._step("resize", {"seq": seq, "capacity": max(cap, h), "history": h})

    @rule(data=st.data())
    def suspend_while_committing(self, data: st.DataObject) -> None:
        """A sequence that keeps committing decodes past its window (the blocks that leave
        it are held for a commit, not parked), then suspends and resumes: the held stale
        blocks must stay held and unmapped."""
        seq = data.draw(self.seqs(), label="seq")
        self._restart(seq, [])
        window = max((lc.window or 0) for lc in self.cfg.life_cycles)
        for _ in range(window + 2 * self.cfg.tokens_per_block):
            self._decode(seq)
        self._step("suspend", {"seq": seq})
        self._step("resume", {"seq": seq})

    @rule(data=st.data(), blocks=st.integers(2, 4))
    def jump(self, data: st.DataObject, blocks: int) -> None:
        """Capacity and history jump together by several blocks in one resize: new blocks
        are born already out of the window (no page for them), others are allocated."""
        seq = data.draw(self.seqs(), label="seq")
        if self._state().seq_status[seq] != SeqStatus.ACTIVE:
            self._restart(seq, [])
        s, t = self._state(), self.cfg.tokens_per_block
        cap = min(s.capacity[seq] + blocks * t, self.cfg.max_capacity)
        self._step("resize", {"seq": seq, "capacity": cap,
                              "history": min(s.history[seq] + blocks * t, cap)})

    @rule(data=st.data(), blocks=st.integers(2, 3))
    def grow_and_shrink(self, data: st.DataObject, blocks: int) -> None:
        """Grow by several blocks, then give them all back in one resize (a shrink of
        several blocks at once, last block first)."""
        seq = data.draw(self.seqs(), label="seq")
        if self._state().seq_status[seq] != SeqStatus.ACTIVE:
            self._restart(seq, [])
        s = self._state()
        cap, h = s.capacity[seq], s.history[seq]
        self._step("resize", {"seq": seq, "history": h, "capacity": min(
            cap + blocks * self.cfg.tokens_per_block, self.cfg.max_capacity)})
        self._step("resize", {"seq": seq, "capacity": cap, "history": h})

    @rule(data=st.data())
    def reuse_prefix(self, data: st.DataObject) -> None:
        """Replace a sequence by one whose prompt starts with another's committed tokens:
        close (draining its pocket), create with prefix reuse, resume. When nothing is
        committed yet, another sequence first commits a two-block prompt."""
        cfg = self.cfg
        seq = data.draw(self.seqs(), label="seq")
        tokens = self._state().tokens
        source = max(range(cfg.num_sequences), key=lambda q: len(tokens[q]))
        if len(tokens[source]) < cfg.tokens_per_block and cfg.num_sequences > 1:
            source = (seq + 1) % cfg.num_sequences
            n = 2 * cfg.tokens_per_block
            prompt = data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n),
                               label="prompt")
            self._restart(source, prompt)
            self._step("resize", {"seq": source, "capacity": n, "history": 0})
            self._step("commit", {"seq": source, "n": n})
        prompt = list(self._state().tokens[source]) + data.draw(
            st.lists(st.integers(0, 1), max_size=2), label="suffix")
        self._restart(seq, prompt)

    def _restart(self, seq: int, prompt: list[int]) -> None:
        if self._state().seq_status[seq] in (SeqStatus.ACTIVE, SeqStatus.SUSPENDED):
            self._step("close", {"seq": seq})
        self._step("create", {"seq": seq, "prompt": prompt})
        self._step("resume", {"seq": seq})

    @rule(data=st.data(), blocks=st.integers(1, 3))
    def deep_cascade(self, data: st.DataObject, blocks: int) -> None:
        """The cascade's deepest path: the other sequences' HELD pages are pushed down by
        pressure until the lower levels are full of them, one sequence leaves an
        unreferenced committed page on GPU, and GPU pressure then evicts it. Room below
        cannot be made (the lower queues hold only HELD pages, and the last level never
        evicts those), so the nested make-room is rolled back and the victim is dropped
        instead; with a partial fill it migrates, or the whole call fails."""
        cfg = self.cfg
        t = cfg.tokens_per_block
        victim = data.draw(self.seqs(), label="seq")
        pg = data.draw(st.integers(0, cfg.num_pool_groups - 1), label="pool_group")
        for q in range(cfg.num_sequences):
            if q == victim:
                continue
            self._restart(q, [])
            self._step("resize", {"seq": q, "capacity": blocks * t, "history": 0})
            self._step("suspend", {"seq": q})
            for level in range(cfg.last_level):  # push its pages down, level by level
                self._step("pressure", {"level": level, "pool_group": pg,
                                        "slots": cfg.slots_per_level[level]})
        self._restart(victim, [])
        self._step("resize", {"seq": victim, "capacity": t, "history": 0})
        self._step("commit", {"seq": victim, "n": t})
        self._step("close", {"seq": victim})
        self._step("pressure", {"level": 0, "pool_group": pg, "slots": cfg.slots_per_level[0]})

    def _queued(self, level: int, pool_group: int) -> int:
        """Pages queued for eviction at (level, pool group), per the model."""
        s, cfg = self._state(), self.cfg
        return sum(1 for p in range(self.ls.model.layout.pages)
                   if s.alive[p] and s.queued[p] and s.level[p] == level
                   and cfg.pool_group_of(s.lc[p]) == pool_group)

    def _evict_everything(self) -> None:
        """Pressure on every (level, pool group), top down, for all its free and evictable
        slots: what can move down moves, and the last level drops what it can."""
        cfg = self.cfg
        for level in range(cfg.num_levels):
            for pg in range(cfg.num_pool_groups):
                free = sum(self._state().slot_owner[i] == NONE
                           for i in self.ls.model.layout.slot_range(level, pg))
                self._step("pressure", {"level": level, "pool_group": pg, "slots": min(
                    free + self._queued(level, pg), cfg.slots_per_level[level])})

    @rule(data=st.data(), mode=st.sampled_from(
        ("recommit dropped block", "resume into a full GPU", "pass", "pass", "pass", "pass")))
    def node_or_load_back(self, data: st.DataObject, mode: str) -> None:
        """Two paths the other rules reach too rarely. One rule that acts in a third of its
        draws, so the other rules keep their share of a short campaign's steps."""
        if mode == "pass":
            return
        if mode == "recommit dropped block":
            self.recommit_dropped_block(data)
        else:
            self.resume_into_full_gpu(data)

    def recommit_dropped_block(self, data: st.DataObject) -> None:
        """A committed block leaves the window and its pages are dropped while the sequence
        that committed it still refers to its prefix-tree node (the node outlives its
        pages); another sequence then commits the same tokens, onto that node."""
        cfg = self.cfg
        t = cfg.tokens_per_block
        seq = data.draw(self.seqs(), label="seq")
        other = (seq + 1) % cfg.num_sequences
        self._restart(seq, [])
        self._step("resize", {"seq": seq, "capacity": t, "history": 0})
        self._step("commit", {"seq": seq, "n": t})
        window = max((lc.window or 0) for lc in cfg.life_cycles)
        h = min(t + window - 1, cfg.max_capacity - 1)  # block 0 is out of every window
        self._step("resize", {"seq": seq, "capacity": h + 1, "history": h})
        self._evict_everything()
        if other != seq:
            prompt = list(self._state().tokens[seq][:t])
            self._restart(other, prompt)
            s = self._state()
            self._step("resize", {"seq": other, "capacity": s.committed_tokens[other] + t,
                                  "history": s.history[other]})
            self._step("commit", {"seq": other, "n": t})

    def resume_into_full_gpu(self, data: st.DataObject) -> None:
        """A suspended sequence's block is pushed below; another sequence fills the GPU of
        every pool group and suspends (its pages evictable); the first resumes, so making
        room for its load-back evicts in every pool group at once. (One block: the level
        below keeps room for the pages the load-back evicts.)"""
        cfg = self.cfg
        t = cfg.tokens_per_block
        seq = data.draw(self.seqs(), label="seq")
        other = (seq + 1) % cfg.num_sequences
        for q in range(cfg.num_sequences):  # no page of the others is locked; the filler's
            status = self._state().seq_status[q]  # are gone, so the level below has room
            if q == other and q != seq and status in (SeqStatus.ACTIVE, SeqStatus.SUSPENDED):
                self._step("close", {"seq": q})
            elif q != seq and status == SeqStatus.ACTIVE:
                self._step("suspend", {"seq": q})
        self._restart(seq, [])
        self._step("resize", {"seq": seq, "capacity": t, "history": 0})
        self._step("suspend", {"seq": seq})
        self._evict_everything()
        if other != seq:
            per_block = Counter(lc.pool_group for lc in cfg.life_cycles)
            fill = min(cfg.slots_per_level[GPU_LEVEL] // n for n in per_block.values())
            self._restart(other, [])
            self._step("resize", {"seq": other, "capacity": min(fill * t, cfg.max_capacity),
                                  "history": 0})
            self._step("suspend", {"seq": other})
        self._step("resume", {"seq": seq})

    # ---- the speed structures' rare paths, with live entries ---------------------------
    CHURN_CYCLES = 40  # enough for a heap of a few live entries to outgrow its bound

    @rule(data=st.data(), mode=st.sampled_from(("churn", "pass", "pass")))
    def churn_queue(self, data: st.DataObject, mode: str) -> None:
        """An eviction queue's heap rebuilt while entries are live (its lazy garbage
        outgrows the bound): another sequence's committed blocks, closed, stay queued
        (DROPPABLE, live), and one sequence's pages leave and re-enter the GPU queue over
        and over: suspend and resume (HELD pages are evictable above the last level), or
        on one level create with that prefix and close. One rule that acts in a third of
        its draws (the churn is long)."""
        if mode == "pass":
            return
        cfg = self.cfg
        t = cfg.tokens_per_block
        seq = data.draw(self.seqs(), label="seq")
        other = (seq + 1) % cfg.num_sequences
        per_group = Counter(lc.pool_group for lc in cfg.life_cycles)
        k = max(1, min(3, min(cfg.slots_per_level[GPU_LEVEL] // n for n in per_group.values())
                       - 1))
        self._restart(other, [])
        self._step("resize", {"seq": other, "capacity": min(k * t, cfg.max_capacity),
                              "history": 0})
        self._step("commit", {"seq": other, "n": min(k * t, cfg.max_capacity)})
        prompt = list(self._state().tokens[other])
        self._step("close", {"seq": other})
        queues = [q for level in self.ls.impl.storage.queues for q in level]
        before = sum(q.compactions for q in queues)
        if cfg.num_levels > 1:
            self._restart(seq, [])
            self._step("resize", {"seq": seq, "capacity": min(k * t, cfg.max_capacity),
                                  "history": 0})
        for _ in range(self.CHURN_CYCLES):
            if sum(q.compactions for q in queues) > before:
                break
            if cfg.num_levels > 1:
                self._step("suspend", {"seq": seq})
                self._step("resume", {"seq": seq})
            else:
                if self._state().seq_status[seq] in (SeqStatus.ACTIVE, SeqStatus.SUSPENDED):
                    self._step("close", {"seq": seq})
                self._step("create", {"seq": seq, "prompt": prompt})

    # ---- every guarded action from every guarding state (`guards.py`) ------------------
    @rule(data=st.data(), mode=st.sampled_from(("sweep", "pass")))
    def guard_sweep(self, data: st.DataObject, mode: str) -> None:
        """Every guarded API action tried from each guarding state this configuration can
        have (`guards.allowed_states`), states and actions in a drawn order: drive a
        sequence into the state, then try the actions one by one, driving it back (once)
        when an action moved it. Acts in half of its draws (a sweep is long)."""
        if mode == "pass":
            return
        targets = data.draw(st.permutations(guards.allowed_states(self.cfg)), label="states")
        actions = data.draw(st.permutations(guards.ACTIONS), label="actions")
        # A FREE sequence is met only before its first create: first, with create last.
        targets.sort(key=lambda g: g[0] != "FREE")
        for goal in targets:
            seq = self._seq_for(goal, data)
            if seq is None:
                continue
            drives = 0
            for action in (sorted(actions, key=lambda a: a == "create") if goal[0] == "FREE"
                           else actions):
                if self._guard_state(seq) != goal:
                    if drives == 2 or not self._drive(seq, goal):
                        break
                    drives += 1
                self._try_guarded(action, seq)

    def _guard_state(self, seq: int) -> guards.State4:
        return guards.seq_state(self.ls.model.layout, self._state(), seq)

    def _seq_for(self, target: guards.State4, data: st.DataObject) -> int | None:
        """The sequence to drive: for FREE one never created (none left: None)."""
        if target[0] == "FREE":
            free = [q for q in range(self.cfg.num_sequences)
                    if self._state().seq_status[q] == SeqStatus.FREE]
            return free[0] if free else None
        return data.draw(self.seqs(), label="seq")

    def _drive(self, seq: int, target: guards.State4) -> bool:
        """Drive `seq` into `target` (status, commit state, pocket, parked); True when it
        got there."""
        status, commit, pocket, parked = target
        cfg, t = self.cfg, self.cfg.tokens_per_block
        if status == "FREE":
            return self._guard_state(seq) == target
        if status == "CLOSED":
            if self._state().seq_status[seq] == SeqStatus.FREE:
                self._step("create", {"seq": seq, "prompt": []})
            self._step("close", {"seq": seq})
            return self._guard_state(seq) == target
        self._restart(seq, [])
        if commit == guards.STOPPED:
            self._step("stop_committing", {"seq": seq})
        if pocket == guards.FULL:
            # Every block of a full pocket's moment at once, then the history jumps: a
            # pocket's worth of blocks leaves the window together (a decode step would pop
            # the pocket for its new block first).
            most = max(guards.fill_blocks(cfg, lc) for lc in cfg.life_cycles if lc.is_swa)
            for blocks in range(min(most + 1, cfg.max_blocks), cfg.pocket.capacity, -1):
                self._step("resize", {"seq": seq, "capacity": blocks * t, "history": 0})
                if self._state().capacity[seq] == blocks * t:
                    self._step("resize", {"seq": seq, "capacity": blocks * t,
                                          "history": blocks * t - 1})
                    break
        if pocket != guards.EMPTY:
            for _ in range(4 * t + 8):  # decode until a page is parked
                if self._pocket_of(seq) or self._state().seq_status[seq] != SeqStatus.ACTIVE:
                    break
                self._decode(seq)
            if parked == guards.WITHOUT_SLOT:
                for extra in range(1, 4):  # GPU pressure until a parked page is moved
                    if self._guard_state(seq)[3] != guards.WITH_SLOT:
                        break
                    for pg in range(cfg.num_pool_groups):
                        self._step("pressure", {"level": 0, "pool_group": pg, "slots": min(
                            self._free_gpu(pg) + extra, cfg.slots_per_level[0])})
        if status == "SUSPENDED":
            self._step("suspend", {"seq": seq})
        return self._guard_state(seq) == target

    def _try_guarded(self, action: str, seq: int) -> None:
        """One guarded action on `seq`, with ordinary parameters (a decode step, a block's
        worth of tokens, an empty prompt)."""
        if action == "resize":
            self._decode(seq)
        elif action == "commit":
            s = self._state()
            room = s.capacity[seq] - s.committed_tokens[seq]
            self._step("commit", {"seq": seq, "n": min(self.cfg.tokens_per_block, room)
                                  if room > 0 else 1})
        elif action == "create":
            self._step("create", {"seq": seq, "prompt": []})
        else:
            self._step(action, {"seq": seq})

    @rule(data=st.data(), prompt=st.lists(st.integers(0, 1), max_size=6))
    def create(self, data: st.DataObject, prompt: list[int]) -> None:
        self._step("create", {"seq": data.draw(self.seqs(), label="seq"), "prompt": prompt})

    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        self._step("resume", {"seq": data.draw(self.seqs(), label="seq")})

    @rule(data=st.data(), n=st.integers(1, 4))
    def commit(self, data: st.DataObject, n: int) -> None:
        seq = data.draw(self.seqs(), label="seq")
        s = self._state()
        room = s.capacity[seq] - s.committed_tokens[seq]
        self._step("commit", {"seq": seq, "n": min(n, room) if room > 0 else n})

    @rule(data=st.data())
    def stop_committing(self, data: st.DataObject) -> None:
        self._step("stop_committing", {"seq": data.draw(self.seqs(), label="seq")})

    def _fullest_pocket(self) -> int:
        return max(range(self.cfg.num_sequences), key=self._pocket_of)

    @rule(data=st.data(), fullest=st.booleans())
    def suspend(self, data: st.DataObject, fullest: bool) -> None:
        """Suspend a sequence; half the time the one with the fullest pocket."""
        seq = self._fullest_pocket() if fullest else data.draw(self.seqs(), label="seq")
        self._step("suspend", {"seq": seq})

    @rule(data=st.data(), fullest=st.booleans())
    def close(self, data: st.DataObject, fullest: bool) -> None:
        """Close a sequence; half the time the one with the fullest pocket."""
        seq = self._fullest_pocket() if fullest else data.draw(self.seqs(), label="seq")
        self._step("close", {"seq": seq})

    # ---- any action of the table, with parameters drawn by kind ----------------------------
    @rule(data=st.data())
    def any_action(self, data: st.DataObject) -> None:
        """One action of the API table (`model.api.API`) with parameters drawn from their
        kinds: an action added to the table is fuzzed without a rule of its own, and
        out-of-range values exercise both sides' usage errors."""
        action = data.draw(st.sampled_from(sorted(alphabet())), label="action")
        params = {p.name: data.draw(self._values(p.kind), label=p.name)
                  for p in alphabet()[action]}
        self._step(action, params)

    def _values(self, kind: str) -> st.SearchStrategy[Any]:
        """Mostly legal values of a parameter kind; sometimes one just out of range (-1, or
        one past the end), which both sides must refuse with the same usage error."""
        legal = self._legal_values(kind)
        if kind == "tokens":
            return legal
        return st.one_of(legal, st.sampled_from([-1, self._past_end(kind)]))

    def _past_end(self, kind: str) -> int:
        cfg = self.cfg
        return {"seq": cfg.num_sequences, "length": cfg.max_capacity + 1, "count": 10_000,
                "level": cfg.num_levels, "pool_group": cfg.num_pool_groups,
                "slots": max(cfg.slots_per_level) + 1, "stream": cfg.num_sequences + 1}[kind]

    def _legal_values(self, kind: str) -> st.SearchStrategy[Any]:
        cfg = self.cfg
        if kind == "seq":
            return self.seqs()
        if kind == "tokens":
            return st.lists(st.integers(0, 1), max_size=6)
        if kind == "length":
            return st.integers(0, cfg.max_capacity)
        if kind == "count":
            return st.integers(1, 4)
        if kind == "level":
            return st.integers(0, cfg.last_level)
        if kind == "pool_group":
            return st.integers(0, cfg.num_pool_groups - 1)
        if kind == "slots":
            return st.integers(0, max(cfg.slots_per_level))
        if kind == "stream":
            return st.integers(0, cfg.num_sequences)
        raise ValueError(f"no strategy for parameter kind {kind!r}")

    # ---- environment rules: background work and faults ---------------------------------------
    @rule(data=st.data(), slots=st.integers(1, 3))
    def pressure(self, data: st.DataObject, slots: int) -> None:
        level = data.draw(st.integers(0, self.cfg.last_level), label="level")
        group = data.draw(st.integers(0, self.cfg.num_pool_groups - 1), label="pool_group")
        self._step("pressure", {"level": level, "pool_group": group, "slots": slots})

    @rule(data=st.data())
    def advance(self, data: st.DataObject) -> None:
        stream = data.draw(st.integers(0, self.cfg.num_sequences), label="stream")
        self._step("advance", {"stream": stream})

    @rule()
    def fail_allocation(self) -> None:
        self._step("fail_allocation", {})

    @rule()
    def fail_copy(self) -> None:
        self._step("fail_copy", {})

    @invariant()
    def sequences_known(self) -> None:
        # Cheap sanity: the harness's id map only names sequences the model created.
        s = self._state()
        for seq in self.ls.impl_id:
            assert s.seq_status[seq] != SeqStatus.FREE

    def teardown(self) -> None:
        # Guide generation toward full pockets (target() may be called once per example).
        target(float(self.max_pocket), label="max pocket occupancy")
        target(float(len(self.reached)), label="distinct rare states")
        if self.failed or "ls" not in vars(self):
            return  # the step's own failure is the one to report (or nothing ran)
        try:
            self.ls.finish()
        except Divergence as exc:
            STATS.failure = (list(self.trace), str(exc))
            STATS.failure_config, STATS.failure_event_log = self.cfg, self.check_event_log
            raise
        finally:
            if self.ls.impl.backend.name == "cupy":
                self.ls.impl.synchronize()


def machine_for(cfg: KVConfig, backend: str = "numpy", eager: bool = False,
                event_log_every: int = 0, event_log_offset: int = 0, race_check: bool = True,
                device_mirror: bool = True) -> type[LockstepMachine]:
    """A machine class bound to a configuration (Hypothesis machines take no arguments)."""
    return type("LockstepMachine", (LockstepMachine,), {
        "cfg": cfg, "backend": backend, "eager": eager, "event_log_every": event_log_every,
        "event_log_offset": event_log_offset, "race_check": race_check,
        "device_mirror": device_mirror, "__module__": __name__,
    })


def drawn_machine_for(policies: tuple[PocketPolicy, ...], backend: str = "numpy",
                      eager: bool = False, event_log_every: int = 0, event_log_offset: int = 0,
                      race_check: bool = True, device_mirror: bool = True
                      ) -> type[LockstepMachine]:
    """A machine whose every example first draws its configuration (`configs.kv_configs`)
    under one of `policies`: the configuration is part of the example, so Hypothesis
    explores shapes no preset has and shrinks a failing configuration too."""

    class DrawnConfigMachine(LockstepMachine):
        draws_config = True

        @initialize(cfg=kv_configs(policies), n=st.integers(0, 2),
                    committing=st.lists(st.booleans(), max_size=2))
        def start(self, cfg: KVConfig, n: int, committing: list[bool]) -> None:
            self._open(cfg)
            LockstepMachine.start(self, n, committing)

    DrawnConfigMachine.cfg = KVConfig()  # a stand-in until `start` draws the example's own
    DrawnConfigMachine.backend = backend
    DrawnConfigMachine.eager = eager
    DrawnConfigMachine.event_log_every = event_log_every
    DrawnConfigMachine.event_log_offset = event_log_offset
    DrawnConfigMachine.race_check = race_check
    DrawnConfigMachine.device_mirror = device_mirror
    DrawnConfigMachine.__module__ = __name__
    return DrawnConfigMachine
