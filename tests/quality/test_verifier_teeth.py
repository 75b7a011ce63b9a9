"""A verifier with teeth: structural tests that a weakened check cannot pass.

Each test perturbs one thing the verifier reads, at every place it can sit, and expects
the verifier to notice:

* the lockstep's abstract-state comparison (`abstraction.py`): every leaf of every field
  of `Abstract` (enumerated from the dataclass, not listed), and every key of the
  implementation's snapshot that the abstraction reads;
* the views comparison (`views.py`): every field of every public view, and every counter;
* the invariants (`model/invariants.py`) in each reading: the definition, its fast full
  check (`fastcheck.FAST`) and its check of what changed (`fastcheck.LOCAL`, through the
  incremental checker), falsified by a bad state at every position its quantifiers range
  over (every page, slot, sequence, block entry, pocket position);
* the trace checker (`tracecheck.py`): every result kind a log carries (True, False, null,
  an error), each replaced by every other kind, is caught at its line; a log without
  choices is checked under every choice;
* the lockstep consults the data oracle; the implementation's self-check
  (`impl/selfcheck.py`) looks at every page, slot, queue, tree node, sequence and block.

They are the kill tests of the verifier mutation tier (`scripts/mutation.sh --verifier`,
docs/assurance.md), so they are kept quick.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvpocket.model import Model
from kvpocket.model.config import NONE, CommitState, KVConfig, SeqStatus
from kvpocket.model.fastcheck import FAST, LOCAL, Delta, violated
from kvpocket.model.incremental import IncrementalChecker
from kvpocket.model.invariants import INVARIANTS, INVARIANTS_BY_NAME, EntryAt, Invariant
from kvpocket.model.logic import CONCRETE
from kvpocket.model.state import SCHEMA, STATE_FIELDS, Layout, State, evolve
from kvpocket.verify.conformance.abstraction import Abstract, abstract_impl, abstract_model, diff
from kvpocket.verify.conformance.lockstep import Divergence, Lockstep
from kvpocket.verify.conformance.views import (
    COUNTED_CHOICES,
    counter_differences,
    occupied_slots,
    view_differences,
)
from kvpocket.verify.presets import PRESETS

# ---- a short real run: every field of the abstract state in use ------------------------

CFG = replace(PRESETS["two-level"].config.with_pocket(True, "revalidate"),
              slots_per_level=(12, 8))
RUN: list[tuple[str, dict[str, Any]]] = [
    ("create", {"seq": 1, "prompt": [1, 2, 3, 4]}), ("resume", {"seq": 1}),
    ("resize", {"seq": 1, "capacity": 6, "history": 4}), ("commit", {"seq": 1, "n": 2}),
    ("close", {"seq": 1}),  # its committed pages: DROPPABLE and queued
    ("pressure", {"level": 0, "pool_group": 0, "slots": 12}),  # it migrates to host
    ("create", {"seq": 0, "prompt": [7, 8]}), ("resume", {"seq": 0}),
    ("stop_committing", {"seq": 0}),
    ("resize", {"seq": 0, "capacity": 4, "history": 3}),
    ("resize", {"seq": 0, "capacity": 6, "history": 5}),  # block 0 leaves the window: parked
]


def _run(cfg: KVConfig = CFG, steps: list[tuple[str, dict[str, Any]]] = RUN) -> Lockstep:
    ls = Lockstep(cfg)
    for action, params in steps:
        ls.step(action, params)
    return ls


@pytest.fixture(scope="module")
def run() -> Lockstep:
    return _run()


def _leaves(value: Any, path: tuple[int, ...] = ()) -> Iterator[tuple[int, ...]]:
    """The paths to every non-tuple value inside nested tuples."""
    if isinstance(value, tuple):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    else:
        yield path


def _other(v: Any) -> Any:
    """A value of the same kind that differs from v."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    if isinstance(v, str):
        return v + "?"
    if v is None:
        return 0
    raise AssertionError(f"unexpected leaf {v!r}")


def _set(value: Any, path: tuple[int, ...], new: Any) -> Any:
    if not path:
        return new
    i = path[0]
    return (*value[:i], _set(value[i], path[1:], new), *value[i + 1:])


def _get(value: Any, path: tuple[int, ...]) -> Any:
    for i in path:
        value = value[i]
    return value


def test_the_run_uses_every_field(run: Lockstep) -> None:
    a = abstract_model(run.model)
    for f in dataclasses.fields(Abstract):
        assert getattr(a, f.name), f"the run leaves {f.name} empty: a perturbation test needs it"
    assert any(order for _, _, order in a.queues), "a queued page"
    assert {row[0] for row in a.pages} == {0, 1}, "pages at both levels"


