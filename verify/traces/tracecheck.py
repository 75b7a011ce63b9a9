"""`kvpocket trace check`: validate an integrator's event log against the model alone.

Each event (see `trace.parse_events`, docs/adapter-guide.md) is replayed on `Model` with
a chooser that maps the log's labels to the model's candidates. The first event whose
choice the model rejects (or that the log lacks, or leaves unused), whose result
differs from the model's, whose observed post-state differs, or after which an invariant
is violated ends the check, with its line number, the reason and the history of every
earlier event that touched the same slots.

The configuration's `order` is the policy profile: under the safety spec (`any`) the
victim of an eviction, the entry a pop takes and the slot an allocation takes are the
manager's choice. An event that records no `choices` leaves them unknown, so the checker
tries every victim and pocket choice the spec allows, takes the slots the event's observed
page index shows (`observed_slots.py`; every order of them only when that does not fit), and
keeps every model state that fits the event's result and observed fields; the log is
rejected when none does.
More than `MAX_STATES` fitting states (or `MAX_RUNS` tries for one event) is a usage
error: the log must record its choices.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpocket.model.choices import BELOW, DEFAULTED, OPEN, SLOT
from kvpocket.model.config import NONE, KVConfig, Order, SeqStatus, num_blocks_for
from kvpocket.model.errors import ChoiceRejected, GuardViolation, MissingChoice
from kvpocket.model.executor import Candidates, Chooser, RecordedChooser, Step
from kvpocket.model.logic import count_equal
from kvpocket.model.machine import Model
from kvpocket.model.sparse import values_in
from kvpocket.model.state import State, status
from kvpocket.verify.traces.idset import IdRuns
from kvpocket.verify.traces.observed_slots import SLOT_TAKERS, wanted_slots
from kvpocket.verify.traces.trace import NO_RESULT, Event, EventStream, ParsedEventLog

Where = tuple[int, int, int]
HISTORY = 12  # earlier events shown per report (and kept per location)
PROGRESS_EVERY = 5000
MAX_STATES = 64  # model states kept that fit a log without choices so far
MAX_RUNS = 512  # choice sequences tried for one event without choices
# the policy choices the safety spec leaves to the manager, searched where a log leaves
# them out (slots are inferred apart, from the observed slots or the free list)
FREE_KINDS = tuple(k for k in OPEN if k != SLOT)
# choices a log may leave out where the manager did what every manager did before they
# existed (the first option): stop committing on a key clash, reuse the longest prefix
# whose every block is cached
DEFAULTED_KINDS = DEFAULTED
# events that make no choice, by what a verdict calls them
NO_CHOICE = {"advance": "stream completion", "fail_allocation": "injected fault",
             "fail_copy": "injected fault"}
NO_VICTIM = "no evictable page"  # how the model's eviction says it found no victim


class ConfigTooSmall(Exception):
    """The log needs more sequence slots than the configuration has (a usage error)."""


class TooVague(Exception):
    """Without recorded choices, too many model states fit the log (a usage error)."""


# What a verdict counts: the log's claims the model compared (and which it had to take on
# trust because the log does not make them).
COUNTED = ("choices", "results", "free", "status", "index", "pocket")


@dataclass
class TraceVerdict:
    ok: bool
    events: int  # events checked (including the failing one)
    line: int | None = None
    kind: str = ""
    report: str = ""
    compared: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTED, 0))
    without_choices: int = 0  # events that recorded no choices (the model tried them all)
    ambiguous: int = 0  # of those, events after which more than one model state fitted
    order: str = "any"  # the policy profile checked (`KVConfig.order`)
    page_actions: int = 0  # the model's page actions in the runs that fitted (its work)
    # events that are no API call and make no choice: stream completions, injected faults
    no_choice: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """What a valid verdict rests on, in numbers (a zero says what was not checked)."""
        c = self.compared
        observed = sum(c[k] for k in ("free", "status", "index", "pocket"))
        others = ", ".join(_plural(n, noun) for noun, n in self.no_choice.items() if n)
        parts = [f"{_plural(self.events, 'event')} valid under order={self.order}"
                 + (f" (of them {others}, which make no choices)" if others else ""),
                 f"{c['choices']} logged choices legal and used",
                 f"{c['results']} results equal to the model's",
                 f"{observed} observed fields equal to the model's (free {c['free']}, "
                 f"status {c['status']}, index {c['index']}, pocket {c['pocket']})",
                 "every invariant holds after every event"]
        text = "; ".join(parts)
        if self.without_choices:
            text += (f"; {_plural(self.without_choices, 'event')} logged no choices: every "
                     "victim and "
                     f"pocket choice the spec allows was tried ({self.ambiguous} left more "
                     "than one fitting model state)")
        if not observed:
            text += "; no observed state was logged: a wrong slot or page index is only " \
                    "caught when it changes a later result or breaks an invariant"
        return text


class _Lazy:
    """A line of a report, formatted when shown: the history of most events never is."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[], str]) -> None:
        self._make = make

    def __str__(self) -> str:
        return self._make()

    def __format__(self, spec: str) -> str:
        return format(self._make(), spec)


