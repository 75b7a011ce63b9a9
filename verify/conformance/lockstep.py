"""Run the implementation and the model side by side, one action at a time.

Each step: call the implementation; read the choices it made (slots taken,
victims evicted, pocket entries popped) and feed them to the model's chooser,
translated into the model's names; call the model; then require equal
outcomes, equal abstract states, every invariant on both sides, and a clean
data oracle. Anything else raises `Divergence` with a readable report.
"""

from __future__ import annotations

import io
import traceback
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpocket.impl.backend.numpy_sim import NumpyBackend
from kvpocket.impl.exceptions import RaceError, UnknownLifeCycleError
from kvpocket.impl.kvcache import KVCache
from kvpocket.impl.manager import KVCacheManager
from kvpocket.impl.snapshot import Where, choice_labels, page_locations
from kvpocket.model.config import (
    GPU_LEVEL,
    NONE,
    CommitState,
    KVConfig,
    Order,
    SeqStatus,
    check_fits,
    stale_range,
)
from kvpocket.model.errors import ChoiceRejected
from kvpocket.model.executor import CHOICE_KINDS, RecordedChooser
from kvpocket.model.machine import Model, RunResult
from kvpocket.model.state import State
from kvpocket.verify.conformance.abstraction import (
    Abstract,
    abstract_impl,
    abstract_model,
    diff,
    without_forgotten,
)
from kvpocket.verify.conformance.adapter import (
    Outcome,
    call_impl,
    impl_outcome,
    model_params,
    outcome_of,
)
from kvpocket.verify.conformance.guards import guard_label
from kvpocket.verify.conformance.speed import KIND as SPEED_KIND
from kvpocket.verify.conformance.speed import RARE_PATHS, check_speed_structures, rare_path_events
from kvpocket.verify.conformance.views import (
    counter_differences,
    mirror_differences,
    occupied_slots,
    view_differences,
)
from kvpocket.verify.oracles.data import DecodeOracle
from kvpocket.verify.traces.alphabet import check_params
from kvpocket.verify.traces.trace import Event, EventStream, TraceError
from kvpocket.verify.traces.tracecheck import EventChecker

UNUSED_ID_BASE = 1_000_000  # implementation id used for a model slot never created
RACE = "race detector: accesses not ordered"  # the Divergence kind of a race found
MIRROR = "device mirror: a page table differs"  # ... of a kernel's table that disagrees
# The checks an example may run besides the model comparison (a campaign counts the
# examples that ran each one: `CampaignReport.checks`).
CHECKS = ("data oracle", "views", "event log", "race detector", "device mirror")


class Divergence(AssertionError):
    """The implementation and the model disagree, or an invariant or oracle failed."""

    def __init__(self, step: int, kind: str, lines: list[str]) -> None:
        super().__init__(f"step {step}: {kind}\n" + "\n".join(lines))
        self.step = step
        self.kind = kind
        self.lines = lines


@dataclass
class StepRecord:
    action: str
    params: dict[str, Any]
    model: Outcome
    impl: Outcome
    events: list[str]


