"""Hand-computed scenarios of the reference model."""

from __future__ import annotations

import pytest

from kvpocket.model import Model
from kvpocket.model.config import GPU_LEVEL, NONE, PocketPolicy, SeqStatus
from kvpocket.model.errors import GuardViolation, HistoryDecreaseError, SequenceStateError
from kvpocket.verify.presets import decode_config


def start_decoding(m: Model, seq: int = 0) -> None:
    m.create(seq)
    assert m.resume(seq)
    m.stop_committing(seq)  # uncommitted generation: the only case the pocket applies to


def actions(m: Model) -> list[str]:
    return [s.action for s in m.last_steps if not s.action.startswith("set_")]


@pytest.mark.parametrize("enabled", [True, False])
def test_steady_state_decode_allocator_traffic(enabled: bool) -> None:
    m = Model(decode_config(enabled=enabled, slots=(8,), blocks=40))
    start_decoding(m)
    crossings, allocs, releases = 0, 0, 0
    slots_seen: set[int] = set()
    for h in range(1, 70):
        assert m.resize(0, h + 1, h)
        assert m.violations() == []
        steps = actions(m)
        if h >= 10 and h % 2 == 0:  # t=2: every other step crosses a block boundary
            crossings += 1
            allocs += steps.count("allocate")
            releases += steps.count("release")
            slots_seen |= {m.state.slot[p] for p in range(m.layout.pages) if m.state.alive[p]}
        elif h >= 10:
            assert "allocate" not in steps and "release" not in steps
    assert crossings > 20
    if enabled:
        # One page parked per crossing and popped by the next: no allocator traffic at all.
        assert (allocs, releases) == (0, 0)
        assert len(slots_seen) == 3  # the window's 3 blocks rotate over 3 physical slots
    else:
        assert (allocs, releases) == (crossings, crossings)
        assert len(slots_seen) >= 3  # the model's allocator picks the lowest free id


def test_phase_offset_parked_page_waits() -> None:
    # w=6, t=4: (w-1) mod t = 1, so block b retires at h = 4b+9 but new blocks start at
    # h = 4b': the parked page waits 3 steps in the pocket before it is popped.
    m = Model(decode_config(window=6, t=4, slots=(6,), blocks=20))
    start_decoding(m)
    parked_at: dict[int, int] = {}
    waits = []
    for h in range(1, 60):
        assert m.resize(0, h + 1, h)
        for st in m.last_steps:
            if st.action == "park":
                parked_at[st.params["page"]] = h
            if st.action == "pop":
                page = next(p for p in parked_at if m.state.ordinal[p] == st.params["ordinal"]
                            and m.state.alive[p])
                waits.append(h - parked_at.pop(page))
    assert len(waits) >= 8
    assert set(waits) == {3}


@pytest.mark.parametrize("policy", list(PocketPolicy))
def test_migration_during_park(policy: PocketPolicy) -> None:
    m = Model(decode_config(policy=policy, evict_parked="migrate"))  # (drop: test_evict_parked)
    start_decoding(m)
    for h in range(1, 5):
        assert m.resize(0, h + 1, h)
    parked = m.state.pocket[0]
    assert parked != NONE and m.state.level[parked] == GPU_LEVEL
    # Another tenant needs two GPU slots: one is free, the parked page is the only victim.
    moved = m.pressure(GPU_LEVEL, 0, 2)
    assert m.violations() == []
    if policy == PocketPolicy.PIN:
        assert not moved  # pinned pages are not evictable: the tenant is refused instead
        assert m.state.level[parked] == GPU_LEVEL
    else:
        assert moved and m.state.level[parked] == 1  # migrated to host while parked
    assert m.resize(0, 7, 6)
    bad = {i.name for i in m.violations()}
    if policy == PocketPolicy.UNSAFE:
        assert "popped_slots_valid" in bad and "slot_owned_once" in bad
    else:
        assert bad == set()
        if policy == PocketPolicy.REVALIDATE:
            assert "drain" in actions(m) and "allocate" in actions(m)  # refused, allocated


def test_suspend_and_close_drain_the_pocket() -> None:
    m = Model(decode_config(seqs=2, slots=(6, 4)))
    for seq in (0, 1):
        start_decoding(m, seq)
        for h in range(1, 5):
            assert m.resize(seq, h + 1, h)
        assert m.state.pocket[seq * m.layout.pocket_cap] != NONE
    m.suspend(0)
    assert all(p == NONE for p in m.state.pocket[: m.layout.pocket_cap])
    assert m.violations() == []
    assert m.resume(0)
    assert m.resize(0, 7, 6)
    assert "allocate" in actions(m) and "pop" not in actions(m)
    m.close(1)
    assert m.state.seq_status[1] == SeqStatus.CLOSED
    cap = m.layout.pocket_cap
    assert all(p == NONE for p in m.state.pocket[cap : 2 * cap])
    assert not any(m.state.alive[p] and m.state.owner[p] == 1 for p in range(m.layout.pages))
    assert m.violations() == []


def test_out_of_pages_rolls_back_exactly() -> None:
    m = Model(decode_config(slots=(5,)))
    start_decoding(m, 0)
    for h in range(1, 5):
        assert m.resize(0, h + 1, h)
    start_decoding(m, 1)
    assert m.resize(1, 4, 0)  # two more GPU slots: one slot left free
    before = m.state
    assert m.state.pocket[0] != NONE
    # Two new blocks for seq 0: one from the pocket, one needs the allocator, and a third
    # block needs a slot that does not exist.
    assert not m.resize(0, 11, 6)
    assert m.state == before
    m.close(1)
    before = m.state
    m.fail_allocation()
    assert not m.resize(0, 9, 6)  # one block from the pocket, one from the failing allocator
    assert m.state == before  # exact rollback; the injected fault fired and is gone
    assert m.resize(0, 9, 6)


def test_misuse_raises_and_changes_nothing() -> None:
    m = Model(decode_config())
    start_decoding(m)
    assert m.resize(0, 6, 5)
    before = m.state
    with pytest.raises(HistoryDecreaseError):
        m.resize(0, 6, 4)
    with pytest.raises(SequenceStateError):
        m.resume(0)
    with pytest.raises(GuardViolation, match=r"release.*DROPPABLE"):
        m.apply("release", page=0)
    assert m.state == before


def test_prefix_reuse_holds_committed_pages() -> None:
    m = Model(decode_config(window=8, slots=(6, 4), blocks=6))
    m.create(0)
    assert m.resume(0)
    assert m.resize(0, 5, 0)
    m.commit(0, [7, 8, 9, 10, 11])
    committed = {p for p in range(m.layout.pages) if m.state.alive[p] and m.state.committed[p]}
    assert len(committed) == 2  # two full blocks; the fifth token's block stays uncommitted
    m.close(0)
    assert m.violations() == []
    m.create(1, [7, 8, 9, 10, 12])
    assert m.state.capacity[1] == 4 and m.state.committed_tokens[1] == 4
    held = {int(m.state.entry[m.layout.entry_ix(m.ops, 1, 0, o)]) for o in range(2)}
    assert held == committed
    assert m.resume(1)
    assert "allocate" not in actions(m)
    assert m.violations() == []


def test_same_actions_same_state() -> None:
    def run() -> Model:
        m = Model(decode_config(seqs=2))
        for seq in (0, 1):
            start_decoding(m, seq)
        for h in range(1, 12):
            m.resize(h % 2, h + 1, h)
            m.pressure(GPU_LEVEL, 0, h % 3)
        return m
    assert run().state == run().state
