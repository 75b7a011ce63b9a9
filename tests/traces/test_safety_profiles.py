"""Safety apart from policy in `kvpocket trace check`: a manager with another eviction
order is accepted under the safety spec (`order=any`) and rejected under the `lru`
profile; a manager that evicts a locked page is rejected under both; a log without
choices is searched, not judged by the model's own picks."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from kvpocket.impl.eviction import EvictionQueue
from kvpocket.impl.manager import KVCacheManager
from kvpocket.model.config import KVConfig, Order
from kvpocket.verify.presets import preset
from kvpocket.verify.traces.record import Workload
from kvpocket.verify.traces.trace import END_KEY, read_events, with_end_marker
from kvpocket.verify.traces.tracecheck import TraceVerdict, check_events


class MostRecentFirst:
    """A victim policy unlike the model's LRU: the page queued last goes first (within
    the queue's level and pool group, whatever its priority)."""

    def choose(self, level: int, pool_group: int, queue: EvictionQueue) -> int | None:
        if not queue.entries:
            return None
        return max(queue.entries.items(), key=lambda kv: kv[1][1])[0]


def _record_mru(path: Path, cfg: KVConfig, seed: int, steps: int = 200) -> Path:
    with path.open("w") as out:
        mgr = KVCacheManager(cfg, backend="numpy", slot_elems=max(8, cfg.tokens_per_block),
                             backend_options={"eager": False}, event_log=out,
                             victim_policy=MostRecentFirst())
        w = Workload(mgr, random.Random(seed))
        for _ in range(steps):
            w.step()
        assert mgr.events is not None
        mgr.events.close()
    return path


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert END_KEY in rows[-1]
    return rows[:-1]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("\n".join(with_end_marker(json.dumps(r) for r in rows)) + "\n")
    return path


def _check(path: Path, order: str | None = None) -> TraceVerdict:
    log = read_events(path)
    cfg = log.config if order is None else log.config.with_order(order)
    return check_events(log, cfg, str(path))


CASES = [("tiny", "revalidate"), ("three-level", "revalidate"), ("split-pools", "pin")]


def _mru_log(tmp_path: Path, name: str, policy: str) -> Path:
    """An MRU manager's log whose victims differ from LRU's somewhere (the LRU check
    rejects it), from the first seed that gets there."""
    cfg = preset(name).with_pocket(True, policy)
    for seed in range(10):
        path = _record_mru(tmp_path / f"mru-{name}-{seed}.ndjson", cfg, seed)
        if not _check(path, "lru").ok:
            return path
    raise AssertionError(f"{name}: the MRU manager never evicted out of LRU order")


@pytest.mark.parametrize(("name", "policy"), CASES, ids=[n for n, _ in CASES])
def test_another_eviction_order_is_safe_but_not_lru(tmp_path: Path, name: str,
                                                    policy: str) -> None:
    path = _mru_log(tmp_path, name, policy)
    safe = _check(path)
    assert safe.ok, safe.report
    assert safe.order == "any" and safe.compared["choices"] > 0
    lru = _check(path, "lru")
    assert lru.kind == "the model rejects the log's choice", lru.report
    assert "not the head of its queue (order=lru)" in lru.report


def test_kvpocket_logs_pass_both_profiles(tmp_path: Path) -> None:
    """kvpocket's own manager is the `lru` engine: its logs fit that profile and the
    safety spec. This run reaches a cascade where the engine declines to make room on
    host (its queue head there cannot leave) and fails the call for a HELD victim, while
    another host page could have left: under the safety spec making room below is the
    manager's call, read off its next victim label."""
    from kvpocket.verify.traces.record import record

    path = tmp_path / "lru.ndjson"
    record(preset("three-level"), 450, 5, path)
    declined = [r for r in _rows(path)[1:] if r.get("result") is False
                and [c[1][0] for c in r["choices"] if c[0] == "victim"][-1:] == [0]]
    assert declined, "the run has a call that fails after a GPU victim it could not move"
    for order in ("any", "lru"):
        result = _check(path, order)
        assert result.ok, result.report
        assert result.order == order


def _locked_victim(rows: list[dict[str, Any]]) -> tuple[int, list[int]]:
    """(line, location) of a GPU victim choice and a page of the same event's sequence
    that stays locked through it (in its index before and after): a victim it must not
    take."""
    for i in range(2, len(rows)):
        r = rows[i]
        victims = [c for c in r.get("choices", []) if c[0] == "victim" and c[1][0] == 0]
        seq = r["params"].get("seq")
        if not victims or seq is None or r.get("result") is not True:
            continue
        before = next((p for p in reversed(rows[1:i]) if p["params"].get("seq") == seq
                       and "observed" in p), None)
        if before is None:
            continue
        for lc, row in enumerate(before["observed"].get("index", [])):
            after = r["observed"]["index"][lc] if lc < len(r["observed"]["index"]) else []
            kept = [x for x in row if x >= 0 and x in after]
            if kept:
                victim = victims[0][1]
                return i + 1, [0, victim[1], kept[0]]
    raise AssertionError("no eviction next to a locked page")


@pytest.mark.parametrize("order", ["any", "lru"])
def test_evicting_a_locked_page_is_rejected_under_both(tmp_path: Path, order: str) -> None:
    """kvpocket's own (LRU) log fits both profiles up to the edited line, where the
    victim becomes a page its sequence holds locked."""
    from kvpocket.verify.traces.record import record

    path = tmp_path / "lru.ndjson"
    record(preset("tiny").with_pocket(True, "revalidate"), 200, 0, path)
    rows = _rows(path)
    line, where = _locked_victim(rows)
    victim = next(c for c in rows[line - 1]["choices"] if c[0] == "victim" and c[1][0] == 0)
    victim[1] = where
    result = _check(_write(tmp_path / "locked.ndjson", rows), order)
    assert not result.ok and result.line == line, result.report
    assert result.kind == "the model rejects the log's choice"
    assert f"the page at [{where[0]}, {where[1]}, {where[2]}] in the model is LOCKED" \
        in result.report