Touched = list[tuple[_Lazy | str, set[Where]]]  # (a page action, the locations it touched)


def _step_text(action: str, locs: set[Where], note: str) -> _Lazy:
    return _Lazy(lambda: f"{action} {' '.join(loc(w) for w in sorted(locs))}{note}")


def _event_text(ev: Event, shown: object) -> _Lazy:
    action, params = ev.action, ev.params
    return _Lazy(lambda: Event.describe_call(action, params)
                 + ("" if shown is NO_RESULT else f" -> {_show(shown)}"))


@dataclass
class _Past:
    line: int
    text: _Lazy
    touched: Touched = field(default_factory=list)  # (step, locations)


class _Failure(Exception):
    def __init__(self, kind: str, lines: list[str], focus: set[Where]) -> None:
        super().__init__(kind)
        self.kind = kind
        self.lines = lines
        self.focus = focus


@dataclass
class _Fit:
    """One way the model ran an event that fits the log: its post-state, what it touched,
    its result, and what of the log it compared."""

    state: State
    touched: Touched
    value: object
    counts: dict[str, int]
    steps: int  # page actions the model ran


class _Trying:
    """A chooser for an event without recorded choices: follows `prefix` (an index into the
    options of each choice, in order), then the first option; `siblings` are the prefixes
    of every other sequence from there (depth first). Victim and pocket options are every
    legal candidate. Slots are taken as `guided` says, or (the search behind it) tried
    among the free slots the event's observed page index shows, then the lowest other
    one: a slot no observation names is interchangeable with any other free one up to
    renaming."""

    def __init__(self, prefix: list[int], seen_slots: set[int], guided: bool = False,
                 wanted: list[int] | None = None) -> None:
        """`guided`: slots add no runs: the i-th slot taken is `wanted[i]` where that is
        free, else the first free one (`observed_slots.py` reads `wanted` off the log)."""
        self.prefix = prefix
        self.seen_slots = seen_slots
        self.guided = guided
        self.wanted = wanted or []
        self.slots_taken = 0
        self.widths: list[int] = []

    def choose(self, kind: str, candidates: Sequence[int], labels: Sequence[object]) -> int:
        options = candidates
        if kind == "slot" and self.guided:
            i, self.slots_taken = self.slots_taken, self.slots_taken + 1
            if i < len(self.wanted):
                want = self.wanted[i]
                found = candidates.find(want, by_label=False) \
                    if isinstance(candidates, Candidates) \
                    else want if want in candidates else None
                if found is not None:
                    return found
            return candidates[0]
        if kind == "slot":
            seen = [c for c, x in zip(candidates, labels, strict=True) if x in self.seen_slots]
            other = next((c for c in candidates if c not in seen), None)
            options = seen + ([other] if other is not None else [])
        elif kind not in FREE_KINDS:
            return candidates[0]
        i = len(self.widths)
        self.widths.append(len(options))
        return options[self.prefix[i] if i < len(self.prefix) else 0]

    def siblings(self) -> list[list[int]]:
        taken = self.prefix + [0] * (len(self.widths) - len(self.prefix))
        return [[*taken[:i], alt] for i in range(len(self.prefix), len(self.widths))
                for alt in range(1, self.widths[i])]


