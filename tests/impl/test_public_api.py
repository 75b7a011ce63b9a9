"""The public API an integrator drives (docs/adapter-guide.md): typed results, read-only
views, usage errors for bad input, create-after-close and the sequence limit as the model
has them, and the shutdown report. Only public names are used."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from impl_helpers import assert_clean, swa_config

from kvpocket.impl import (
    CapacityError,
    CapacityFailure,
    CopyFailedError,
    InjectedAllocationError,
    KVCache,
    KVCacheManager,
    LeakError,
    OutOfPagesError,
    PressureResult,
    ResizeResult,
    ResumeResult,
    SequenceClosedError,
    ShutdownReport,
    SlotCount,
    TooManySequencesError,
    UnknownLevelError,
    UnknownLifeCycleError,
    UnknownSequenceError,
    UsageError,
)
from kvpocket.model.config import BAD_PAGE_INDEX, NONE, KVConfig, SeqStatus, stale_range
from kvpocket.model.machine import Model
from kvpocket.verify.conformance.adapter import Outcome, impl_outcome, outcome_of


def active(mgr: KVCacheManager, sid: int, prompt: tuple[int, ...] = ()) -> KVCache:
    kv = mgr.create(sid, prompt)
    assert kv.resume()
    return kv


def full_gpu(mgr: KVCacheManager) -> KVCache:
    """A sequence whose locked pages fill the GPU (4 slots: 2 blocks x 2 life cycles)."""
    kv = active(mgr, 0)
    assert kv.resize(4, 0)
    assert mgr.free_slots(0) == 0
    return kv


# ---- typed results ------------------------------------------------------------------------


def test_resize_result_is_truthy_and_names_the_failure(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(4,), full=True))
    kv = full_gpu(mgr)
    ok = kv.resize(4, 1)
    assert isinstance(ok, ResizeResult) and ok and ok.ok and ok.error is None
    ok.raise_for_failure()  # success: nothing to raise
    before = mgr.snapshot()
    failed = kv.resize(6, 1)
    assert isinstance(failed, ResizeResult) and not failed and not failed.ok
    assert failed.error == "OutOfPagesError" and "level 0" in failed.reason
    assert mgr.snapshot() == before  # rolled back
    with pytest.raises(OutOfPagesError, match=re.escape(failed.reason)):
        failed.raise_for_failure()
    with pytest.raises(dataclasses.FrozenInstanceError):
        failed.ok = True  # type: ignore[misc]


@pytest.mark.parametrize("fault", ["alloc", "copy"])
def test_resume_and_pressure_results_name_injected_faults(make_mgr: Any, fault: str) -> None:
    mgr = make_mgr(swa_config(window=8, slots=(4, 4)))
    a = active(mgr, 0)
    assert a.resize(8, 0)  # 4 pages: the GPU is full
    a.suspend()  # HELD pages: evictable by a migration to host
    before = mgr.snapshot()
    inject = mgr.inject_allocation_failure if fault == "alloc" else mgr.inject_copy_failure
    want = InjectedAllocationError if fault == "alloc" else CopyFailedError
    inject()
    pressed = mgr.pressure(0, 0, 1)
    assert isinstance(pressed, PressureResult) and not pressed
    assert pressed.error == want.__name__ and isinstance(pressed.exception, want)
    assert mgr.snapshot() == before
    assert mgr.pressure(0, 0, 1)  # the fault fired once: now it works (one page to host)
    inject()
    resumed = a.resume()  # brings the page back: the allocation or the copy fails
    assert isinstance(resumed, ResumeResult) and not resumed and resumed.error == want.__name__
    with pytest.raises(want):
        resumed.raise_for_failure()
    assert mgr.snapshot() != before and a.resume()
    assert_clean(mgr)


def test_every_result_form_compares_the_same_in_the_lockstep_adapter() -> None:
    """The adapter compares a bool, a typed result and the raised capacity failure as the
    model's True/False; a usage error by its category."""
    model_false, model_true = outcome_of(_model_run(False)), outcome_of(_model_run(True))
    exc = OutOfPagesError("no free slot")
    forms: list[tuple[Callable[[], Any], Outcome]] = [
        (lambda: False, model_false),
        (lambda: ResizeResult.failed(exc), model_false),
        (lambda: ResizeResult.failed(exc).raise_for_failure(), model_false),
        (lambda: True, model_true),
        (lambda: ResizeResult(True), model_true),
        (lambda: PressureResult(True), model_true),
    ]
    for call, want in forms:
        got = impl_outcome(call)
        assert got.same_as(want), (got, want)
    failed = impl_outcome(lambda: ResizeResult.failed(exc))
    assert "OutOfPagesError" in failed.detail
    refused = impl_outcome(lambda: (_ for _ in ()).throw(CapacityError("x", parameter="n")))
    assert refused.same_as(Outcome("error", "capacity"))