def _without_choices(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rows[0], *({k: v for k, v in r.items() if k != "choices"} for r in rows[1:])]


def test_without_choices_the_checker_searches(tmp_path: Path) -> None:
    """An MRU log with its choices left out (results and observed state kept) is accepted
    under the safety spec: the checker tries every victim the spec allows, takes the slots
    the observed page index shows, and keeps the model states that fit."""
    rows = _rows(_mru_log(tmp_path, "tiny", "revalidate"))
    result = _check(_write(tmp_path / "no-choices.ndjson", _without_choices(rows)))
    assert result.ok, result.report
    assert result.without_choices > 0 and result.compared["choices"] == 0
    assert "events logged no choices" in result.summary()


def test_a_wrong_observation_without_choices_is_rejected(tmp_path: Path) -> None:
    """The search does not accept everything: an observed free count no victim choice
    explains is still reported, on its line."""
    rows = _rows(_mru_log(tmp_path, "tiny", "revalidate"))
    line = next(i + 1 for i, r in enumerate(rows) if i > 0
                and any(c[0] == "victim" for c in r.get("choices", []))
                and r.get("observed", {}).get("free"))
    bad = _without_choices(rows)
    obs = dict(bad[line - 1]["observed"])
    obs["free"] = [[lv, g, n + 1] for lv, g, n in obs["free"]]
    bad[line - 1] = {**bad[line - 1], "observed": obs}
    result = _check(_write(tmp_path / "bad-free.ndjson", bad))
    assert not result.ok and result.line == line, result.report
    assert "observed post-state differs" in result.report


def test_order_is_part_of_the_configuration() -> None:
    cfg = preset("tiny")
    assert cfg.order is Order.ANY
    lru = cfg.with_order("lru")
    assert lru.order is Order.LRU and lru.max_pages == cfg.max_pages
    assert KVConfig.from_json(lru.to_json()) == lru
    data = lru.to_json()
    del data["order"]
    assert KVConfig.from_json(data).order is Order.ANY  # logs written before it existed
    with pytest.raises(ValueError, match="invalid config field 'order': expected one of any, lru"):
        KVConfig.from_json({**data, "order": "mru"})


def _clash_log(path: Path, clash: list[list[Any]], hit: list[list[Any]]) -> Path:
    """Two sequences compute the same block; the second commit clashes (`clash` choices as
    given), then it commits on; a third sequence's prompt hits the block (`hit` choices)."""
    from kvpocket.model.config import LifeCycle, PocketConfig

    cfg = KVConfig(tokens_per_block=2, life_cycles=(LifeCycle("full"),), slots_per_level=(6,),
                   num_sequences=3, max_blocks=3, pocket=PocketConfig(enabled=False))
    ev = [("create", {"seq": 0, "prompt": []}, None, []),
          ("resume", {"seq": 0}, True, []),
          ("resize", {"seq": 0, "capacity": 2, "history": 0}, True, [["slot", 0]]),
          ("commit", {"seq": 0, "tokens": [1, 2]}, None, []),
          ("create", {"seq": 1, "prompt": []}, None, []),
          ("resume", {"seq": 1}, True, []),
          ("resize", {"seq": 1, "capacity": 3, "history": 0}, True, [["slot", 1], ["slot", 2]]),
          ("commit", {"seq": 1, "tokens": [1, 2]}, None, clash),
          ("commit", {"seq": 1, "tokens": [3]}, None, []),
          ("create", {"seq": 2, "prompt": [1, 2]}, None, hit),
          ("resume", {"seq": 2}, True, [])]
    rows: list[dict[str, Any]] = [{"kvpocket_trace": 1, "kind": "events",
                                   "config": cfg.to_json()}]
    rows += [{"action": a, "params": p, "result": r, "choices": c} for a, p, r, c in ev]
    rows[-1]["observed"] = {"index": [[int(hit[0][1][2]) if hit else 0]]}
    return _write(path, rows)


def test_a_block_cached_twice_is_safe_under_the_safety_spec_only(tmp_path: Path) -> None:
    """vLLM caches a recomputed block again (`clash` "cache") and a later hit reuses one
    of the copies (`hit`): legal under `order=any`, not under kvpocket's `lru` profile."""
    twice = _clash_log(tmp_path / "twice.ndjson", [["clash", "cache"]], [["hit", [0, 0, 1]]])
    assert _check(twice).ok, _check(twice).report
    assert not _check(twice, "lru").ok
    # the other copy is legal too; the log's index must then name it
    first = _clash_log(tmp_path / "first.ndjson", [["clash", "cache"]], [["hit", [0, 0, 0]]])
    assert _check(first).ok, _check(first).report
    # no clash choice reads as "stop": committing on is then refused by the model
    stopped = _check(_clash_log(tmp_path / "stop.ndjson", [], []))
    assert not stopped.ok and stopped.kind == "different result" and stopped.line == 10
    # a hit on a copy that does not exist is rejected on its line
    bad = _check(_clash_log(tmp_path / "bad.ndjson", [["clash", "cache"]], [["hit", [0, 0, 2]]]))
    assert not bad.ok and bad.kind == "the model rejects the log's choice" and bad.line == 11