class _LogChooser(RecordedChooser):
    """The log's choices; whether the manager made room one level down for a victim (the
    safety spec leaves it open) is read off the log: it did iff its next victim is at
    that level and pool group. A `clash` or `reuse` choice the log does not record is
    the first option (`DEFAULTED_KINDS`)."""

    def choose(self, kind: str, candidates: Sequence[int], labels: Sequence[object]) -> int:
        if kind in DEFAULTED_KINDS and not (self.script or {}).get(kind):
            return candidates[0]
        if kind != BELOW or len(candidates) == 1:
            return super().choose(kind, candidates, labels)
        where = labels[0]  # (level, pool group) below
        nxt = (self.script or {}).get("victim") or [None]
        below = isinstance(nxt[0], tuple) and isinstance(where, tuple) \
            and tuple(int(x) for x in nxt[0][:2]) == where
        return candidates[0] if below else candidates[1]


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
        self.retired = IdRuns()  # closed ids whose model slot was reused (runs of ids)
        # Other model states that fit the log as well as `model.state` does (events without
        # choices under the safety spec); the representative is `model.state`.
        self.others: list[State] = []
        # Where each page last had a slot: a parked page dropped under evict_parked=drop has
        # none, and its later refusal or drain is filed under that location.
        self.last_where: dict[int, Where] = {}
        self.compared: dict[str, int] = dict.fromkeys(COUNTED, 0)
        self.without_choices = 0
        self.ambiguous = 0
        self.page_actions = 0
        self.no_choice: dict[str, int] = {}

    # ---- sequences -------------------------------------------------------------------
    def _new_slot(self, ev: Event) -> int:
        s, taken = self.model.state, self._taken()
        for want in (SeqStatus.FREE, SeqStatus.CLOSED):
            for q in range(self.cfg.num_sequences):
                if s.seq_status[q] == want and q not in taken:
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
            elif stream in self.retired:
                # closed, and its model slot now serves another id: the stream's last work
                # is not told apart from the new sequence's, so nothing completes (stricter)
                self._note(ev, [])
                return
            else:
                self._expect(ev, {"error": "unknown_sequence"},
                             f"stream {stream} is no created sequence's id and not \"copy\"",
                             required=True)
                self._note(ev, [])
                return
        self._run(ev, ev.action, params)

    def check(self, ev: Event, n: int, name: str = "event log") -> TraceVerdict | None:
        """Check one event (the n-th): None when it agrees with the model, else the
        failing verdict with its report (what `check_events` returns for it)."""
        noun = NO_CHOICE.get(ev.action)
        if noun is not None:
            self.no_choice[noun] = self.no_choice.get(noun, 0) + 1
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
            return self.verdict(False, n, ev.line, f.kind, "\n".join(lines))
        return None

    def _expect(self, ev: Event, got: object, why: str, required: bool = False) -> None:
        """The event's result must be `got`; `required`: a log that reports no result is
        rejected too (the model's answer is an error the manager must have raised)."""
        if ev.result is NO_RESULT and not required:
            return
        self.compared["results"] += ev.result is not NO_RESULT
        if ev.result != got:
            raise _Failure("different result", [
                f"the log reports {_show(ev.result)}; the model: {_show(got)} ({why})"], set())

    # ---- running one event on every state that fits so far ---------------------------
    def _run(self, ev: Event, action: str, params: dict[str, Any]) -> None:
        """Run the event on each model state that fits the log so far, under every choice
        sequence the log leaves open; keep the post-states that fit this event too."""
        m = self.model
        open_choices = ev.choices is None
        # the slots the observed page index shows: read only without recorded choices
        seen = {x for row in (ev.observed or {}).get("index", []) for x in row if x >= 0} \
            if open_choices else set()
        # Slots are first read off the observed index (one run per victim and pocket
        # choice); only when no run fits so does the search try the slots in every order.
        pres = [m.state, *self.others]
        fits, first, runs = self._runs(ev, action, params, pres, seen, bool(seen))
        if not fits and seen:
            guided = first
            try:
                fits, first, runs = self._runs(ev, action, params, pres, seen, False)
            except TooVague:
                # too many slot orders to try: report the run that took the log's slots
                assert guided is not None
                guided.lines.append("(the run that took the slots the observed page index "
                                    "shows is reported: every order of them is too many "
                                    "to try)")
                raise guided from None
        if not fits:
            assert first is not None
            if runs > 1:
                first.lines.append(f"(none of {runs} runs fits: each model state that fitted "
                                   "the log so far, under each choice the log leaves open; "
                                   "the first is shown)")
            raise first
        kept: list[_Fit] = []
        for fit in fits:
            if all(fit.state != k.state for k in kept):
                kept.append(fit)
        if len(kept) > MAX_STATES:
            raise TooVague(
                f"line {ev.line}: {ev.describe()}: without recorded choices {len(kept)} model "
                f"states fit the log so far (at most {MAX_STATES} are followed); log the "
                "events' \"choices\" or more \"observed\" fields (docs/adapter-guide.md)")
        best = kept[0]
        m.state, self.others = best.state, [k.state for k in kept[1:]]
        for k, n in best.counts.items():
            self.compared[k] += n
        self.without_choices += open_choices and ev.action not in NO_CHOICE
        self.ambiguous += len(kept) > 1
        self.page_actions += best.steps
        self._note(ev, best.touched if best.value is not False else [], best.value)

    def _runs(self, ev: Event, action: str, params: dict[str, Any], pres: list[State],
              seen: set[int], guided: bool) -> tuple[list[_Fit], _Failure | None, int]:
        """Every run of the event from each of `pres` under the choices the log leaves
        open: the ones that fit, the first failure, how many runs were made."""
        m = self.model
        open_choices = ev.choices is None
        fits: list[_Fit] = []
        first: _Failure | None = None
        runs = 0
        for pre in pres:
            prefixes: list[list[int]] = [[]]
            while prefixes:
                runs += 1
                if runs > MAX_RUNS:
                    raise TooVague(
                        f"line {ev.line}: {ev.describe()}: without recorded choices more than "
                        f"{MAX_RUNS} runs (model states that fit so far, times the victim, "
                        "pocket and slot choices left open) must be tried; log "
                        "the event's \"choices\" (docs/adapter-guide.md), or check with "
                        "--order lru if the manager evicts in LRU order")
                prefix = prefixes.pop()
                chooser: Chooser = _Trying(prefix, seen, guided) if open_choices \
                    else self._recorded(ev)
                m.state = pre
                try:
                    fits.append(self._attempt(ev, action, params, chooser, pre))
                except _Failure as f:
                    first = first or f
                if isinstance(chooser, _Trying):
                    prefixes.extend(chooser.siblings())
        return fits, first, runs

    def _recorded(self, ev: Event) -> RecordedChooser:
        script: dict[str, list[object]] | None = None
        if ev.choices is not None:
            script = {}
            for kind, label in ev.choices:
                script.setdefault(kind, []).append(label)
        return _LogChooser(script, by="label", on_missing="raise")

    def _attempt(self, ev: Event, action: str, params: dict[str, Any], chooser: Chooser,
                 pre: State) -> _Fit:
        m = self.model
        try:
            result = m.run(action, params, chooser)
        except ChoiceRejected as exc:
            focus = self._label_focus(exc.kind, exc.choice)
            raise _Failure("the model rejects the log's choice", [
                f"the log chose {exc.kind} {_show_label(exc.choice)}; the model's legal "
                f"{exc.kind} choices here: {_show_labels(exc.legal)}",
                *self._why_illegal(exc.kind, exc.choice, exc.legal, m.last_post),
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
        post, steps = m.state, m.last_steps
        if isinstance(chooser, _Trying) and chooser.guided and not chooser.wanted:
            guided = self._guided(ev, chooser, pre, post, steps)
            if guided is not None:
                m.state = pre
                return self._attempt(ev, action, params, guided, pre)
        touched = self._touched(pre, post, steps)
        focus = set().union(*(t for _, t in touched)) if touched else set()
        counts = dict.fromkeys(COUNTED, 0)
        if ev.result is not NO_RESULT:
            counts["results"] = 1
            if ev.result != value and value is False:
                self._unusable_victim(ev, chooser, pre)
            if ev.result != value:
                # what the model did (or tried, before it ran out) shows where they differ
                tried = self._touched(pre, m.last_post, m.last_steps) if value is False \
                    else touched
                lines = [f"the log reports {_show(ev.result)}; the model: {_show(value)} "
                         f"({self._why(action, params, value, pre)})"]
                if tried:
                    lines += ["the model's page actions in this event"
                              + (" before it gave up:" if value is False else ":"),
                              *(f"  {d}" for d, _ in tried)]
                raise _Failure("different result", lines,
                               set().union(*(t for _, t in tried)) if tried else set())
        # A call that fails (OutOfPages) may explore more victims before giving up than the
        # model does; only a successful call must use every recorded choice.
        if isinstance(chooser, RecordedChooser) and ev.choices is not None:
            left = chooser.left() if value is not False else {}
            if left:
                shown = "; ".join(f"{k}: {_show_labels(v)}" for k, v in left.items())
                raise _Failure("the log records choices the model does not make", [
                    f"unused: {shown}", *self._unused_hint(action, params, pre),
                    *self._partial(pre, m.last_steps)], focus)
            counts["choices"] = len(ev.choices) - sum(len(v) for v in chooser.left().values())
        if ev.observed is not None:
            counts.update(self._check_observed(ev, focus))
        bad = m.violations("api")
        if bad:
            raise _Failure("an invariant is violated after this event", [
                *(f"{i.name}: {i.statement}" for i in bad),
                "the model's page actions in this event:", *(f"  {d}" for d, _ in touched)],
                focus)
        return _Fit(post, touched, value, counts, len(steps))

    def _guided(self, ev: Event, run: _Trying, pre: State, post: State,
                steps: list[Step]) -> _Trying | None:
        """The same run again with the slots the event's observed page index shows for the
        blocks this run's picks went to; None when the run already took them."""
        seq = ev.params.get("seq")
        q = self.slot_of.get(seq) if isinstance(seq, int) else None
        rows = (ev.observed or {}).get("index")
        if q is None or not rows:
            return None
        took = [st.params[SLOT_TAKERS[st.action]] for st in steps if st.action in SLOT_TAKERS]
        want = wanted_slots(self.model.layout, pre, post, steps, q, rows)
        if want == took:
            return None
        return _Trying(run.prefix, run.seen_slots, guided=True, wanted=want)

    def _unusable_victim(self, ev: Event, chooser: Chooser, pre: State) -> None:
        """The model ran out where the log evicted a victim it lists: no page there was a
        legal victim (LOCKED, not queued, ...), so the log's choice is what is wrong, not
        only its result. Reported as the illegal choice, with that location's history."""
        m = self.model
        if not (isinstance(chooser, RecordedChooser) and ev.choices is not None
                and str(m.last_failure or "").startswith(NO_VICTIM)):
            return
        victims = chooser.left().get("victim") or []
        if not victims:
            return
        label = victims[0]
        raise _Failure("the model rejects the log's choice", [
            f"the log chose victim {_show_label(label)}; the model's legal victim choices "
            f"here: none ({m.last_failure})",
            *self._why_illegal("victim", label, [], m.last_post),
            f"so the model ran out (false) where the log reports {_show(ev.result)}",
            *self._partial(pre, m.last_steps)], self._label_focus("victim", label))

    def _free_before(self, params: dict[str, Any], pre: State) -> int:
        lay = self.model.layout
        return sum(1 for i in lay.slot_range(params["level"], params["pool_group"])
                   if pre.slot_owner[i] == NONE)

    def _why(self, action: str, params: dict[str, Any], value: object, pre: State) -> str:
        """Why the model's result is what it is: the reason it ran out, or what it did."""
        if value is False:
            return f"it ran out: {self.model.last_failure}"
        if value is True and action == "pressure":
            free = self._free_before(params, pre)
            return (f"pressure's slots is the number of free slots to reach, not the number "
                    f"freed: {free} were free before, so the model evicted "
                    f"{max(0, params['slots'] - free)} pages")
        return "as the model computes it"

    def _unused_hint(self, action: str, params: dict[str, Any], pre: State) -> list[str]:
        if action != "pressure":
            return []
        return [f"pressure's slots ({params['slots']}) is the number of free slots to reach, "
                f"not the number freed: {self._free_before(params, pre)} were free before "
                "the event"]

    def _why_illegal(self, kind: str, label: object, legal: list[object], s: State
                     ) -> list[str]:
        """Why the model cannot use a logged choice: what sits at the label's location."""
        lay, cfg, ops = self.model.layout, self.cfg, self.model.ops
        if kind == "slot" or not isinstance(label, tuple):
            return []
        level, pg, slot = (int(x) for x in label)
        if not (0 <= level < cfg.num_levels and 0 <= pg < cfg.num_pool_groups
                and 0 <= slot < cfg.slots_per_level[level]):
            return [f"{loc((level, pg, slot))} is no slot of the configuration"]
        owner = s.slot_owner[lay.slot_ix(ops, level, pg, slot)]
        if owner == NONE:
            return [f"no page sits at {loc((level, pg, slot))} in the model"]
        facts = [("LOCKED", "HELD", "DROPPABLE")[int(status(ops, s, owner))],
                 "queued for eviction" if s.queued[owner] else "not queued for eviction"]
        if s.dst_level[owner] != NONE:
            facts.append("migrating")
        if owner in s.pocket:
            facts.append("parked in a pocket")
        places = {(int(x[0]), int(x[1])) for x in legal if isinstance(x, tuple)}
        if kind == "victim" and places and (level, pg) not in places:
            facts.append("but this eviction takes from (level, pool group) "
                         + ", ".join(str(x) for x in sorted(places)))
        elif kind == "victim" and s.queued[owner] and self.cfg.order == Order.LRU:
            facts.append("not the head of its queue (order=lru)")
        elif kind == "pocket" and owner in s.pocket and self.cfg.order == Order.LRU \
                and legal:
            facts.append(f"not the oldest entry of its pocket (order=lru pops the oldest: "
                         f"{_show_labels(legal)})")
        return [f"the page at {loc((level, pg, slot))} in the model is {', '.join(facts)}"]

    def _note(self, ev: Event, touched: Touched, value: object = NO_RESULT) -> None:
        if not touched:
            return  # an event that touched no location is in no location's history

        shown = ev.result if ev.result is not NO_RESULT else value
        past = _Past(ev.line, _event_text(ev, shown), touched)
        for w in set().union(*(locs for _, locs in touched)):
            self.past.setdefault(w, deque(maxlen=HISTORY)).append(past)
            self.touches[w] = self.touches.get(w, 0) + 1

    # ---- observed state ---------------------------------------------------------------
    def _check_observed(self, ev: Event, focus: set[Where]) -> dict[str, int]:
        """Compare the event's observed fields with the model's post-state; how many of
        each were compared (a field of an event without `seq` is not)."""
        obs = ev.observed or {}
        m, s, lay = self.model, self.model.state, self.model.layout
        diffs: list[str] = []
        counts = {"free": len(obs.get("free", []))}
        for level, pg, n in obs.get("free", []):
            if not (0 <= level < self.cfg.num_levels and 0 <= pg < self.cfg.num_pool_groups):
                diffs.append(f"free slots at level {level}, pool group {pg}: no such pool")
                continue
            want = count_equal(m.ops, s.slot_owner, lay.slot_range(level, pg), NONE)
            if want != n:
                diffs.append(f"free slots at level {level}, pool group {pg}: log {n}, "
                             f"model {want}")
        seq = ev.params.get("seq")
        q = self.slot_of.get(seq) if isinstance(seq, int) else None
        if q is not None:
            counts.update(status=int("status" in obs), index=len(obs.get("index", [])),
                          pocket=len(obs.get("pocket", [])))
            status = SeqStatus(s.seq_status[q]).name
            if "status" in obs and obs["status"] != status:
                diffs.append(f"status of sequence {seq}: log {obs['status']}, model {status}")
            nb = num_blocks_for(s.capacity[q], self.cfg.tokens_per_block)
            for lc, row in enumerate(obs.get("index", [])):
                first = lay.entry_ix(m.ops, q, lc, 0)  # a row's blocks are consecutive
                want_row = values_in(s.index, range(first, first + min(nb, lay.blocks))) \
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
        return counts

    def _pocket(self, s: State, q: int, lc: int) -> list[int]:
        lay = self.model.layout
        ids = [s.pocket[lay.pocket_ix(self.model.ops, q, lc, k)] for k in range(lay.pocket_cap)]
        return [p for p in ids if p != NONE]

    # ---- locations ----------------------------------------------------------------------

    def _where(self, s: State, p: int) -> Where:
        return (int(s.level[p]), self.cfg.pool_group_of(s.lc[p]), int(s.slot[p]))

    def _touched(self, pre: State, post: State, steps: list[Step]
                 ) -> Touched:
        out: Touched = []
        # Each pocket as the event's own steps change it (a park appends, a pop or drain
        # removes position k and shifts the rest): position k of a later pop is not the
        # one it had before the event.
        pockets: dict[tuple[int, int], list[int]] = {}

        def pocket(seq: int, lc: int) -> list[int]:
            if (seq, lc) not in pockets:
                pockets[seq, lc] = self._pocket(pre, seq, lc)
            return pockets[seq, lc]

        for st in steps:
            prm = st.params
            locs: set[Where] = set()
            page = prm.get("page")
            if st.action == "park":
                pocket(prm["seq"], prm["lc"]).append(prm["page"])
            if st.action in ("pop", "drain"):
                entries = pocket(prm["seq"], prm["lc"])
                page = entries.pop(prm["k"]) if prm["k"] < len(entries) else NONE
            note = ""
            if page is not None and page != NONE:
                for s in (pre, post):
                    if s.alive[page] and s.slot[page] >= 0:
                        locs.add(self._where(s, page))
                if locs:
                    self.last_where[page] = min(locs)
                elif page in self.last_where:
                    # a parked page dropped under evict_parked=drop: no slot any more; its
                    # history is the slot it had (labelled [level, pool_group, -1] in logs)
                    locs.add(self.last_where[page])
                    note = " (the page has no slot: it was dropped there)"
            if st.action == "allocate":
                locs.add((0, self.cfg.pool_group_of(prm["lc"]), prm["slot"]))
            if st.action in ("evict_begin", "onboard_begin") and page is not None:
                dst = pre.level[page] + 1 if st.action == "evict_begin" else 0
                locs.add((int(dst), self.cfg.pool_group_of(pre.lc[page]), prm["dst_slot"]))
            if locs:
                out.append((_step_text(st.action, locs, note), locs))
            elif page is not None and page != NONE:
                out.append((f"{st.action} (page {page}, without a slot)", locs))
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

    def verdict(self, ok: bool, events: int, line: int | None = None, kind: str = "",
                report: str = "") -> TraceVerdict:
        return TraceVerdict(ok, events, line, kind, report, dict(self.compared),
                            self.without_choices, self.ambiguous, self.cfg.order.value,
                            self.page_actions, dict(self.no_choice))

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
    return checker.verdict(True, n)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


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


SHOWN_LABELS = 12  # a report lists at most this many legal choices (runs of slots count once)


def _show_labels(vs: list[object]) -> str:
    """Legal choices as a report shows them: consecutive slot ids as one run ("0..99999"),
    at most SHOWN_LABELS items, and how many there are in all (at real geometry a choice
    can have 10^5 legal slots: the line stays short)."""
    if not vs:
        return "none"
    items: list[str] = []
    ints = sorted(v for v in vs if type(v) is int)
    i = 0
    while i < len(ints):
        j = i
        while j + 1 < len(ints) and ints[j + 1] == ints[j] + 1:
            j += 1
        items.append(str(ints[i]) if i == j else f"{ints[i]}..{ints[j]}")
        i = j + 1
    items += [_show_label(v) for v in vs if type(v) is not int]
    shown = ", ".join(items[:SHOWN_LABELS]) + (", ..." if len(items) > SHOWN_LABELS else "")
    return f"[{shown}]" + (f" ({len(vs)} in all)" if len(items) != len(vs) or
                           len(items) > SHOWN_LABELS else "")