def _model_run(ok: bool) -> Any:
    """A model `pressure` that succeeds (True) or runs out of pages (False)."""
    model = Model(swa_config(window=3, slots=(4,), max_blocks=4))
    if not ok:
        model.run("create", {"seq": 0, "prompt": []})
        assert model.run("resume", {"seq": 0}).value is True
        model.run("fail_allocation", {})
        result = model.run("resize", {"seq": 0, "capacity": 2, "history": 0})
        assert result.value is False
        return result
    result = model.run("pressure", {"level": 0, "pool_group": 0, "slots": 1})
    assert result.value is True
    return result


def test_event_log_writes_typed_results_as_bools() -> None:
    buf = io.StringIO()
    mgr = KVCacheManager(swa_config(window=3, slots=(4,), full=True), event_log=buf)
    kv = full_gpu(mgr)
    failed = kv.resize(6, 1)
    assert isinstance(failed, ResizeResult) and failed.error == "OutOfPagesError"
    pressed = mgr.pressure(0, 0, 0)
    assert isinstance(pressed, PressureResult) and pressed
    mgr.shutdown()
    rows = [json.loads(line) for line in buf.getvalue().splitlines()]
    results = {(r["action"], r["params"].get("capacity")): r["result"]
               for r in rows if "action" in r}
    assert results[("resume", None)] is True
    assert results[("resize", 4)] is True and results[("resize", 6)] is False
    assert results[("pressure", None)] is True


# ---- read-only views ----------------------------------------------------------------------


def test_slot_counts_pages_and_queues_agree_with_the_snapshot(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=8, slots=(4, 4)))
    kv = active(mgr, 0)
    assert kv.resize(6, 0)
    kv.suspend()
    assert mgr.pressure(0, 0, 2)  # one of the 3 HELD pages migrates to host
    snap = mgr.snapshot()
    counts = mgr.slot_counts()
    assert counts == tuple(SlotCount(s["level"], s["pool_group"], len(s["free"]), s["capacity"])
                           for s in snap["slots"])
    assert [c.free for c in counts] == [mgr.free_slots(c.level, c.pool_group) for c in counts]
    assert counts[0].used == 2 and counts[1].used == 1
    assert [p.page_id for p in mgr.pages()] == [p["id"] for p in snap["pages"]]
    for info, raw in zip(mgr.pages(), snap["pages"], strict=True):
        assert (info.level, info.slot, info.status, info.holds) == (
            raw["level"], raw["slot"], raw["status"], raw["holds"])
        assert mgr.page(info.page_id) == info
    assert mgr.page(mgr.pages_created) is None  # not issued yet
    assert mgr.pages_created == 3
    for q in snap["queues"]:
        assert mgr.eviction_order(q["level"], q["pool_group"]) == tuple(q["order"])
    with pytest.raises(AttributeError):
        counts[0].free = 9


def test_block_table_entries_and_committed_tokens(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(12, 12), full=True, max_blocks=8))
    kv = active(mgr, 0)
    assert kv.resize(8, 0)
    kv.commit([7, 8, 9])
    tokens = kv.committed_tokens
    assert tokens == (7, 8, 9) and isinstance(tokens, tuple)
    assert kv.resize(8, 6)  # swa blocks 0, 1 leave the window (start = 6 + 1 - 3 = 4)
    for lc in (0, 1):
        row = kv.block_table(lc)
        assert len(row) == kv.num_blocks == 4
        assert row == tuple(int(x) for x in kv.page_table(lc)[:4])
        entries = kv.block_entries(lc)
        assert [e.block for e in entries] == [0, 1, 2, 3]
        for e, slot in zip(entries, row, strict=True):
            s, end = kv.stale_range(lc)
            assert e.stale == (s <= e.block < end)
            assert (slot != BAD_PAGE_INDEX) == e.locked
            if e.locked:
                assert e.slot == slot and e.level == 0
            if e.page_id is not None:
                info = mgr.page(e.page_id)
                assert info is not None and (info.level, info.slot) == (e.level, e.slot)
    assert [e.stale for e in kv.block_entries(0)] == [True, True, False, False]
    held = kv.block_entries(0)[1]  # block 1: uncommitted, stale, held for a later commit
    assert held.page_id is not None and not held.locked
    assert not any(e.stale for e in kv.block_entries(1))  # full attention
    assert mgr.prefix_blocks() == 1  # one full block of 2 tokens committed


