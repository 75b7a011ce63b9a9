"""`kvpocket trace check`: validate an integrator's event log against the model alone.

Each event (see `trace.parse_events`, docs/adapter-guide.md) is replayed on `Model` with
a chooser that maps the log's labels to the model's candidates. The first event whose
choice the model rejects (or that the log lacks, or leaves unused), whose result
differs from the model's, whose observed post-state differs, or after which an invariant
is violated ends the check, with its line number and the history of every earlier event
that touched the same slots.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kvpocket.model.config import NONE, KVConfig, SeqStatus, num_blocks_for
from kvpocket.model.errors import ChoiceRejected, GuardViolation, MissingChoice
from kvpocket.model.executor import RecordedChooser, Step
from kvpocket.model.machine import Model
from kvpocket.model.state import State
from kvpocket.verify.traces.trace import NO_RESULT, Event, EventStream, ParsedEventLog

Where = tuple[int, int, int]
HISTORY = 12  # earlier events shown per report (and kept per location)
PROGRESS_EVERY = 5000


class ConfigTooSmall(Exception):
    """The log needs more sequence slots than the configuration has (a usage error)."""


@dataclass
class TraceVerdict:
    ok: bool
    events: int  # events checked (including the failing one)
    line: int | None = None
    kind: str = ""
    report: str = ""


@dataclass
class _Past:
    line: int
    text: str
    touched: list[tuple[str, set[Where]]] = field(default_factory=list)  # (step, locations)


class _Failure(Exception):
    def __init__(self, kind: str, lines: list[str], focus: set[Where]) -> None:
        super().__init__(kind)
        self.kind = kind
        self.lines = lines
        self.focus = focus


def loc(w: Where) -> str:
    return f"[{w[0]}, {w[1]}, {w[2]}]"


class EventChecker:
    """Replays an event log on the model, one event at a time."""

    def __init__(self, cfg: KVConfig) -> None:
        self.cfg = cfg
        self.model = Model(cfg)
        self.slot_of: dict[int, int] = {}  # the log's sequence id -> model sequence slot
        # The last HISTORY events that touched each location (all a report can show), so a
        # long log is checked in bounded memory; `touches` counts every event per location.
        self.past: dict[Where, deque[_Past]] = {}
        self.touches: dict[Where, int] = {}
        self.retired: set[int] = set()  # closed ids whose model slot was reused

    # ---- sequences -------------------------------------------------------------------
    def _new_slot(self, ev: Event) -> int:
        s = self.model.state
        for want in (SeqStatus.FREE, SeqStatus.CLOSED):
            for q in range(self.cfg.num_sequences):
                if s.seq_status[q] == want and q not in self._taken():
                    return q
        raise ConfigTooSmall(
            f"line {ev.line}: {ev.describe()} opens more sequences at once than the "
            f"configuration has sequence slots ({self.cfg.num_sequences}); check with a "
            "larger --config")

    def _taken(self) -> set[int]:
        return {q for q in self.slot_of.values()
                if self.model.state.seq_status[q] != SeqStatus.CLOSED}

    # ---- one event --------------------------------------------------------------------
    def step(self, ev: Event) -> None:
        p = ev.params
        seq = p.get("seq")
        if ev.action == "create":
            assert isinstance(seq, int)
            q = self.slot_of.get(seq)
            closed = seq in self.retired or (
                q is not None and self.model.state.seq_status[q] == SeqStatus.CLOSED)
            if closed and ev.result == {"error": "sequence_state"}:
                self._note(ev, [])  # reusing a closed id: refused on the manager's side
                return
            if q is None or closed:
                q = self._new_slot(ev)
                for other, oq in list(self.slot_of.items()):
                    if oq == q:  # a closed sequence whose slot the model reuses
                        self.retired.add(other)
                        del self.slot_of[other]
                self.slot_of[seq] = q
                self.retired.discard(seq)
            self._run(ev, "create", {"seq": q, "prompt": p["prompt"]})
            return
        if seq in self.retired:  # closed earlier; its model slot now serves another id
            if ev.action != "advance":
                closed = None if ev.action == "close" else {"error": "sequence_state"}
                self._expect(ev, closed, "the sequence is CLOSED")
            self._note(ev, [])
            return
        if seq is not None and seq not in self.slot_of:
            self._expect(ev, {"error": "unknown_sequence"}, "the sequence was never created")
            self._note(ev, [])
            return
        params = dict(p)
        if seq is not None:
            params["seq"] = self.slot_of[seq]
        if ev.action == "advance":  # a stream is named by its sequence's id, or "copy"
            stream = p["stream"]
            if stream == "copy":
                params["stream"] = self.cfg.num_sequences
            elif stream in self.slot_of and stream not in self.retired:
                params["stream"] = self.slot_of[stream]
            else:
                self._note(ev, [])  # an unknown stream has no outstanding work
                return
        self._run(ev, ev.action, params)

    def check(self, ev: Event, n: int, name: str = "event log") -> TraceVerdict | None:
        """Check one event (the n-th): None when it agrees with the model, else the
        failing verdict with its report (what `check_events` returns for it)."""
        try:
            self.step(ev)
        except _Failure as f:
            lines = [f"{name}:{ev.line}: {ev.describe()}: {f.kind}", *(f"  {x}" for x in f.lines)]
            hist = self.history(f.focus)
            if f.focus:
                where = ", ".join(loc(w) for w in sorted(f.focus))
                lines.append(f"history of the locations involved ({where}; "
                             "as [level, pool_group, slot]):")
                lines.extend(hist or ["  (no earlier event touched them)"])
            return TraceVerdict(False, n, ev.line, f.kind, "\n".join(lines))
        return None

    def _expect(self, ev: Event, got: object, why: str) -> None:
        if ev.result is not NO_RESULT and ev.result != got:
            raise _Failure("different result", [
                f"the log reports {_show(ev.result)}; the model: {_show(got)} ({why})"], set())

    def _run(self, ev: Event, action: str, params: dict[str, Any]) -> None:
        m = self.model
        script: dict[str, list[object]] | None = None
        if ev.choices is not None:
            script = {}
            for kind, label in ev.choices:
                script.setdefault(kind, []).append(label)
        chooser = RecordedChooser(script, by="label", on_missing="raise")
        pre = m.state
        try:
            result = m.run(action, params, chooser)
        except ChoiceRejected as exc:
            focus = self._label_focus(exc.kind, exc.choice)
            raise _Failure("the model rejects the log's choice", [
                f"the log chose {exc.kind} {_show_label(exc.choice)}; the model's legal "
                f"{exc.kind} choices here: {_show_labels(exc.legal)}",
                *self._partial(pre, m.last_steps)],
                focus | self._touched_all(pre, m.last_post, m.last_steps)) from None
        except MissingChoice as exc:
            raise _Failure("the log lacks a choice the model makes", [
                f"the model picks a {exc.kind} here (legal: {_show_labels(exc.labels)}), "
                f"but the event records no more {exc.kind} choices",
                *self._partial(pre, m.last_steps)],
                self._touched_all(pre, m.last_post, m.last_steps)) from None
        except GuardViolation as exc:
            raise _Failure("the model failed (a guard inside an API program)", [str(exc)],
                           self._touched_all(pre, m.last_post, m.last_steps)) from None
        value: object = result.value if result.error is None \
            else {"error": result.error.category}
        touched = self._touched(pre, m.state, m.last_steps)
        focus = set().union(*(t for _, t in touched)) if touched else set()
        self._expect(ev, value, "as the model computes it")
        # A call that fails (OutOfPages) may explore more victims before giving up than the
        # model does; only a successful call must use every recorded choice.
        left = chooser.left() if value is not False else {}
        if left:
            shown = "; ".join(f"{k}: {_show_labels(v)}" for k, v in left.items())
            raise _Failure("the log records choices the model does not make",
                           [f"unused: {shown}", *self._partial(pre, m.last_steps)], focus)
        if ev.observed is not None:
            self._check_observed(ev, focus)
        bad = m.violations("api")
        if bad:
            raise _Failure("an invariant is violated after this event", [
                *(f"{i.name}: {i.statement}" for i in bad),
                "the model's page actions in this event:", *(f"  {d}" for d, _ in touched)],
                focus)
        self._note(ev, touched if value is not False else [], value)

    def _note(self, ev: Event, touched: list[tuple[str, set[Where]]],
              value: object = NO_RESULT) -> None:
        if not touched:
            return  # an event that touched no location is in no location's history
        shown = ev.result if ev.result is not NO_RESULT else value
        text = ev.describe() + ("" if shown is NO_RESULT else f" -> {_show(shown)}")
        past = _Past(ev.line, text, touched)
        for w in set().union(*(locs for _, locs in touched)):
            self.past.setdefault(w, deque(maxlen=HISTORY)).append(past)
            self.touches[w] = self.touches.get(w, 0) + 1

    # ---- observed state ---------------------------------------------------------------
    def _check_observed(self, ev: Event, focus: set[Where]) -> None:
        obs = ev.observed or {}
        m, s, lay = self.model, self.model.state, self.model.layout
        diffs: list[str] = []
        for level, pg, n in obs.get("free", []):
            if not (0 <= level < self.cfg.num_levels and 0 <= pg < self.cfg.num_pool_groups):
                diffs.append(f"free slots at level {level}, pool group {pg}: no such pool")
                continue
            want = sum(1 for i in lay.slot_range(level, pg) if s.slot_owner[i] == NONE)
            if want != n:
                diffs.append(f"free slots at level {level}, pool group {pg}: log {n}, "
                             f"model {want}")
        seq = ev.params.get("seq")
        q = self.slot_of.get(seq) if isinstance(seq, int) else None
        if q is not None:
            status = SeqStatus(s.seq_status[q]).name
            if "status" in obs and obs["status"] != status:
                diffs.append(f"status of sequence {seq}: log {obs['status']}, model {status}")
            nb = num_blocks_for(s.capacity[q], self.cfg.tokens_per_block)
            for lc, row in enumerate(obs.get("index", [])):
                want_row = [s.index[lay.entry_ix(m.ops, q, lc, o)] for o in range(nb)] \
                    if lc < lay.lcs else None
                if want_row != row:
                    diffs.append(f"page index of sequence {seq}, life cycle {lc}: log {row}, "
                                 f"model {want_row}")
            for lc, row in enumerate(obs.get("pocket", [])):
                want_pocket = [list(self._where(s, pg_)) for pg_ in self._pocket(s, q, lc)] \
                    if lc < lay.lcs else None
                if want_pocket != row:
                    diffs.append(f"pocket of sequence {seq}, life cycle {lc}: log {row}, "
                                 f"model {want_pocket}")
        if diffs:
            raise _Failure("the observed post-state differs from the model's", diffs, focus)

    def _pocket(self, s: State, q: int, lc: int) -> list[int]:
        lay = self.model.layout
        ids = [s.pocket[lay.pocket_ix(self.model.ops, q, lc, k)] for k in range(lay.pocket_cap)]
        return [p for p in ids if p != NONE]

    # ---- locations ----------------------------------------------------------------------
    def _where(self, s: State, p: int) -> Where:
        return (int(s.level[p]), self.cfg.pool_group_of(s.lc[p]), int(s.slot[p]))

    def _touched(self, pre: State, post: State, steps: list[Step]
                 ) -> list[tuple[str, set[Where]]]:
        out: list[tuple[str, set[Where]]] = []
        lay, ops = self.model.layout, self.model.ops
        for st in steps:
            prm = st.params
            locs: set[Where] = set()
            page = prm.get("page")
            if st.action in ("pop", "drain"):
                page = pre.pocket[lay.pocket_ix(ops, prm["seq"], prm["lc"], prm["k"])]
            if page is not None and page != NONE:
                for s in (pre, post):
                    if s.alive[page] and s.slot[page] >= 0:
                        locs.add(self._where(s, page))
            if st.action == "allocate":
                locs.add((0, self.cfg.pool_group_of(prm["lc"]), prm["slot"]))
            if st.action in ("evict_begin", "onboard_begin") and page is not None:
                dst = pre.level[page] + 1 if st.action == "evict_begin" else 0
                locs.add((int(dst), self.cfg.pool_group_of(pre.lc[page]), prm["dst_slot"]))
            if locs:
                out.append((f"{st.action} {' '.join(loc(w) for w in sorted(locs))}", locs))
        return out

    def _touched_all(self, pre: State, post: State, steps: list[Step]) -> set[Where]:
        return set().union(*(t for _, t in self._touched(pre, post, steps)))

    def _label_focus(self, kind: str, label: object) -> set[Where]:
        if isinstance(label, tuple) and len(label) == 3:
            return {(int(label[0]), int(label[1]), int(label[2]))}
        if isinstance(label, int):  # a slot id: at any level and pool group
            return {(lv, g, label) for lv in range(self.cfg.num_levels)
                    for g in range(self.cfg.num_pool_groups)}
        return set()

    def _partial(self, pre: State, steps: list[Step]) -> list[str]:
        if not steps:
            return []
        shown = [f"{d}" for d, _ in self._touched(pre, pre, steps)]
        return ["the model's page actions in this event before it stopped:",
                *(f"  {x}" for x in shown or [st.action for st in steps])]

    def history(self, focus: set[Where], limit: int = HISTORY) -> list[str]:
        """The earlier events that touched a location in `focus` (the last `limit`)."""
        found = {id(p): p for w in focus for p in self.past.get(w, ())}
        events = sorted(found.values(), key=lambda p: p.line)
        entries = [[f"  line {p.line}: {p.text}",
                    *(f"      {d}" for d, locs in p.touched if locs & focus)] for p in events]
        more = len(entries) > limit or any(
            self.touches.get(w, 0) > len(self.past.get(w, ())) for w in focus)
        head = ["  ... and earlier events"] if more else []
        return head + [x for e in entries[-limit:] for x in e]


def check_events(log: ParsedEventLog | EventStream, cfg: KVConfig | None = None,
                 name: str = "event log", progress: Callable[[int], None] | None = None
                 ) -> TraceVerdict:
    """Check every event of `log` (on `cfg`, default the log's own configuration). A
    stream (`open_events`) is checked as it is read, in bounded memory; a malformed line
    or a missing end marker raises `TraceError` when it is reached. `progress` is called
    with the number of events checked, every PROGRESS_EVERY events."""
    checker = EventChecker(cfg or log.config)
    events: Iterable[Event] = log.events if isinstance(log, ParsedEventLog) else log
    n = 0
    for n, ev in enumerate(events, 1):
        if progress is not None and n % PROGRESS_EVERY == 0:
            progress(n)
        verdict = checker.check(ev, n, name)
        if verdict is not None:
            return verdict
    return TraceVerdict(True, n)


def _show(v: object) -> str:
    if v is NO_RESULT:
        return "nothing"
    if isinstance(v, dict) and "error" in v:
        return f"error {v['error']}"
    if v is None or isinstance(v, bool):
        return "null" if v is None else str(v).lower()
    return repr(v)


def _show_label(v: object) -> str:
    if isinstance(v, tuple):
        return loc((int(v[0]), int(v[1]), int(v[2])))
    return str(v)


def _show_labels(vs: list[object]) -> str:
    return "[" + ", ".join(_show_label(v) for v in vs) + "]" if vs else "none"
