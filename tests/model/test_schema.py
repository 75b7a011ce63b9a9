"""The state schema (`state.SCHEMA`) is `State`'s fields, with Init's lengths and values."""

from __future__ import annotations

from kvpocket.model.config import NO_SLOT, NONE
from kvpocket.model.state import SCHEMA, STATE_FIELDS, Layout
from kvpocket.verify.presets import PRESETS


def test_the_schema_lists_every_field_of_the_state_in_order() -> None:
    assert tuple(f.name for f in SCHEMA) == STATE_FIELDS


def test_domains_and_kinds_match_init_on_every_preset() -> None:
    for name, p in PRESETS.items():
        lay = Layout(p.config)
        init = lay.initial_state()
        sizes = {"page": lay.pages, "slot": lay.total_slots, "seq": lay.seqs,
                 "entry": lay.seqs * lay.lcs * lay.blocks,
                 "pocket": lay.seqs * lay.lcs * lay.pocket_cap}
        for f in SCHEMA:
            v = getattr(init, f.name)
            if f.domain == "concrete":
                assert isinstance(v, tuple), (name, f)
                continue
            values = [v] if f.domain == "scalar" else list(v)
            if f.domain != "scalar":
                assert len(values) == sizes[f.domain], (name, f)
            for x in values:
                assert isinstance(x, bool) == (f.kind == "bool"), (name, f, x)
                if f.kind in ("page", "seq", "slot"):  # an id starts as "none" (Z3's nil)
                    assert x == NONE == NO_SLOT, (name, f, x)
