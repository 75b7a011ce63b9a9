"""A log without `choices` is checked from its observed page index alone: the slots a
manager took are read off it (`verify/traces/observed_slots.py`),
not searched in every order, so a prefill of any size checks, and a wrong slot is still
rejected on its line."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pytest

from kvpocket.impl.manager import KVCacheManager
from kvpocket.model.config import KVConfig, PocketConfig, full_life_cycle
from kvpocket.verify.presets import preset
from kvpocket.verify.traces import tracecheck
from kvpocket.verify.traces.record import Workload
from kvpocket.verify.traces.trace import END_KEY, read_events, with_end_marker

PREFILL_BLOCKS = 64


def _rows(text: str) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in text.splitlines()]
    assert END_KEY in rows[-1]
    return rows[:-1]


def _record(cfg: KVConfig, drive: Any) -> list[dict[str, Any]]:
    out = io.StringIO()
    mgr = KVCacheManager(cfg, backend="numpy", slot_elems=max(8, cfg.tokens_per_block),
                         backend_options={"eager": False}, event_log=out)
    drive(mgr)
    assert mgr.events is not None
    mgr.events.close()
    return _rows(out.getvalue())


def _gpu_renamed(rows: list[dict[str, Any]], perm: dict[int, int]) -> list[dict[str, Any]]:
    """The log of a manager whose allocator hands out GPU slots in another order: every GPU
    slot id renamed by `perm`, its choices left out (all free at the start, so renaming
    is a symmetry: the log is as valid as the original)."""
    out = [rows[0]]
    for r in rows[1:]:
        r = {k: v for k, v in r.items() if k != "choices"}
        obs = r.get("observed")
        if obs is not None:
            obs = dict(obs)
            obs["index"] = [[perm.get(x, x) if x >= 0 else x for x in row]
                            for row in obs.get("index", [])]
            obs["pocket"] = [[[lv, pg, perm.get(sl, sl) if lv == 0 else sl]
                              for lv, pg, sl in row] for row in obs.get("pocket", [])]
            r["observed"] = obs
        out.append(r)
    return out


def _check(tmp_path: Path, rows: list[dict[str, Any]]) -> tracecheck.TraceVerdict:
    path = tmp_path / "log.ndjson"
    path.write_text("\n".join(with_end_marker(json.dumps(r) for r in rows)) + "\n")
    log = read_events(path)
    return tracecheck.check_events(log, log.config, str(path))


def _prefill_cfg() -> KVConfig:
    return KVConfig(tokens_per_block=2, life_cycles=(full_life_cycle(),),
                    slots_per_level=(PREFILL_BLOCKS + 8, 8), num_sequences=2,
                    max_blocks=PREFILL_BLOCKS + 4, pocket=PocketConfig(enabled=True))


def _prefill(mgr: KVCacheManager) -> None:
    kv = mgr.create(7, list(range(2 * PREFILL_BLOCKS)))
    assert kv.resume()
    assert kv.resize(capacity=2 * PREFILL_BLOCKS + 1, history_length=2 * PREFILL_BLOCKS)
    kv.close()


def test_a_64_block_prefill_without_choices_is_checked(tmp_path: Path) -> None:
    """Slots taken in reverse order, no choices logged: 64! orders, one run."""
    cfg = _prefill_cfg()
    n = cfg.slots_per_level[0]
    rows = _gpu_renamed(_record(cfg, _prefill), {x: n - 1 - x for x in range(n)})
    verdict = _check(tmp_path, rows)
    assert verdict.ok, verdict.report
    assert verdict.without_choices > 0 and verdict.compared["index"] > 0


def test_a_slot_taken_twice_is_still_rejected(tmp_path: Path) -> None:
    """The same log with one block shown in the slot of another: no slot the model can take explains it
    (two blocks in one slot), and no search does either."""
    cfg = _prefill_cfg()
    n = cfg.slots_per_level[0]
    rows = _gpu_renamed(_record(cfg, _prefill), {x: n - 1 - x for x in range(n)})
    line = next(i for i, r in enumerate(rows) if r.get("action") == "resize")
    index = rows[line]["observed"]["index"][0]
    index[5] = index[4]
    verdict = _check(tmp_path, rows)
    assert not verdict.ok and verdict.kind == "the observed post-state differs from the model's"
    assert verdict.line == line + 1 and "too many to try" in verdict.report


def test_a_small_wrong_slot_is_rejected_on_its_line(tmp_path: Path) -> None:
    """Where the fall-back search is small, a block shown in another block's slot is
    reported as the observed post-state that differs, on the event's line."""
    cfg = KVConfig(tokens_per_block=2, life_cycles=(full_life_cycle(),),
                   slots_per_level=(6, 4), num_sequences=2, max_blocks=6,
                   pocket=PocketConfig(enabled=True))

    def drive(mgr: KVCacheManager) -> None:
        kv = mgr.create(1, [1, 2, 3, 4])
        assert kv.resume()
        assert kv.resize(capacity=5, history_length=4)

    rows = _gpu_renamed(_record(cfg, drive), {0: 3, 1: 5, 2: 0, 3: 1, 4: 2, 5: 4})
    assert _check(tmp_path, rows).ok
    line = next(i for i, r in enumerate(rows) if r.get("action") == "resize")
    index = rows[line]["observed"]["index"][0]
    index[2] = index[1]
    verdict = _check(tmp_path, rows)
    assert not verdict.ok and verdict.kind == "the observed post-state differs from the model's"
    assert verdict.line == line + 1


# (preset, workload steps): longer logs of two-level and three-level leave more victim
# choices open than the checker follows (its MAX_RUNS), slot orders or not
@pytest.mark.parametrize(("name", "steps"), [("tiny", 150), ("split-pools", 150),
                                             ("two-level", 60), ("three-level", 60)])
def test_renamed_campaign_logs_pass_without_choices(tmp_path: Path, name: str,
                                                    steps: int) -> None:
    """Workload logs (eviction, migration, pocket reuse) from an allocator with another
    slot order, choices left out: accepted, and every event's slots read off its index."""
    cfg = preset(name)
    out = io.StringIO()
    mgr = KVCacheManager(cfg, backend="numpy", slot_elems=max(8, cfg.tokens_per_block),
                         backend_options={"eager": False}, event_log=out)
    w = Workload(mgr, random.Random(3))
    for _ in range(steps):
        w.step()
    assert mgr.events is not None
    mgr.events.close()
    n = cfg.slots_per_level[0]
    shuffled = list(range(n))
    random.Random(5).shuffle(shuffled)
    rows = _gpu_renamed(_rows(out.getvalue()), dict(enumerate(shuffled)))
    verdict = _check(tmp_path, rows)
    assert verdict.ok, verdict.report
    assert verdict.without_choices > steps // 2