class _LineSink(io.StringIO):
    """A text stream that keeps each complete line written to it until taken."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: deque[str] = deque()
        self._part = ""

    def write(self, s: str) -> int:
        *done, self._part = (self._part + s).split("\n")
        self.lines.extend(done)
        return len(s)


class EventLogCheck:
    """The implementation's own event log (`impl/eventlog.py`, written as an integrator's
    manager writes it), each line parsed and checked as it is written, by the checker of
    `kvpocket trace check` on a model of its own."""

    NAME = "event log"

    def __init__(self, cfg: KVConfig) -> None:
        self.sink = _LineSink()
        self.checker = EventChecker(cfg)
        self.checked = 0
        self._events: Iterator[Event] | None = None

    def _rows(self) -> Iterator[tuple[int, bytes]]:
        lineno = 0
        while True:  # read only when a line is waiting (see `take`), so never runs dry
            lineno += 1
            yield lineno, self.sink.lines.popleft().encode("utf-8", "surrogatepass") + b"\n"

    def take(self) -> list[str]:
        """Check the lines written since the last call; the report of the first one that
        is malformed or disagrees with the model, else []."""
        try:
            if self._events is None:  # the header, written when the manager was built
                self._events = iter(EventStream(self._rows(), self.NAME, True))
            while self.sink.lines:
                ev = next(self._events)
                self.checked += 1
                verdict = self.checker.check(ev, self.checked, self.NAME)
                if verdict is not None:
                    return verdict.report.splitlines()
        except TraceError as exc:
            return [f"the implementation wrote a malformed line: {exc}"]
        return []


class Lockstep:
    """Implementation and model in lockstep on one configuration."""

    def __init__(self, cfg: KVConfig, backend: str = "numpy", eager: bool = True,
                 check_data: bool = True, check_event_log: bool = False,
                 race_check: bool = False, device_mirror: bool = False) -> None:
        # too large a configuration is refused before anything is built (never a finding)
        check_fits(cfg, "lockstep" if check_data else "impl")
        self.cfg = cfg
        # kvpocket's implementation is the `lru` engine: its lockstep checks that profile too
        # (victim order, pocket pop order), not just the safety spec
        self.model = Model(cfg.with_order(Order.LRU))
        # The simulator's race detector and device-mirror mode (`numpy_sim.py`); a GPU has
        # neither switch: it always keeps device copies, and races are its own.
        options = {"eager": eager, "race_check": race_check,
                   "device_mirror": device_mirror} if backend == "numpy" else {}
        self.log_check = EventLogCheck(cfg) if check_event_log else None
        self.impl = KVCacheManager(cfg, backend=backend, slot_elems=max(8, cfg.tokens_per_block),
                                   backend_options=options,
                                   event_log=self.log_check.sink if self.log_check else None)
        self.oracle = DecodeOracle(self.impl) if check_data else None
        simulated = isinstance(self.impl.backend, NumpyBackend)
        on = {"data oracle": check_data, "views": True, "event log": check_event_log,
              "race detector": race_check and simulated,
              "device mirror": self.impl.backend.device_copies}
        self.checks = tuple(name for name in CHECKS if on[name])  # what this lockstep runs
        self.impl_id: dict[int, int] = {}  # model slot -> implementation id (current)
        self.handles: dict[int, KVCache] = {}  # model slot -> its current handle (kept)
        self.next_id = 0
        self.written: dict[int, int] = {}  # model slot -> next token position to write
        self.stream_tokens: dict[int, list[int]] = {}
        self.records: list[StepRecord] = []
        self._abstracted: tuple[State, Abstract] | None = None  # (model state, its abstraction)
        self._pageless: list[int] = []  # before a commit: prefix-tree nodes without a page

    # ---- helpers ---------------------------------------------------------------------------
    def seq_of(self) -> dict[int, int]:
        return {v: k for k, v in self.impl_id.items()}

    def _id(self, seq: int) -> int:
        return self.impl_id.get(seq, UNUSED_ID_BASE + seq)

    def _token(self, seq: int, pos: int) -> int:
        toks = self.stream_tokens.setdefault(seq, [])
        while len(toks) <= pos:
            toks.append(self._fresh_token(seq, len(toks)))
        return toks[pos]

    def _fresh_token(self, seq: int, pos: int) -> int:
        if self.oracle is not None:
            return self.oracle.token_for(self._id(seq), pos)
        return (seq * 7919 + pos * 104729) % 50000

    def _translate_choices(self, where: dict[int, Where]) -> RecordedChooser:
        """The implementation's choices as the model's chooser: by label, and a choice the
        model makes that the implementation did not is noted (a divergence)."""
        script: dict[str, list[object]] = {kind: [] for kind in CHOICE_KINDS}
        for kind, label in choice_labels(self.impl.last_choices(), where):
            script[kind].append(label)
        return RecordedChooser(script, by="label", on_missing="note")

    # ---- the step ----------------------------------------------------------------------
    def step(self, action: str, params: dict[str, Any]) -> StepRecord:
        check_params(action, params)
        n = len(self.records)
        where = page_locations(self.impl)
        counters_before = self.impl.counters.total.as_dict()
        tree = self.impl.storage.tree
        self._pageless = [nid for nid, node in tree.nodes.items() if not node.has_page()] \
            if action == "commit" else []
        occupied_before = occupied_slots(self.impl)
        self.impl.transactions.reset_choices()  # a call rejected before it starts records nothing
        try:
            impl_out = impl_outcome(lambda: call_impl(self, action, params))
        except RaceError as exc:  # unordered accesses: a race on a GPU, whatever the order
            raise Divergence(n, RACE, [f"{action}({_fmt(params)})", str(exc)]) from exc
        except MemoryError:  # the machine ran out, not the implementation: never a finding
            raise
        except Exception as exc:  # not an API error: the implementation broke
            raise Divergence(n, "the implementation crashed", [
                f"{action}({_fmt(params)})", *_traceback_tail(exc)]) from exc
        chooser = self._translate_choices(where)
        self.model.chooser = chooser
        pre_model = self.model.state
        try:
            model_out = outcome_of(self._call_model(action, params))
        except ChoiceRejected as exc:
            raise Divergence(n, "the model rejects the implementation's choice", [
                f"{action}({_fmt(params)}): implementation {impl_out}",
                str(exc), *self._choices_lines()]) from None
        except Exception as exc:  # a guard violation inside the model is a model bug
            raise Divergence(n, "the model failed", [
                f"{action}({_fmt(params)}): implementation {impl_out}",
                *_traceback_tail(exc)]) from exc
        events = self._events(action, params, pre_model, impl_out)
        rec = StepRecord(action, dict(params), model_out, impl_out, events)
        self.records.append(rec)
        if not model_out.same_as(impl_out):
            raise Divergence(n, "different outcomes", [
                f"{action}({_fmt(params)})", f"  model:          {model_out}",
                f"  implementation: {impl_out}", *self._choices_lines()])
        try:  # writing and reading data and the checks call the implementation too
            if model_out.kind == "ok" and self.oracle is not None:
                self._after_success(action, params)
            self.check(n, action, params, pre_model)
            self._check_speed_structures(n, action, params)
            bad_counters = counter_differences(
                counters_before, self.impl.counters.total.as_dict(), self.impl.last_choices(),
                occupied_before, occupied_slots(self.impl))
            if bad_counters:
                raise Divergence(n, "the implementation's counters differ", [
                    f"after {action}({_fmt(params)})", *bad_counters, *self._choices_lines()])
        except (Divergence, MemoryError):
            raise
        except RaceError as exc:  # the oracle's own reads and writes race the manager's
            raise Divergence(n, RACE, [f"after {action}({_fmt(params)})", str(exc)]) from exc
        except Exception as exc:
            raise Divergence(n, "the implementation crashed", [
                f"after {action}({_fmt(params)}), while checking it", *_traceback_tail(exc)]
            ) from exc
        if chooser.unmatched:
            raise Divergence(n, "different choices", [f"{action}({_fmt(params)})",
                                                       *chooser.unmatched,
                                                       *self._choices_lines()])
        if self.log_check is not None:
            bad_log = self.log_check.take()
            if bad_log:
                raise Divergence(n, "the event log disagrees with the model",
                                 [f"after {action}({_fmt(params)})", *bad_log])
        return rec

    def _choices_lines(self) -> list[str]:
        return [f"  implementation choices: {self.impl.last_choices()}",
                f"  model choices:          {self.model.last_choices}"]

    def check(self, n: int, action: str = "", params: dict[str, Any] | None = None,
              before: State | None = None) -> None:
        where = f"after {action}({_fmt(params or {})})"
        # States are immutable values: a step that left the model's state the very same
        # object (a usage error, a no-op) has the abstraction computed last time.
        if self._abstracted is None or self._abstracted[0] is not self.model.state:
            self._abstracted = (self.model.state, abstract_model(self.model))
        seq_of = self.seq_of()
        a_model = without_forgotten(self._abstracted[1], [
            slot for sid, slot in seq_of.items() if sid not in self.impl.seqs])
        a_impl = abstract_impl(self.impl.snapshot(sequences=seq_of), seq_of)
        if a_model != a_impl:
            raise Divergence(n, "abstract states differ", [where, *diff(a_model, a_impl)])
        # The invariants held on the model's state before the step (or a step before would
        # have failed): a step that left it unchanged (a usage error, a no-op) keeps them.
        unchanged = before is not None and self.model.state == before
        bad_model = [] if unchanged else [
            f"{i.name}: {i.statement}" for i in self.model.violations("api")]
        if bad_model:
            changed = []
            if before is not None:
                after = self.model.state
                self.model.state = before
                a_before = abstract_model(self.model)
                self.model.state = after
                changed = ["changed by the step:", *diff(a_before, a_model, ("before", "after"))]
            raise Divergence(n, "model invariant violated", [where, *bad_model, *changed])
        bad_impl = self.impl.check_invariants()
        if bad_impl:
            raise Divergence(n, "implementation invariant violated", [where, *bad_impl])
        bad_query = self._check_queries(n)
        if not unchanged:  # else the internals, so the views, are as the last step checked
            bad_query += view_differences(self.impl, self.cfg, a_model, self.impl_id)
        if bad_query:
            raise Divergence(n, "the implementation's queries differ", [where, *bad_query])
        # What a kernel would read, every step: a missed upload changes nothing in the model.
        bad_mirror = mirror_differences(self.impl, self.cfg, a_model, self.impl_id)
        if bad_mirror:
            raise Divergence(n, MIRROR, [where, *bad_mirror])
        if self.oracle is not None:
            self._collect_data(n, where)

    def _check_speed_structures(self, n: int, action: str, params: dict[str, Any]) -> None:
        """Every structure kept for speed, on both sides, against its plain meaning
        (`speed.py`)."""
        bad = check_speed_structures(self.impl, self.model)
        if bad:
            raise Divergence(n, SPEED_KIND, [f"after {action}({_fmt(params)})", *bad])

    BAD_LIFE_CYCLES: tuple[object, ...] = (-1, True, 1.5, "0")

    def _check_queries(self, n: int) -> list[str]:
        """A sequence handle's read-only queries against the model: each life cycle's stale
        range and pocket size, and a clear error for a life cycle that does not exist (one
        bad value per step, in turn: every value is tried on every query within a few
        steps, without raising dozens of exceptions per step)."""
        s, t = self.model.state, self.cfg.tokens_per_block
        out: list[str] = []
        for seq, sid in self.impl_id.items():
            kv = self.impl.seqs.get(sid)
            if kv is None or s.seq_status[seq] not in (SeqStatus.ACTIVE, SeqStatus.SUSPENDED):
                continue
            for lc, life in enumerate(self.cfg.life_cycles):
                # the same blocks (an empty range may start anywhere: it names none)
                want, got = stale_range(life, s.history[seq], t), kv.stale_range(lc)
                if set(range(*got)) != set(range(*want)):
                    out.append(f"seq {seq} lc {lc}: stale_range {kv.stale_range(lc)}, "
                               f"model {want}")
                if len(kv.pocket_pages(lc)) != self._pocket_size(seq, lc):
                    out.append(f"seq {seq} lc {lc}: pocket_pages {kv.pocket_pages(lc)}, "
                               f"model holds {self._pocket_size(seq, lc)} parked pages")
            bad_values = (*self.BAD_LIFE_CYCLES, self.cfg.num_life_cycles,
                          self.cfg.num_life_cycles + 1)
            for bad in (bad_values[(n + seq) % len(bad_values)],):
                for query in (kv.stale_range, kv.pocket_pages, kv.page_table):
                    try:
                        query(bad)  # type: ignore[arg-type]
                    except UnknownLifeCycleError:
                        continue
                    except Exception as exc:  # any other outcome is the finding
                        out.append(f"{query.__name__}({bad!r}) raised {type(exc).__name__}, "
                                   "not UnknownLifeCycleError")
                        continue
                    out.append(f"{query.__name__}({bad!r}) accepted a life cycle that does "
                               "not exist")
        return out

    def _collect_data(self, n: int, where: str) -> None:
        assert self.oracle is not None
        if self.oracle.missing:
            missing, self.oracle.missing = list(self.oracle.missing), []
            raise Divergence(n, "data oracle: an in-window token has no page", [where, *missing])
        backend = self.impl.backend
        lazy = isinstance(backend, NumpyBackend) and not backend.sim.eager
        # With a harness-driven simulator only the reads that already ran are compared, so
        # checking never runs work out of the interleaving the harness chose.
        bad = self.oracle.collect() if lazy else self.oracle.check()
        if bad:
            raise Divergence(n, "data oracle: wrong data", [where, *(str(b) for b in bad)])

    def finish(self) -> None:
        """Run all outstanding GPU work and check the data it read."""
        if self.oracle is None:
            return
        bad = self.oracle.check()
        if bad:
            raise Divergence(len(self.records), "data oracle: wrong data",
                             ["after running all outstanding work", *(str(b) for b in bad)])

    # ---- the two sides (the adapter's `Harness`) ---------------------------------------
    def _call_model(self, action: str, p: dict[str, Any]) -> RunResult:
        seq = p.get("seq")
        committed = int(self.model.state.committed_tokens[seq]) \
            if isinstance(seq, int) and 0 <= seq < self.cfg.num_sequences else 0
        return self.model.run(action, model_params(self, action, p, committed))

    def handle(self, seq: int) -> KVCache:
        """The slot's current handle, kept as an integrator keeps it (the manager forgets
        the oldest closed handles); a slot never created: the manager's answer."""
        kv = self.handles.get(seq)
        if kv is not None and kv.seq_id == self._id(seq):
            return kv
        return self.impl.get(self._id(seq))

    def keep(self, seq: int, kv: KVCache) -> None:
        self.handles[seq] = kv

    def open_seq(self, seq: int, prompt: list[int]) -> int:
        """A create: a fresh implementation id when the model's slot is free or closed."""
        if seq in range(self.cfg.num_sequences) and self.model.state.seq_status[seq] in (
                SeqStatus.FREE, SeqStatus.CLOSED):
            self.impl_id[seq] = self.next_id
            self.next_id += 1
            self.stream_tokens[seq] = list(prompt)
            self.written[seq] = 0
        return self._id(seq)

    def tokens(self, seq: int, start: int, n: int) -> list[int]:
        return [self._token(seq, pos) for pos in range(start, start + n)]

    def run_stream(self, stream: int) -> None:
        """A stream's queued work runs: the model's stream `num_sequences` is the copy
        stream, any other a sequence's compute stream (none: a slot never created)."""
        if stream == self.cfg.num_sequences:
            self.impl.complete_stream("copy")
        elif stream in self.impl_id and self.impl_id[stream] in self.impl.seqs:
            self.impl.complete_stream(self.impl_id[stream])

    # ---- data --------------------------------------------------------------------------
    def _after_success(self, action: str, p: dict[str, Any]) -> None:
        assert self.oracle is not None
        if action not in ("resize", "resume", "commit", "create"):
            return
        seq = p["seq"]
        kv = self.impl.seqs.get(self._id(seq))
        if kv is None:
            return
        if action == "create":
            self.written[seq] = kv.capacity  # the reused prefix's data is already there
        # A shrink drops written blocks: positions past the capacity must be written again.
        self.written[seq] = min(self.written.get(seq, 0), kv.capacity)
        if kv.status is not SeqStatus.ACTIVE:
            return
        start, end = self.written[seq], kv.capacity
        known = len(self.oracle.tokens.get(kv.seq_id, []))
        need = [self._token(seq, pos) for pos in range(known, end)]
        if need:
            self.oracle.add_tokens(kv.seq_id, need)
        if end > start:
            self.oracle.write(kv, np.arange(start, end))
            self.written[seq] = end
        self.oracle.verify(kv)

    # ---- rare states -------------------------------------------------------------------
    def _events(self, action: str, params: dict[str, Any], pre: State, impl_out: Outcome
                ) -> list[str]:
        s, lay = self.model.state, self.model.layout
        ev: list[str] = []
        steps = [st.action for st in self.model.last_steps]
        choices = [c[0] for c in self.impl.last_choices()]
        if "park" in steps:
            ev.append("parked")
        if "pop" in steps:
            ev.append("popped")
        if any(p != NONE and s.level[p] != GPU_LEVEL for p in s.pocket):
            ev.append("parked page migrated")
        if "drop_parked" in steps:
            ev.append("parked page dropped")
        if action == "resize" and "refuse" in choices:
            ev.append("pop refused")
        if action in ("suspend", "close") and "drain" in steps:
            ev.append(f"pocket drained on {action}")
        if any(pre.pocket[i] != NONE for i in range(len(pre.pocket))) and \
                impl_out.kind == "ok" and impl_out.value is False and action == "resize":
            ev.append("OutOfPages with a non-empty pocket")
        if any(st.action == "evict_begin" and st.params.get("page", -1) >= 0 and
               pre.level[st.params["page"]] > GPU_LEVEL for st in self.model.last_steps):
            ev.append("cascade below host")
        if action == "create" and impl_out.kind == "ok" and s.capacity[params["seq"]] > 0:
            ev.append("prefix reused")
        if impl_out.kind == "ok" and impl_out.value is False and (pre.fault_alloc or pre.fault_copy):
            ev.append("injected failure rolled back")
        # The cascade's deep paths and the pocket's edge cases (issue 12's misses).
        if any(c[0] == "undone" for c in self.impl.last_choices()):
            ev.append("nested make-room rolled back")
        if "drop" in steps:
            ev.append("committed page dropped")
        if action == "resume" and "onboard_begin" in steps:
            ev.append("resumed from a lower level")
        if action == "resume" and impl_out.value is True and "onboard_begin" in steps and any(
                c[0] == "evict" and c[1] == GPU_LEVEL for c in self.impl.last_choices()):
            ev.append("resumed from a lower level into a full GPU")
        tree = self.impl.storage.tree
        if action == "commit" and impl_out.kind == "ok" and any(
                nid in tree.nodes and tree.nodes[nid].has_page() for nid in self._pageless):
            ev.append("committed onto a node whose pages were dropped")
        if action == "resume" and impl_out.value is True and self._holds_stale(params["seq"]):
            ev.append("resumed with blocks held for committing")
        if action == "resize":
            # Unlocks of blocks still inside the capacity: they left the window (not a shrink).
            t = self.cfg.tokens_per_block
            stale = [st.params for st in self.model.last_steps if st.action == "unlock"
                     and st.params["ordinal"] * t < params["capacity"]]
            per_lc = Counter((p["seq"], p["lc"]) for p in stale)
            if any(n >= 2 for n in per_lc.values()):
                ev.append("several blocks left the window at once")
            released = {st.params["page"] for st in self.model.last_steps if st.action == "release"}
            if any(p["page"] in released for p in stale) and any(
                    self._pocket_size(q, c) == lay.pocket_cap for q, c in per_lc):
                ev.append("stale page released at pocket capacity")
            if stale and s.commit_state[params["seq"]] == CommitState.ALLOWED:
                ev.append("stale block held for committing")
            dropped = {st.params["ordinal"] for st in self.model.last_steps
                       if st.action == "release_holder" and st.params["ordinal"] * t
                       >= params["capacity"]}
            if len(dropped) >= 2:
                ev.append("shrunk by several blocks")
        if any(self._pocket_size(q, c) == lay.pocket_cap
               for q in range(lay.seqs) for c in range(lay.lcs)):
            ev.append("pocket full")
        ev += self._coverage_events(action, params, pre)
        return ev

    def _coverage_events(self, action: str, params: dict[str, Any], pre: State) -> list[str]:
        """The speed structures' rare paths run with live entries (`speed.py`), and the
        guard combination the action was tried from (`guards.py`)."""
        ev = rare_path_events(self.impl)
        guard = guard_label(action, self.model.layout, pre, params.get("seq"))
        return [*ev, guard] if guard is not None else ev

    def _holds_stale(self, seq: int) -> bool:
        """An ACTIVE sequence with an entry it holds but does not lock: a block out of the
        window kept for a later commit."""
        lay, s, ops = self.model.layout, self.model.state, self.model.ops
        return any(s.entry[lay.entry_ix(ops, seq, lc, o)] != NONE
                   and not s.entry_locked[lay.entry_ix(ops, seq, lc, o)]
                   for lc in range(lay.lcs) for o in range(lay.blocks))

    def _pocket_size(self, seq: int, lc: int) -> int:
        lay, s = self.model.layout, self.model.state
        if not len(s.pocket):
            return 0
        return sum(1 for i in lay.pocket_range(seq, lc) if s.pocket[i] != NONE)

    def pocket_occupancy(self) -> int:
        return sum(1 for p in self.model.state.pocket if p != NONE)


RARE_STATES: tuple[str, ...] = (
    "parked", "popped", "parked page migrated", "parked page dropped", "pop refused",
    "pocket drained on suspend",
    "pocket drained on close", "OutOfPages with a non-empty pocket", "pocket full",
    "prefix reused", "injected failure rolled back", "cascade below host",
    "nested make-room rolled back", "committed page dropped", "resumed from a lower level",
    "several blocks left the window at once", "stale page released at pocket capacity",
    "stale block held for committing", "resumed with blocks held for committing",
    "shrunk by several blocks", "resumed from a lower level into a full GPU",
    "committed onto a node whose pages were dropped", *RARE_PATHS,
)


def _traceback_tail(exc: BaseException, frames: int = 4) -> list[str]:
    tb = traceback.format_exception(exc)
    return [line.rstrip() for chunk in tb[-frames - 1:] for line in chunk.splitlines()]


def _fmt(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())