def test_next_window_change_bounds_the_stale_ranges(make_mgr: Any) -> None:
    cfg = swa_config(window=5, slots=(16, 16), sink=2, max_blocks=32)
    mgr = make_mgr(cfg)
    kv = active(mgr, 0)
    kv.stop_committing()
    lc = cfg.life_cycles[0]
    t = cfg.tokens_per_block
    h = 0
    while h < 40:
        nxt = kv.next_window_change
        assert nxt > h == kv.history_length
        # Below the bound the stale blocks are the current ones: no block leaves the window.
        assert all(set(range(*stale_range(lc, x, t))) == set(range(*kv.stale_range(0)))
                   for x in range(h, nxt))
        target = min(nxt, 40)
        assert kv.resize(target + 1, target)
        h = target
    assert set(range(*kv.stale_range(0))) == set(range(*stale_range(lc, 40, t)))


def test_pocket_entries_show_slots_and_validity(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(5, 4), pocket=True, evict_parked="migrate"))
    a = active(mgr, 0)
    a.stop_committing()
    for h in range(5):
        assert a.resize(h + 1, h)
    (entry,) = a.pocket_entries(0)
    info = mgr.page(entry.page_id)
    assert info is not None and info.pocket_owner == 0
    assert (entry.level, entry.pool_group, entry.slot, entry.valid) == (0, 0, info.slot, True)
    assert a.pocket_pages(0) == [entry.page_id]
    b = active(mgr, 1)
    b.stop_committing()
    assert b.resize(6, 2)  # the parked page is evicted to host: its GPU slot is gone
    (moved,) = a.pocket_entries(0)
    assert moved.page_id == entry.page_id and moved.level == 1 and not moved.valid
    a.suspend()  # drains the pocket
    assert a.pocket_entries(0) == ()


def test_complete_stream_runs_queued_work_and_is_logged() -> None:
    buf = io.StringIO()
    mgr = KVCacheManager(swa_config(window=8, slots=(4, 4)), backend_options={"eager": False},
                         event_log=buf)
    kv = active(mgr, 0)
    assert kv.resize(8, 0)
    kv.suspend()
    assert mgr.pressure(0, 0, 2)  # two copies to host, queued on the copy stream
    assert mgr.complete_stream("copy") >= 2
    assert mgr.complete_stream("copy") == 0  # nothing left
    assert mgr.complete_stream(0) >= 0
    before = mgr.snapshot()
    for bad in (7, -1, "gpu", None, True):
        with pytest.raises(UnknownSequenceError, match="complete_stream: stream must be"):
            mgr.complete_stream(bad)  # type: ignore[arg-type]
    assert mgr.snapshot() == before
    mgr.shutdown()
    advances = [json.loads(x)["params"]["stream"] for x in buf.getvalue().splitlines()
                if '"advance"' in x]
    assert advances == ["copy", "copy", 0]


# ---- create after close, and the sequence limit, as the model has them --------------------


def _free_counts(model: Model) -> tuple[int, ...]:
    cfg = model.cfg
    return tuple(sum(model.state.slot_owner[i] == NONE for i in model.layout.slot_range(lv, g))
                 for lv in range(cfg.num_levels) for g in range(cfg.num_pool_groups))