def test_every_leaf_of_every_field_is_compared(run: Lockstep) -> None:
    """`diff` (what a divergence reports) and equality (what raises it) see a change of
    any one value anywhere in the abstract state."""
    a = abstract_impl(run.impl.snapshot(sequences=run.seq_of()), run.seq_of())
    assert a == abstract_model(run.model) and diff(a, a) == []
    names = list(a.as_dict())
    assert len(names) == len(dataclasses.fields(Abstract)), "as_dict names every field"
    seen = 0
    for f, name in zip(dataclasses.fields(Abstract), names, strict=True):
        value = getattr(a, f.name)
        for path in _leaves(value):
            bad = replace(a, **{f.name: _set(value, path, _other(_get(value, path)))})
            found = diff(a, bad)
            assert bad != a, (f.name, path)
            assert found and name in found[0], (f.name, path, found)
            seen += 1
    assert seen > 100


# Snapshot keys the abstraction does not read, each for a reason: derived from what it
# reads, allocator internals with no model counterpart, or names (ids) the abstraction
# replaces by locations.
NOT_ABSTRACTED: dict[str, frozenset[str]] = {
    "pages": frozenset({"locks", "holds", "priority"}),  # `status` and `lc` carry them
    "slots": frozenset({"capacity", "free", "recycled", "next_fresh"}),  # `occupied` does
    "queues": frozenset(),
    "pockets": frozenset(),
    "sequences": frozenset({"num_committed_blocks", "num_blocks"}),  # lengths carry them
}


def _bump(v: Any) -> Any:
    """A JSON-like value with its first non-null leaf changed (a list of nulls, or an
    empty one, gets a 0 more)."""
    if isinstance(v, list):
        at = next((i for i, x in enumerate(v) if x is not None and x != []), None)
        return [*v, 0] if at is None else [*v[:at], _bump(v[at]), *v[at + 1:]]
    if isinstance(v, dict):
        first = next(iter(v))
        return {**v, first: _bump(v[first])}
    return _other(v)


