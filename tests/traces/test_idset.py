"""`IdRuns` is a set of ints: checked against Python's set on random operations, and its
memory follows the runs, not the ids (a server's closed ids are one run)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvpocket.verify.traces.idset import IdRuns


@given(st.lists(st.tuples(st.booleans(), st.integers(-5, 40)), max_size=80))
def test_idruns_is_a_set(ops: list[tuple[bool, int]]) -> None:
    runs, ref = IdRuns(), set()
    for add, x in ops:
        if add:
            runs.add(x)
            ref.add(x)
        else:
            runs.discard(x)
            ref.discard(x)
        assert len(runs) == len(ref)
    assert all((x in runs) == (x in ref) for x in range(-6, 42))
    assert "3" not in runs


def test_increasing_ids_are_one_run() -> None:
    runs = IdRuns()
    for x in range(100_000):
        runs.add(x)
    runs.discard(500)
    assert runs.runs == 2 and len(runs) == 99_999 and 500 not in runs and 501 in runs