def _run_both(mgr: KVCacheManager, model: Model, action: str, params: dict[str, Any]
              ) -> Outcome:
    """One API call on both sides (implementation id == model slot); their outcomes and
    free-slot counts must agree."""
    seq = params.get("seq")

    def call() -> Any:
        if action == "create":
            return mgr.create(params["seq"], params["prompt"])
        rest = [v for k, v in params.items() if k != "seq"]
        if seq is None:
            return getattr(mgr, action)(*rest)
        return getattr(mgr.get(seq), action)(*rest)

    got = impl_outcome(lambda: None if action == "create" and call() else call())
    want = outcome_of(model.run(action, params))
    assert got.same_as(want), f"{action}{params}: implementation {got}, model {want}"
    assert tuple(c.free for c in mgr.slot_counts()) == _free_counts(model), (action, params)
    if (isinstance(seq, int) and 0 <= seq < model.cfg.num_sequences
            and model.state.seq_status[seq] != SeqStatus.FREE):  # created on both sides
        assert mgr.get(seq).status == SeqStatus(model.state.seq_status[seq])
    return got


def _pair(cfg: KVConfig) -> tuple[KVCacheManager, Model]:
    return KVCacheManager(cfg), Model(cfg)


def test_create_after_close_agrees_with_the_model() -> None:
    mgr, model = _pair(swa_config(window=3, slots=(8, 8), full=True, max_blocks=4))
    steps: list[tuple[str, dict[str, Any]]] = [
        ("create", {"seq": 0, "prompt": []}),
        ("resume", {"seq": 0}),
        ("resize", {"seq": 0, "capacity": 4, "history": 0}),
        ("commit", {"seq": 0, "tokens": [1, 2, 3, 4]}),
        ("create", {"seq": 0, "prompt": []}),  # in use: sequence_state on both sides
        ("close", {"seq": 0}),
        ("close", {"seq": 0}),  # idempotent
        ("resume", {"seq": 0}),  # closed: sequence_state
        ("create", {"seq": 0, "prompt": [1, 2, 3, 4, 5]}),  # after close: a fresh sequence
        ("resume", {"seq": 0}),
        ("resize", {"seq": 0, "capacity": 6, "history": 4}),
        ("close", {"seq": 0}),
        ("create", {"seq": 0, "prompt": []}),
    ]
    first: KVCache | None = None
    for action, params in steps:
        _run_both(mgr, model, action, params)
        if first is None:
            first = mgr.get(0)
    kv = mgr.get(0)
    assert kv is not first and first is not None
    assert first.status is SeqStatus.CLOSED  # the old handle stays closed
    with pytest.raises(SequenceClosedError):
        first.resize(2, 0)
    assert kv.status is SeqStatus.SUSPENDED and kv.committed_tokens == ()
    assert_clean(mgr)


def test_sequence_limit_is_a_sequence_state_error_as_in_the_model() -> None:
    cfg = swa_config(window=3, slots=(8, 8), max_blocks=4)
    mgr, model = _pair(cfg)
    for seq in range(cfg.num_sequences):
        _run_both(mgr, model, "create", {"seq": seq, "prompt": []})
    # Every model slot is in use: creating any of them is refused, as a fifth id is here.
    want = outcome_of(model.run("create", {"seq": 0, "prompt": []}))
    before = mgr.snapshot()
    with pytest.raises(TooManySequencesError) as info:
        mgr.create(99)
    assert Outcome("error", info.value.category).same_as(want)
    assert info.value.parameter == "seq_id" and "num_sequences = 4" in str(info.value)
    assert mgr.snapshot() == before and mgr.open_sequences() == (0, 1, 2, 3)
    assert_clean(mgr)
    _run_both(mgr, model, "close", {"seq": 2})
    assert mgr.create(99).status is SeqStatus.SUSPENDED  # a slot is free again
    assert mgr.open_sequences() == (0, 1, 3, 99)


# ---- bad input: usage errors naming the parameter, nothing changed -------------------------

