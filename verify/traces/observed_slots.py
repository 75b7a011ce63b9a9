"""The slots a log without `choices` took, read off its observed page index.

An event that records no `choices` names the slots its manager took only through its
observed page index. Trying the observed slots in every order costs n! runs for an
n-block prefill. Instead the checker runs such an event first with the model's own picks
(the lowest free slot each time), reads from that run's page actions which block or page
each pick went to, and looks up the slot the log shows there; then it runs the event
again taking those slots (`wanted_slots`). Both are ordinary runs of the model (a wanted
slot that is not free is not taken), so nothing is accepted that the model could not
do; one run per victim and pocket choice replaces the search over slot orders.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpocket.model.executor import Step
from kvpocket.model.state import Layout, State

# the page actions that take a slot chosen just before them, and the parameter naming it
SLOT_TAKERS = {"allocate": "slot", "evict_begin": "dst_slot", "onboard_begin": "dst_slot"}


def wanted_slots(lay: Layout, pre: State, post: State, steps: Sequence[Step], seq: int,
                 rows: Sequence[Sequence[int]]) -> list[int]:
    """For each slot the run took, in order: the slot the log's observed page index `rows`
    (of sequence `seq`, one row per life cycle) shows for the block it went to, or the
    run's own pick where the log shows none (another level, another sequence's page, a
    block the event moved again)."""
    out = []
    for st in steps:
        param = SLOT_TAKERS.get(st.action)
        if param is None:
            continue
        prm = st.params
        took = prm[param]
        where = None  # (life cycle, block) of `seq` the slot went to, at GPU level
        if st.action == "allocate" and prm["seq"] == seq:
            where = (prm["lc"], prm["ordinal"])
        elif st.action == "onboard_begin":
            page = prm["page"]
            where = (int(pre.lc[page]), int(pre.ordinal[page]))
        want = took
        if where is not None:
            lc, block = where
            e = (seq * lay.lcs + lc) * lay.blocks + block
            row = rows[lc] if lc < len(rows) else []
            if 0 <= block < len(row) and post.index[e] == took:  # still there at the end
                shown = row[block]
                want = shown if isinstance(shown, int) and shown >= 0 else took
        out.append(want)
    return out