def _perturbed_records(snap: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(record kind, key, a snapshot with that key changed in one record) for every key
    of every record of every kind the abstraction reads."""
    for kind in NOT_ABSTRACTED:
        assert snap[kind], f"the run has no {kind} record"
        for i, rec in enumerate(snap[kind]):
            for key, v in rec.items():
                if key == "id":  # renaming an id: perturbing the references to it covers it
                    continue
                copy = {**snap, kind: [*snap[kind][:i], {**rec, key: _bump(v)},
                                       *snap[kind][i + 1:]]}
                yield kind, key, copy


def test_every_snapshot_key_is_read(run: Lockstep) -> None:
    seq_of = run.seq_of()
    snap = run.impl.snapshot(sequences=seq_of)
    base = abstract_impl(snap, seq_of)
    keys: dict[str, set[str]] = {k: set() for k in NOT_ABSTRACTED}
    read: dict[str, set[str]] = {k: set() for k in NOT_ABSTRACTED}
    for kind, key, bad in _perturbed_records(snap):
        keys[kind].add(key)
        if abstract_impl(bad, seq_of) != base:
            read[kind].add(key)
    assert {k: frozenset(keys[k] - read[k]) for k in keys} == NOT_ABSTRACTED



def test_the_lockstep_checks_the_data_it_reads() -> None:
    """Metadata right, data wrong: the lockstep's check consults the data oracle after a
    step that reads the corrupted slots (every other comparison agrees)."""
    ls = _run()
    kv = ls.impl.seqs[ls.impl_id[0]]
    pool = ls.impl.pool(0, 0)
    for lc in range(ls.cfg.num_life_cycles):
        for e in kv.block_entries(lc):
            if e.locked:
                pool[e.slot] ^= 0x5A5A
    with pytest.raises(Divergence, match="data oracle"):
        ls.step("resize", {"seq": 0, "capacity": 8, "history": 7})


def test_the_lockstep_checks_outstanding_work_when_it_finishes() -> None:
    """With a harness-driven simulator, a step compares only the reads that ran; `finish`
    runs the rest and compares them: data corrupted before they run is reported."""
    ls = Lockstep(CFG, eager=False)
    for action, params in RUN:
        ls.step(action, params)
    ls.finish()
    ls.impl.pool(0, 0)[:] ^= 0x5A5A
    ls.step("resize", {"seq": 0, "capacity": 8, "history": 7})  # its reads have not run
    with pytest.raises(Divergence, match="data oracle"):
        ls.finish()


def test_the_lockstep_asks_every_query_for_every_life_cycle_that_does_not_exist(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One bad life cycle per step and sequence, in turn: within six steps each of a
    negative, a bool, a float, a string, n and n + 1 reaches every query of every live
    sequence: after a closed one, and with two live ones."""
    again: list[tuple[str, dict[str, Any]]] = [("create", {"seq": 1, "prompt": [9]}),
                                               ("resume", {"seq": 1})]
    for steps, lives in ((RUN, 1), ([*RUN, *again], 2)):
        ls = _run(steps=steps)
        n = ls.cfg.num_life_cycles
        asked: dict[tuple[int, str], set[str]] = {}
        for sid, kv in ls.impl.seqs.items():
            for query in ("stale_range", "pocket_pages", "page_table"):
                orig = getattr(kv, query)

                def spy(lc: Any, _o: Any = orig, _key: tuple[int, str] = (sid, query),
                        _n: int = n, _asked: dict[tuple[int, str], set[str]] = asked) -> Any:
                    if not (type(lc) is int and 0 <= lc < _n):
                        _asked.setdefault(_key, set()).add(repr(lc))
                    return _o(lc)
                monkeypatch.setattr(kv, query, spy)
        for step in range(6):
            assert ls._check_queries(step) == []
        monkeypatch.undo()
        want = {"-1", "True", "1.5", "'0'", repr(n), repr(n + 1)}
        live = [sid for q, sid in ls.impl_id.items() if ls.model.state.seq_status[q] == 1]
        assert len(live) == lives and len(ls.impl_id) == 2
        assert asked == {(sid, q): want for sid in live
                         for q in ("stale_range", "pocket_pages", "page_table")}


def test_the_oracle_stamps_alike_on_both_paths() -> None:
    """The expected stamps of a decode step (a few tokens, in Python) and of a prefill
    (many, vectorized) are one function of (sequence, life cycle, position), distinct
    between life cycles: a block read for the wrong life cycle cannot pass."""
    from kvpocket.impl.manager import KVCacheManager
    from kvpocket.verify.oracles.data import DecodeOracle
    mgr = KVCacheManager(CFG, slot_elems=8)
    one, many = DecodeOracle(mgr), DecodeOracle(mgr)
    toks = list(range(20))
    for t in toks:
        one.add_tokens(5, [t])  # the decode path, a token at a time
    many.add_tokens(5, toks)  # the vectorized path
    pos = np.arange(len(toks))
    for lc in range(CFG.num_life_cycles):
        want = many.stamps(5, lc, pos)
        assert (one._exp[one._row[5], lc, :len(toks)] == want).all(), lc
        assert (many._exp[many._row[5], lc, :len(toks)] == want).all(), lc
    assert not (many.stamps(5, 0, pos) == many.stamps(5, 1, pos)).any()

# ---- views and counters ------------------------------------------------------------------

MANAGER_VIEWS = ("eviction_order", "slot_counts", "free_slots", "pages")
HANDLE_VIEWS = ("block_table", "block_entries", "pocket_entries")
# View fields not compared with the model: implementation ids (the abstraction names pages
# by location) and counts that `status` carries.
NOT_COMPARED = {"page_id", "locks", "holds"}


def _perturb_view(value: Any) -> Iterator[tuple[str, Any]]:
    """(what changed, the view's value with one change) for every field of every element
    (NamedTuples) or every element (ints) of a tuple, or an int; and each element left out."""
    if isinstance(value, int):
        yield "value", value + 1
        return
    assert isinstance(value, tuple)
    for i, x in enumerate(value):
        rest = value[i + 1:]
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            rec: Any = x  # a NamedTuple view
            for name in rec._fields:
                yield name, (*value[:i], rec._replace(**{name: _other(getattr(rec, name))}),
                             *rest)
        else:
            yield "value", (*value[:i], _other(x), *rest)
        yield "length", (*value[:i], *rest)


def _differences_with(run: Lockstep, owner: Any, view: str, args: tuple[Any, ...], k: int,
                      monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the views comparison reports with the k-th perturbation of one view's value
    for `args` (an exception while comparing is a finding too: the lockstep reports it as a
    crash)."""
    orig = getattr(owner, view)

    def perturbed(*a: Any) -> Any:
        value = orig(*a)
        return list(_perturb_view(value))[k][1] if a == args else value

    with monkeypatch.context() as mp:
        mp.setattr(owner, view, perturbed)
        try:
            return view_differences(run.impl, run.cfg, abstract_model(run.model), run.impl_id)
        except Exception as exc:  # any exception: the lockstep reports it as a divergence
            return [f"raised {type(exc).__name__}"]


def test_every_view_field_is_compared(run: Lockstep, monkeypatch: pytest.MonkeyPatch) -> None:
    assert view_differences(run.impl, run.cfg, abstract_model(run.model), run.impl_id) == []
    live = {row[0] for row in abstract_model(run.model).seqs if row[1] in ("ACTIVE", "SUSPENDED")}
    handles = [run.impl.seqs[sid] for q, sid in run.impl_id.items() if q in live]
    assert handles
    # the comparison calls exactly these views (a view it stopped reading fails here), with
    # these arguments
    calls: dict[tuple[int, str], set[tuple[Any, ...]]] = {}
    owners = [(run.impl, v) for v in MANAGER_VIEWS] + [(kv, v) for kv in handles
                                                       for v in HANDLE_VIEWS]
    for owner, view in owners:
        orig = getattr(owner, view)

        def record(*a: Any, _o: Any = orig, _key: tuple[int, str] = (id(owner), view)) -> Any:
            calls.setdefault(_key, set()).add(a)
            return _o(*a)
        monkeypatch.setattr(owner, view, record)
    view_differences(run.impl, run.cfg, abstract_model(run.model), run.impl_id)
    monkeypatch.undo()
    assert {v for _, v in calls} == set(MANAGER_VIEWS) | set(HANDLE_VIEWS)
    missed: set[tuple[str, str]] = set()
    tried = 0
    for owner, view in owners:
        noticed: dict[str, bool] = {}
        for args in sorted(calls[(id(owner), view)]):
            for k, (what, _) in enumerate(_perturb_view(getattr(owner, view)(*args))):
                tried += 1
                noticed[what] = noticed.get(what, False) or bool(
                    _differences_with(run, owner, view, args, k, monkeypatch))
        missed |= {(view, what) for what, seen in noticed.items() if not seen}
        fields = {w for a in calls[(id(owner), view)]
                  for w, _ in _perturb_view(getattr(owner, view)(*a))}
        assert fields, f"{view}: the run gives it nothing to perturb"
    assert tried > 50
    assert {what for _, what in missed} <= NOT_COMPARED, sorted(missed)


# Counters a successful call may change by any amount (nothing the model decides).
UNCOUNTED_ON_SUCCESS = {"events_recorded", "cross_stream_waits"}


def test_every_counter_is_compared() -> None:
    ls = _run()  # its own run: the step below changes it
    impl = ls.impl
    before = impl.counters.total.as_dict()
    occ = occupied_slots(impl)
    ls.step("resize", {"seq": 0, "capacity": 8, "history": 7})  # pops the pocket, allocates
    after, choices = impl.counters.total.as_dict(), impl.last_choices()
    occ_after = occupied_slots(impl)
    assert counter_differences(before, after, choices, occ, occ_after) == []
    failed = [*choices, ("fail",)]
    unchanged = dict(before)
    assert counter_differences(before, unchanged, failed, occ, occ) == []
    for name in after:
        wrong = {**after, name: after[name] + 1}
        on_success = counter_differences(before, wrong, choices, occ, occ_after)
        on_rollback = counter_differences(before, {**before, name: before[name] + 1}, failed,
                                          occ, occ)
        assert on_rollback and name in on_rollback[0], name
        if name not in UNCOUNTED_ON_SUCCESS:
            assert on_success and name in on_success[0], name
    assert set(COUNTED_CHOICES) | {"releases"} | UNCOUNTED_ON_SUCCESS == set(after)


# ---- the trace checker: every result kind, each replaced by every other -------------------

RESULTS: dict[str, Any] = {"true": True, "false": False, "null": None,
                           "error": {"error": "sequence_state"}}


def _kind(result: Any) -> str:
    return "error" if isinstance(result, dict) else json.dumps(result)


def _log(tmp: Path) -> list[dict[str, Any]]:
    from kvpocket.verify.traces.record import record
    path = tmp / "tiny.ndjson"
    record(PRESETS["tiny"].config.with_pocket(True, "revalidate"), 150, 0, path)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return rows[:-1]  # the end marker left out: each doctored log is cut after its event


def _verdict(rows: list[dict[str, Any]]) -> Any:
    from kvpocket.verify.traces.trace import parse_events
    from kvpocket.verify.traces.tracecheck import check_events
    return check_events(parse_events([json.dumps(r) for r in rows]))


@pytest.fixture(scope="module")
def log_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _log(tmp_path_factory.mktemp("log"))


def test_every_result_kind_is_compared(log_rows: list[dict[str, Any]]) -> None:
    """The result rule (a logged result against the model's) for every action and every
    result kind the log carries, each replaced by every other kind (and an error by
    another error): caught at its line as a different result."""
    rows = log_rows
    clean = _verdict(rows)
    assert clean.ok
    # what the verdict rests on, in numbers: every logged choice and result compared
    assert clean.compared["choices"] == sum(len(r["choices"]) for r in rows[1:]) > 100
    assert clean.compared["results"] == len(rows) - 1
    firsts: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(rows[1:], start=1):
        at = firsts.setdefault((r["action"], _kind(r["result"])), [])
        if len(at) < 2:
            at.append(i)
    assert {k for _, k in firsts} == set(RESULTS), "the log carries every result kind"
    tried = 0
    for (action, kind), lines in sorted(firsts.items()):
        for i in lines:
            wrong = [v for k, v in RESULTS.items() if k != kind]
            if kind == "error":
                wrong.append({"error": "capacity" if rows[i]["result"]["error"] != "capacity"
                              else "commit"})
            for v in wrong:
                bad = [*rows[:i], {**rows[i], "result": v}]
                got = _verdict(bad)
                assert not got.ok and got.line == i + 1 and got.kind == "different result", \
                    (action, kind, v, got.report)
                tried += 1
            assert _verdict([*rows[:i], {k: x for k, x in rows[i].items()
                                         if k != "result"}]).ok, "a result may be left out"
    assert tried > 60


def test_results_on_sequences_the_model_does_not_run(log_rows: list[dict[str, Any]]) -> None:
    """The rule for a sequence that was never created, and for a stream that is none, on
    every result kind: only the model's answer (an unknown-sequence error) passes."""
    head = log_rows[:1]
    unknown = {"error": "unknown_sequence"}
    for action, params in (("resize", {"seq": 7, "capacity": 2, "history": 1}),
                           ("resume", {"seq": 7}), ("close", {"seq": 7}),
                           ("advance", {"stream": 7})):
        ev = {"action": action, "params": params, "choices": []}
        assert _verdict([*head, {**ev, "result": unknown}]).ok, action
        for v in RESULTS.values():
            got = _verdict([*head, {**ev, "result": v}])
            assert not got.ok and got.line == 2 and got.kind == "different result", (action, v)
    # a stream that is no sequence: the log must report the error (a missing result fails)
    got = _verdict([*head, {"action": "advance", "params": {"stream": 7}, "choices": []}])
    assert not got.ok and got.line == 2



def test_a_log_without_choices_is_checked_under_every_choice(
        log_rows: list[dict[str, Any]]) -> None:
    """With its choices left out, a recorded log still fits: the checker tries every
    victim, pocket and slot choice the spec allows (pruning only slots the log never shows),
    and a wrong result in such a log is still caught at its line. With the observed page
    index kept, the slots it shows settle the choices; without it, more than one model
    state is followed (the search itself is what fits the log)."""
    bare = [log_rows[0], *({k: v for k, v in r.items() if k != "choices"}
                           for r in log_rows[1:121])]
    got = _verdict(bare)
    assert got.ok and got.without_choices > 0.9 * got.events, got.report
    blind = [bare[0], *({**r, "observed": {k: v for k, v in r["observed"].items()
                                           if k != "index"}} if r.get("observed") else r
                        for r in bare[1:61])]
    assert any(r.get("observed", {}).get("index") for r in bare[1:61])
    got_blind, got_seen = _verdict(blind), _verdict(bare[:61])
    assert got_blind.ok and got_blind.ambiguous > got_seen.ambiguous, got_blind.report
    i = next(i for i, r in enumerate(bare[1:], start=1)
             if r["action"] == "resize" and r["result"] is True)
    got = _verdict([*bare[:i], {**bare[i], "result": False}])
    assert not got.ok and got.line == i + 1 and got.kind == "different result"

# ---- invariants: falsified at every position, in every reading ----------------------------


# The domains the invariants not written in a one-record form quantify over (the others:
# their form's domain). Every position of each must admit a bad state the invariant rejects.
QUANTIFIED: dict[str, tuple[str, ...]] = {
    "slot_owned_once": ("page", "slot"),
    "refcounts_match": ("page",),
    "pocket_entries_orphaned": ("pocket",),
    "committed_never_parked": ("pocket",),
    "no_page_in_two_pockets": ("pocket",),
    "pinned_pockets_stay": ("pocket",),  # under the pin policy (else it is True)
    "dropped_pockets_stay_at_gpu": ("pocket",),  # under evict_parked=drop (else True)
    "popped_slots_valid": ("scalar",),
    "no_unsynced_reuse": ("scalar",),
    "window_is_mapped": ("entry", "seq"),
    "values_in_range": ("page", "slot", "seq", "entry", "pocket"),
}


def _domains(inv: Invariant) -> tuple[str, ...]:
    if inv.per_page is not None:
        return ("page",)
    if inv.per_entry is not None:
        return ("entry",)
    if inv.per_seq is not None:
        return ("seq",)
    return QUANTIFIED[inv.name]


def _fields(domain: str) -> list[str]:
    return [f.name for f in SCHEMA if f.domain == domain]


def _positions(lay: Layout, s: State, domain: str) -> range:
    return range(1) if domain == "scalar" else range(len(getattr(s, _fields(domain)[0])))


def _values(v: Any) -> list[Any]:
    if isinstance(v, bool):
        return [not v]
    return [x for x in dict.fromkeys((v + 1, v - 1, 0, 1, 2, -1, -2, 3, v + 5)) if x != v]


def _with(s: State, field: str, i: int, v: Any) -> State:
    arr = getattr(s, field)
    if not isinstance(arr, tuple | list) and not hasattr(arr, "set"):
        return evolve(s, **{field: v})  # a scalar
    new = arr.set(i, v) if hasattr(arr, "set") else (*arr[:i], v, *arr[i + 1:])
    return evolve(s, **{field: new})


Cell = tuple[str, int]  # (state field, position)


def _cells(lay: Layout, s: State, domain: str, i: int) -> tuple[list[Cell], list[Cell]]:
    """Position i of a domain as (its own cells, the cells it reads elsewhere): a record's
    fields; a sequence owns its pocket positions and reads the pages they name; a block
    entry reads its sequence's fields and the page it references; a pocket position is
    compared with every other one."""
    own: list[Cell] = [(f, i) for f in _fields(domain)]
    other: list[Cell] = []
    if domain == "seq":
        own += [("pocket", k) for k in lay.pocket_range(i)]
        other += [(f, x) for k in lay.pocket_range(i) if 0 <= (x := s.pocket[k]) < lay.pages
                  for f in _fields("page")]
    if domain == "entry":
        other += [(f, i // (lay.lcs * lay.blocks)) for f in _fields("seq")]
        if 0 <= (x := s.entry[i]) < lay.pages:
            other += [(f, x) for f in _fields("page")]
    if domain == "pocket":
        other += [("pocket", k) for k in range(len(s.pocket)) if k != i]
    return own, other


def _changes(s: State, scalar: bool, cells: list[Cell]) -> list[tuple[str, int, Any]]:
    return [(f, k, v) for f, k in cells
            for v in _values(getattr(s, f) if scalar else getattr(s, f)[k])]


def _at(lay: Layout, domain: str, i: int) -> Any:
    if domain == "entry":
        seq, rest = divmod(i, lay.lcs * lay.blocks)
        return EntryAt(seq, *divmod(rest, lay.blocks), i)
    return i


def _falsifiers(inv: Invariant, lay: Layout, s: State, domain: str, i: int
                ) -> tuple[State | None, list[State]]:
    """A state the invariant rejects because of position i, changed there (one cell, two,
    or one there and one it reads elsewhere); and the states changed only elsewhere (in
    what position i reads) that a one-record statement rejects at i."""
    own, other = _cells(lay, s, domain, i)
    scalar = domain == "scalar"
    form = inv.per_page or inv.per_entry or inv.per_seq

    def rejects(b: State) -> bool:
        try:  # a one-record statement at i first (cheap), then the whole definition
            if form is not None and form.at(CONCRETE, lay, b, _at(lay, domain, i)):
                return False
            return not inv.predicate(CONCRETE, lay, b)
        except (IndexError, KeyError):  # an id out of range: the statement cannot read it
            return False

    mine, theirs = _changes(s, scalar, own), _changes(s, scalar, other)
    via: list[State] = []
    if form is not None:  # changed elsewhere only: what a check of what changed must follow
        for f, k, v in theirs:
            b = _with(s, f, k, v)
            if rejects(b):
                via.append(b)
                break
    for f, k, v in mine:
        b = _with(s, f, k, v)
        if rejects(b):
            return b, via
    for a, (f, k, v) in enumerate(mine):
        one = _with(s, f, k, v)
        for g, j, w in [*mine[a + 1:], *theirs]:
            if (g, j) == (f, k):
                continue
            b = _with(one, g, j, w)
            # the change at i must matter: the other change alone is not rejected
            if rejects(b) and (form is not None or inv.predicate(CONCRETE, lay,
                                                                  _with(s, g, j, w))):
                return b, via
    return None, via


def _good_states(cfg: KVConfig) -> list[State]:
    """Reachable states with every domain in use (every array sparse, as the lockstep keeps
    them): a page parked by the last sequence, a held stale block, a committed page, an
    ACTIVE and a SUSPENDED sequence; and one with the first sequence ACTIVE instead (a SUSPENDED sequence's
    in-window blocks constrain nothing in `window_is_mapped` but through the sequence,
    whose change breaks every block at once)."""
    out = []
    last = cfg.num_sequences - 1  # parks: a pocket in use after empty ones
    for suspend in (True, False):
        m = Model(cfg, sparse_above=0)
        m.create(0, [1, 2, 3, 4])
        assert m.resume(0) and m.resize(0, 6, 4)
        m.commit(0, (5, 6))
        if not suspend:
            out.append(m.state)
            break
        m.suspend(0)
        m.create(last, [7, 8])
        assert m.resume(last)
        m.stop_committing(last)
        # two blocks leave the window at once, nothing allocated: the last pocket full
        # (where there is room; else one block parked)
        if not (m.resize(last, 8, 3) and m.resize(last, 8, 7)):
            assert m.resize(last, 4, 3) and m.resize(last, 6, 5)
        assert any(p != -1 for p in m.state.pocket), "a parked page"
        out.append(m.state)
    return out


# Every pocket policy's invariants, several levels, pool groups and life cycles.
INVARIANT_CONFIGS = {
    "tiny-revalidate": PRESETS["tiny"].config.with_pocket(True, "revalidate"),
    "tiny-pin": PRESETS["tiny"].config.with_pocket(True, "pin"),
    "split-pools": PRESETS["split-pools"].config.with_pocket(True, "revalidate"),
    "three-level": PRESETS["three-level"].config.with_pocket(True, "revalidate"),
}


@pytest.mark.parametrize("config", sorted(INVARIANT_CONFIGS))
def test_every_invariant_is_falsified_at_every_position(config: str) -> None:
    cfg = INVARIANT_CONFIGS[config]
    lay = Layout(cfg)
    goods = _good_states(cfg)
    assert all(not violated(CONCRETE, lay, g) for g in goods)
    vacuous = {"pinned_pockets_stay": cfg.pocket.policy.value != "pin",
               "dropped_pockets_stay_at_gpu": not cfg.pocket.drops_parked}
    missing: list[tuple[str, str, int]] = []
    reached = 0  # positions also broken from elsewhere (a referenced page, the sequence)
    for inv in INVARIANTS:
        if vacuous.get(inv.name):
            continue
        local = LOCAL.get(inv.name)
        local_false = 0
        for domain in _domains(inv):
            for i in _positions(lay, goods[0], domain):
                found = ((g, *_falsifiers(inv, lay, g, domain, i)) for g in goods)
                good, bad, via = next((f for f in found if f[1] is not None), (goods[0], None, []))
                if bad is None:
                    missing.append((inv.name, domain, i))
                    continue
                reached += bool(via)
                for b in [bad, *via]:
                    where = (inv.name, domain, i, b is not bad)
                    if inv.name in FAST:  # the fast full check
                        assert not FAST[inv.name](lay, b), where
                    # the checker, as after checking `good`; between API actions every
                    # invariant holds, after every step those of scope `step`
                    for scope in (None, "api", *(("step",) if inv.scope == "step" else ())):
                        checker = IncrementalChecker(lay)
                        checker._last, checker._held = good, {j.name for j in INVARIANTS}
                        assert inv in checker.violated(b, scope), (*where, scope)
                    if local is not None:  # the check of what changed
                        changed = frozenset(f for f in STATE_FIELDS
                                            if getattr(b, f) is not getattr(good, f))
                        got = local(lay, b, Delta(good, b, changed))
                        assert got is not True, where
                        local_false += got is False
        if local is not None:
            assert local_false, f"{inv.name}: the check of what changed never decided"
    assert not missing, f"no bad state found at: {missing}"
    assert reached > 5


# ---- the implementation's structural self-check: every record it loops over ---------------

Poke = tuple[str, Callable[[], Callable[[], None]]]  # (where, change in place -> its undo)


def _set_attr(obj: Any, name: str, value: Any) -> Callable[[], Callable[[], None]]:
    def poke() -> Callable[[], None]:
        old = getattr(obj, name)
        setattr(obj, name, value(old) if callable(value) else value)
        return lambda: setattr(obj, name, old)
    return poke


def _toggle(items: set[int], x: int) -> Callable[[], Callable[[], None]]:
    def poke() -> Callable[[], None]:
        items.symmetric_difference_update({x})
        return lambda: items.symmetric_difference_update({x})
    return poke


def _store_at(arr: Any, at: tuple[int, int], value: int) -> Callable[[], Callable[[], None]]:
    def poke() -> Callable[[], None]:
        old = int(arr[at])
        arr[at] = value
        return lambda: arr.__setitem__(at, old)
    return poke


def _selfcheck_pokes(ls: Lockstep) -> Iterator[Poke]:
    """One change at every record `impl/selfcheck.py` loops over: each page, each slot of
    each allocator, each queue, each radix-tree node, each live sequence, each block of
    each life cycle of each live sequence, each parked page."""
    st, cfg = ls.impl.storage, ls.cfg
    for p in st.pages.values():
        yield f"page {p.pid}", _set_attr(p, "holds", lambda h: h + 1)
    for level, allocs in enumerate(st.allocs):
        for g, a in enumerate(allocs):
            for slot in range(a.capacity):
                yield f"slot {level}/{g}/{slot}", _toggle(a.occupied, slot)
            yield f"queue {level}/{g}", _set_attr(st.queues[level][g], "entries",
                                                  lambda e: {**e, 10_000: (0, 0)})
    for n in st.tree.nodes.values():
        yield f"node {n.nid}", _set_attr(n, "refs", lambda r: r + 1)
    for sid, kv in ls.impl.seqs.items():
        if kv.status.name == "CLOSED":
            continue
        yield f"seq {sid}", _set_attr(kv, "history", kv.capacity + 1)
        for lc in range(cfg.num_life_cycles):
            for b in range(cfg.max_blocks):
                yield f"seq {sid} lc {lc} block {b}", _store_at(kv.index, (lc, b), 12345)
            for p in kv.pocket[lc]:
                yield f"seq {sid} pocket {lc} page {p.pid}", _set_attr(p, "committed", True)


def test_the_self_check_looks_at_every_record(run: Lockstep) -> None:
    assert run.impl.check_invariants() == []
    kinds: set[str] = set()
    for where, poke in _selfcheck_pokes(run):
        undo = poke()
        try:
            assert run.impl.check_invariants(), f"{where}: a change there went unnoticed"
        finally:
            undo()
        kinds.add(where.split(" ")[0] + (" pocket" if "pocket" in where else ""))
    assert run.impl.check_invariants() == []
    assert kinds == {"page", "slot", "queue", "node", "seq", "seq pocket"}



def _bounds(lay: Layout, s: State) -> dict[str, tuple[int, int | None]]:
    """Each field's range, [low, high) (None: unbounded above), as `values_in_range`
    states it: every variable within its type."""
    return {"lc": (0, lay.lcs), "level": (0, lay.cfg.num_levels), "locks": (0, None),
            "holds": (0, None), "owner": (NONE, lay.seqs), "ordinal": (0, lay.blocks),
            "key": (NONE, None), "stamp": (0, s.clock + 1), "slot_owner": (NONE, lay.pages),
            "slot_busy": (-1, lay.seqs + 1), "seq_status": (0, len(SeqStatus)),
            "commit_state": (0, len(CommitState)), "entry": (NONE, lay.pages),
            "pocket": (NONE, lay.pages), "clock": (0, None)}


@pytest.mark.parametrize("config", sorted(INVARIANT_CONFIGS))
def test_values_in_range_rejects_each_bound(config: str) -> None:
    """Just below and just above each field's range, at a position in use: rejected by the
    definition, the fast check and the check of what changed; and every other fast check
    still agrees with its definition there (it reads such a value without failing)."""
    lay = Layout(INVARIANT_CONFIGS[config])
    good = _good_states(lay.cfg)[0]
    inv = INVARIANTS_BY_NAME["values_in_range"]
    live = next(p for p in range(lay.pages) if good.alive[p])
    at = {"page": live, "slot": 0, "seq": 0, "entry": 0, "pocket": 0, "scalar": 0}
    domain = {f.name: f.domain for f in SCHEMA}
    tried = 0
    for field, (lo, hi) in _bounds(lay, good).items():
        for v in (lo - 1, *(() if hi is None else (hi, hi + 1))):
            bad = _with(good, field, at[domain[field]], v)
            changed = frozenset({field})
            where = (field, v)
            assert not inv.predicate(CONCRETE, lay, bad), where
            assert not FAST["values_in_range"](lay, bad), where
            assert LOCAL["values_in_range"](lay, bad, Delta(good, bad, changed)) is not True, where
            for other in INVARIANTS:  # out of range, every fast check still agrees (no crash)
                if other.name in FAST:
                    assert FAST[other.name](lay, bad) == bool(
                        other.predicate(CONCRETE, lay, bad)), (*where, other.name)
            tried += 1
    for v in (-2, lay.slots_at(good.level[live])):  # a slot that is no slot of its level
        bad = _with(good, "slot", live, v)
        assert not inv.predicate(CONCRETE, lay, bad) and not FAST["values_in_range"](lay, bad)
    assert tried >= 25