BadCall = Callable[[Any, Any], Any]  # deliberately ill-typed calls
BAD_INPUTS: list[tuple[str, BadCall, type[UsageError], str, dict[str, Any] | None]] = [
    # (case id, call, error class, parameter, the model's action for the same misuse)
    ("create-negative-id", lambda m, k: m.create(-1), UnknownSequenceError, "seq_id",
     {"action": "create", "params": {"seq": -1, "prompt": []}}),
    ("create-huge-id", lambda m, k: m.create(2**63), UnknownSequenceError, "seq_id", None),
    ("create-str-id", lambda m, k: m.create("3"), UnknownSequenceError, "seq_id", None),
    ("create-bool-id", lambda m, k: m.create(True), UnknownSequenceError, "seq_id", None),
    ("create-none-id", lambda m, k: m.create(None), UnknownSequenceError, "seq_id", None),
    ("create-open-id", lambda m, k: m.create(0), UsageError, "seq_id",
     {"action": "create", "params": {"seq": 0, "prompt": []}}),
    ("prompt-none", lambda m, k: m.create(5, None), CapacityError, "prompt_tokens", None),
    ("prompt-int", lambda m, k: m.create(5, 7), CapacityError, "prompt_tokens", None),
    ("prompt-str", lambda m, k: m.create(5, "abc"), CapacityError, "prompt_tokens", None),
    ("prompt-float", lambda m, k: m.create(5, [1, 2.0]), CapacityError, "prompt_tokens", None),
    ("prompt-huge", lambda m, k: m.create(5, [2**70]), CapacityError, "prompt_tokens", None),
    ("prompt-bool", lambda m, k: m.create(5, [True]), CapacityError, "prompt_tokens", None),
    ("get-unknown", lambda m, k: m.get(42), UnknownSequenceError, "seq_id", None),
    ("get-list", lambda m, k: m.get([0]), UnknownSequenceError, "seq_id", None),
    ("resize-str", lambda m, k: k.resize("8", 0), CapacityError, "capacity", None),
    ("resize-float", lambda m, k: k.resize(8.0, 0), CapacityError, "capacity", None),
    ("resize-huge", lambda m, k: k.resize(2**70, 2), CapacityError, "capacity",
     {"action": "resize", "params": {"seq": 0, "capacity": 2**70, "history": 2}}),
    ("resize-negative-history", lambda m, k: k.resize(8, -1), CapacityError, "history_length",
     {"action": "resize", "params": {"seq": 0, "capacity": 8, "history": -1}}),
    ("resize-history-down", lambda m, k: k.resize(4, 0), UsageError, "history_length",
     {"action": "resize", "params": {"seq": 0, "capacity": 4, "history": 0}}),
    ("commit-none", lambda m, k: k.commit(None), CapacityError, "tokens", None),
    ("commit-float", lambda m, k: k.commit([1.5]), CapacityError, "tokens", None),
    ("commit-over", lambda m, k: k.commit([1] * 9), CapacityError, "tokens",
     {"action": "commit", "params": {"seq": 0, "tokens": [1] * 9}}),
    ("lc-negative", lambda m, k: k.block_table(-1), UnknownLifeCycleError, "", None),
    ("lc-bool", lambda m, k: k.block_entries(True), UnknownLifeCycleError, "", None),
    ("lc-past-end", lambda m, k: k.pocket_entries(2), UnknownLifeCycleError, "", None),
    ("pressure-huge", lambda m, k: m.pressure(0, 0, 2**70), CapacityError, "n",
     {"action": "pressure", "params": {"level": 0, "pool_group": 0, "slots": 2**70}}),
    ("pressure-negative", lambda m, k: m.pressure(0, 0, -1), CapacityError, "n",
     {"action": "pressure", "params": {"level": 0, "pool_group": 0, "slots": -1}}),
    ("pressure-str", lambda m, k: m.pressure(0, 0, "1"), CapacityError, "n", None),
    ("pressure-level", lambda m, k: m.pressure(-1, 0, 1), UnknownLevelError, "level",
     {"action": "pressure", "params": {"level": -1, "pool_group": 0, "slots": 1}}),
    ("pressure-group", lambda m, k: m.pressure(0, 3, 1), UnknownLevelError, "pool_group",
     {"action": "pressure", "params": {"level": 0, "pool_group": 3, "slots": 1}}),
    ("pressure-none-level", lambda m, k: m.pressure(None, 0, 1), UnknownLevelError, "level",
     None),
    ("free-slots-level", lambda m, k: m.free_slots(5), UnknownLevelError, "level", None),
    ("queue-group", lambda m, k: m.eviction_order(0, -1), UnknownLevelError, "pool_group", None),
]


