"""Readable counterexamples: states shown by their non-default parts, and CTIs."""

from __future__ import annotations

from dataclasses import dataclass

from kvpocket.model.config import NONE, CommitState, SeqStatus
from kvpocket.model.state import (
    ARRAY_FIELDS,
    ENTRY_FIELDS,
    PAGE_FIELDS,
    SCALAR_FIELDS,
    SEQ_FIELDS,
    Layout,
    State,
)


def describe_state(lay: Layout, s: State) -> list[str]:
    """One line per page, slot, sequence, block entry or pocket that differs from Init."""
    init = lay.initial_state()
    lines: list[str] = []
    for p in range(lay.pages):
        changed = [f for f in PAGE_FIELDS if getattr(s, f)[p] != getattr(init, f)[p]]
        if not changed:
            continue
        shown = " ".join(_pv(f, getattr(s, f)[p]) for f in PAGE_FIELDS
                         if f in changed or f in ("level", "slot", "lc"))
        lines.append(f"page {p}: {shown}")
    for flat in range(lay.total_slots):
        owner, busy = s.slot_owner[flat], s.slot_busy[flat]
        if owner == init.slot_owner[flat] and busy == init.slot_busy[flat]:
            continue
        lv, pg, sl = lay.slot_coords(flat)
        who = "free" if owner == NONE else f"owner=page {owner}"
        stream = "idle" if busy == -1 else f"busy on stream {busy}"
        lines.append(f"slot (level {lv}, group {pg}, #{sl}): {who}, {stream}")
    for q in range(lay.seqs):
        changed = [f for f in SEQ_FIELDS if getattr(s, f)[q] != getattr(init, f)[q]]
        if not changed:
            continue
        st = s.seq_status[q]
        cs = s.commit_state[q]
        status = SeqStatus(st).name if 0 <= st < len(SeqStatus) else str(st)
        commit = CommitState(cs).name if 0 <= cs < len(CommitState) else str(cs)
        lines.append(f"seq {q}: {status} commit={commit} capacity={s.capacity[q]} "
                     f"history={s.history[q]} committed={s.committed_tokens[q]}")
    for q in range(lay.seqs):
        for lc in range(lay.lcs):
            for o in range(lay.blocks):
                e = q * lay.lcs * lay.blocks + lc * lay.blocks + o
                if all(getattr(s, f)[e] == getattr(init, f)[e] for f in ENTRY_FIELDS):
                    continue
                kind = "lock" if s.entry_locked[e] else "holder"
                lines.append(f"block (seq {q}, lc {lc}, #{o}): {kind} of page {s.entry[e]}, "
                             f"index={s.index[e]}")
            pocket = [s.pocket[i] for i in lay.pocket_range(q, lc)]
            if any(x != NONE for x in pocket):
                lines.append(f"pocket (seq {q}, lc {lc}): {list(pocket)}")
    for f in SCALAR_FIELDS:
        v, d = getattr(s, f), getattr(init, f)
        if v != d:
            lines.append(f"{f}={v}")
    return lines or ["(the initial state)"]


def _pv(name: str, v: object) -> str:
    if isinstance(v, bool):
        return name if v else f"not {name}"
    return f"{name}={v}"


def state_diff(lay: Layout, a: State, b: State) -> list[str]:
    """Field-level changes from a to b."""
    out = []
    for name in (*ARRAY_FIELDS, *SCALAR_FIELDS):
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, tuple):
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                if u != v:
                    out.append(f"{name}[{i}]: {u} -> {v}")
        elif x != y:
            out.append(f"{name}: {x} -> {y}")
    return out


@dataclass
class Cti:
    """A counterexample to induction: a pre-state satisfying the invariants, a step, a
    post-state breaking some of them. Computed on the concrete model from Z3's pre-state."""

    config: str
    action: str
    params: dict[str, int]
    pre: State
    post: State | None  # None when the concrete model does not enable the step
    broken: list[str]
    note: str = ""

    def render(self, lay: Layout) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.params.items())
        out = [f"counterexample to induction [{self.config}]",
               f"  broken: {', '.join(self.broken) or '(none on the concrete model)'}",
               "  pre-state (non-initial parts):"]
        out += [f"    {line}" for line in describe_state(lay, self.pre)]
        out.append(f"  action: {self.action}({shown})")
        if self.post is None:
            out.append("  (the concrete model does not enable this step: encoding mismatch)")
        else:
            out.append("  changes:")
            out += [f"    {line}" for line in state_diff(lay, self.pre, self.post)]
        if self.note:
            out.append(f"  note: {self.note}")
        return "\n".join(out)