@pytest.mark.parametrize(("case", "call", "exc", "parameter", "model"), BAD_INPUTS,
                         ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_a_usage_error_naming_the_parameter(
        case: str, call: BadCall, exc: type[UsageError], parameter: str,
        model: dict[str, Any] | None) -> None:
    cfg = swa_config(window=3, slots=(8, 8), full=True, max_blocks=4)
    mgr, spec = _pair(cfg)
    kv = mgr.create(0)
    spec.run("create", {"seq": 0, "prompt": []})
    for m_action, params in (("resume", {"seq": 0}),
                             ("resize", {"seq": 0, "capacity": 8, "history": 2})):
        assert spec.run(m_action, params).value is True
    assert kv.resume() and kv.resize(8, 2)
    before = mgr.snapshot()
    with pytest.raises(exc) as info:
        call(mgr, kv)
    err = info.value
    assert isinstance(err, UsageError) and err.category is not None
    assert type(err).__module__ == "kvpocket.impl.exceptions"  # never a bare TypeError
    if parameter:
        assert err.parameter == parameter
        assert parameter in str(err), str(err)
    assert mgr.snapshot() == before  # nothing changed ...
    assert_clean(mgr)  # ... and nothing is corrupted
    if model is not None:  # the model refuses the same misuse with the same category
        want = outcome_of(spec.run(model["action"], model["params"]))
        assert Outcome("error", err.category).same_as(want), (err.category, want)
    assert kv.resize(8, 3)  # the manager still works


@pytest.mark.parametrize("slot_elems", [0, -1, True, 2.5, 2**30])
def test_manager_construction_rejects_bad_slot_elems(slot_elems: Any) -> None:
    with pytest.raises(CapacityError, match="slot_elems must be an int") as info:
        KVCacheManager(swa_config(), slot_elems=slot_elems)
    assert info.value.parameter == "slot_elems"
    with pytest.raises(TypeError, match="cfg must be a KVConfig"):
        KVCacheManager("tiny")  # type: ignore[arg-type]


def test_default_slot_elems_fit_the_decode_oracle_at_32_tokens_per_block() -> None:
    from kvpocket.verify.oracles.data import DecodeOracle

    cfg = dataclasses.replace(swa_config(window=40, slots=(8,), max_blocks=4),
                              tokens_per_block=32)
    mgr = KVCacheManager(cfg)
    assert mgr.slot_elems == 32
    oracle = DecodeOracle(mgr)  # refused slot_elems = 8 before
    kv = active(mgr, 0)
    kv.stop_committing()
    for _ in range(40):
        assert oracle.decode_step(kv)
    assert oracle.check() == [] and oracle.missing == []


# ---- the shutdown report ------------------------------------------------------------------


def test_clean_shutdown_report(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(6, 6)))
    kv = active(mgr, 0)
    assert kv.resize(4, 1)
    kv.close()
    report = mgr.shutdown()
    assert isinstance(report, ShutdownReport) and not report and not report.corrupted
    assert report.corruption == () and not report.leaks
    report.raise_if_unclean()
    assert str(report).startswith("clean")


def test_leaking_shutdown_report_and_raise_on_leak(make_mgr: Any) -> None:
    mgr = make_mgr(swa_config(window=3, slots=(6, 6)))
    kv = active(mgr, 3)
    assert kv.resize(4, 1)
    report = mgr.shutdown()
    assert report and not report.corrupted and report.open_sequences == (3,)
    assert {p.owner for p in report.pages} == {3} and report.orphan_slots == ()
    with pytest.raises(LeakError, match=r"open sequences \[3\]"):
        report.raise_if_unclean()
    mgr2 = make_mgr(swa_config())
    assert active(mgr2, 0).resize(2, 0)
    with pytest.raises(LeakError):
        mgr2.shutdown(raise_on_leak=True)


def test_capacity_failures_are_not_usage_errors() -> None:
    assert issubclass(OutOfPagesError, CapacityFailure)
    assert not issubclass(OutOfPagesError, UsageError)
    assert OutOfPagesError.category is None


def test_the_adapter_guide_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/adapter-guide.md's example uses public names only, and runs."""
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[2] / "docs" / "adapter-guide.md").read_text()
    section = guide.split("### Example", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "._" not in code and ".storage" not in code and ".seqs" not in code
    exec(compile(code, "adapter-guide.md", "exec"), {})
    out = capsys.readouterr().out
    assert "block table" in out and "capacity prompt_tokens create:" in out


def test_cupy_backend_without_a_gpu_is_a_clear_refusal() -> None:
    from kvpocket.impl import BackendUnavailableError, gpu_available, make_backend

    if gpu_available():
        pytest.skip("a usable CUDA GPU is present: the refusal path cannot be taken")
    with pytest.raises(BackendUnavailableError, match=r"backend 'cupy'.*kvpocket\[cuda\]"):
        make_backend("cupy")
