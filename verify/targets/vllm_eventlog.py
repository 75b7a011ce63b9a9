"""vLLM's run as a kvpocket event log (docs/adapter-guide.md), and its check.

The mapping, GPU only, pocket off (docs/targets/vllm.md has the reasoning):

- the pool of `num_blocks` blocks is one GPU level of `num_blocks - 1` slots (block id b
  is slot b - 1; vLLM's null block 0 is no slot), one pool group for every KV cache group,
  a life cycle per group (`window` = the sliding window for SWA groups);
- a request is a sequence (`r7` is seq 7): admission is `create` with the prompt cut at
  vLLM's prefix-cache hit, `resume`, then the `resize` and `commit` of the first chunk;
  each later scheduler step is `resize(capacity=end, history=start)` (the first query's
  position is the model's history, so the window rule `(b+1)·t <= h+1-w` is vLLM's
  `get_num_skipped_tokens`) and `commit` of the step's tokens; preemption and finishing
  are `close`; a refused admission changes nothing and is not logged;
- choices are recorded explicitly: the cached free blocks vLLM's allocation evicted, in
  the order it popped them, as `victim` labels, then the new blocks as `slot` labels in
  the model's allocation order (block by block, life cycle within a block);
- `reset_prefix_cache` drops every cached block: a `pressure` event for every slot,
  with every cached block as a recorded victim;
- `observed` carries the free slots (vLLM's free blocks that hold no cached content) and
  the sequence's page-index rows.

`check_event_log` is the one call to the checker (`kvpocket trace check` on the log, the
configuration from its header); the options it passes are named there.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kvpocket.model.config import KVConfig, LifeCycle, PocketConfig
from kvpocket.verify.targets.base import TargetConfig
from kvpocket.verify.targets.workload import Request
from kvpocket.verify.traces.trace import parse_events
from kvpocket.verify.traces.tracecheck import TraceVerdict, check_events


def model_config(cfg: TargetConfig) -> KVConfig:
    lcs = tuple(LifeCycle(f"{kind}{i}", window=cfg.sliding_window if kind == "swa" else None)
                for i, kind in enumerate(cfg.groups))
    return KVConfig(tokens_per_block=cfg.block_size, life_cycles=lcs,
                    slots_per_level=(cfg.num_blocks - 1,), num_sequences=cfg.num_blocks - 1,
                    max_blocks=-(-cfg.max_model_len // cfg.block_size),
                    pocket=PocketConfig(enabled=False))


def check_event_log(lines: list[str]) -> TraceVerdict:
    """The event log against the kvpocket model: `kvpocket trace check LOG` with no
    options (the header's configuration, pocket off, every recorded choice checked).
    The one place to switch to another spec."""
    return check_events(parse_events(lines, "vllm event log", allow_unterminated=False))


class EventLogWriter:
    """Builds the log in memory as the target drives vLLM (`lines`, header first)."""

    def __init__(self, cfg: TargetConfig, pool: Any, source: str) -> None:
        self.cfg = cfg
        self.pool = pool
        self.kv = model_config(cfg)
        header = {"kvpocket_trace": 1, "kind": "events", "config": self.kv.to_json(),
                  "source": source, "policy": "off"}
        self.lines: list[str] = []
        self._digest = hashlib.sha256()
        self._emit(header)
        self._events = 0
        self._before_tables: list[list[int]] = []
        self._hit: list[list[Any]] = []
        self._before_cached: set[int] = set()
        self.closed = False

    def _emit(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, separators=(",", ":"))
        self.lines.append(line)
        self._digest.update(line.encode("utf-8") + b"\n")

    def _event(self, action: str, params: dict[str, Any], result: Any = None,
               choices: list[list[Any]] | None = None, observed: dict[str, Any] | None = None
               ) -> None:
        ev: dict[str, Any] = {"action": action, "params": params}
        if choices is not None:
            ev["choices"] = choices
        if action in ("resume", "resize", "pressure"):
            ev["result"] = result
        elif action not in ("advance",):
            ev["result"] = None
        if observed is not None:
            ev["observed"] = observed
        self._emit(ev)
        self._events += 1

    @staticmethod
    def seq(req: Request) -> int:
        return int(req.rid[1:])

    # -- what the pool looks like -----------------------------------------------------

    def _free_slots(self) -> int:
        return sum(1 for b in self.pool.pool.blocks
                   if not self.pool.is_null(b) and b.ref_cnt == 0 and not self.pool.keys_of(b))

    def _tables(self, rid: str) -> list[list[int]]:
        tables: list[list[int]] = self.pool.block_ids(rid)
        return tables

    def _observed(self, rid: str, capacity: int) -> dict[str, Any]:
        n = -(-capacity // self.cfg.block_size)
        null = self.pool.null_id
        rows = [[(b - 1 if b != null else -1) for b in table[:n]] + [-1] * (n - len(table))
                for table in self._tables(rid)]
        return {"free": [[0, 0, self._free_slots()]], "index": rows}

    # -- hooks the target calls around vLLM's calls -----------------------------------

    def before(self, req: Request, hit_tables: list[list[int]] | None = None,
               hashes: list[Any] | None = None) -> None:
        """Just before `allocate_slots`: what the request holds (at admission: the blocks
        of its prefix-cache hit, which the model's `create` reuses, and which copy of
        each it reuses, before the allocation evicts any), which free blocks are cached."""
        self._before_tables = self._tables(req.rid) if hit_tables is None else hit_tables
        self._hit = [] if hit_tables is None else \
            self._reuse_choice(hit_tables, hashes or []) + self._hit_choices(hit_tables, hashes or [])
        # Every cached block, free or not: vLLM frees the request's out-of-window blocks
        # inside `allocate_slots`, before it allocates, so a block cached and in use before
        # the call may be freed and evicted by it (the model released it earlier).
        self._before_cached = {b.block_id for b in self.pool.pool.blocks
                               if not self.pool.is_null(b) and self.pool.keys_of(b)}

    def _copies(self, block_hash: Any, group: int | None = None) -> list[int]:
        """The blocks vLLM's hash map holds under `block_hash` (in `group`, or any)."""
        out = []
        for key, b in self.pool.cached_entries():
            h, g = self.pool.split_key(key)
            if h == block_hash and group in (None, g):
                out.append(b.block_id)
        return out

    def _reuse_choice(self, hit_tables: list[list[int]], hashes: list[Any]) -> list[list[Any]]:
        """vLLM's sliding-window hit needs only the blocks in the window to be cached; when
        an earlier block is gone the hit is longer than the model's default (the longest
        prefix whose every block is cached): the model's `reuse` choice, in tokens."""
        blocks = max((len(t) for t in hit_tables), default=0)
        full = next((o for o in range(blocks) if not all(
            self._copies(hashes[o], g) for g in range(len(hit_tables)))), blocks)
        return [] if full == blocks else [["reuse", blocks * self.cfg.block_size]]

    def _hit_choices(self, hit_tables: list[list[int]], hashes: list[Any]) -> list[list[Any]]:
        """A hit block cached more than once (vLLM caches a recomputed block again) is the
        model's `hit` choice: which copy the match reuses. Block by block, group within
        block; null blocks (out of the window, not reused) are no choice."""
        out: list[list[Any]] = []
        for o in range(max((len(t) for t in hit_tables), default=0)):
            for g, table in enumerate(hit_tables):
                if o < len(table) and table[o] != self.pool.null_id \
                        and len(self._copies(hashes[o], g)) > 1:
                    out.append(["hit", [0, 0, table[o] - 1]])
        return out

    def _clash_choices(self, req: Request, start: int, end: int, hashes: list[Any]
                       ) -> list[list[Any]]:
        """vLLM caches every newly full block, also one whose hash is cached already
        (another copy, in any group): that is the model's `clash` choice "cache"."""
        t = self.cfg.block_size
        mine = {b for table in self._tables(req.rid) for b in table}
        return [["clash", "cache"] for o in range(start // t, end // t)
                if o < len(hashes) and any(b not in mine for b in self._copies(hashes[o]))]

    def _choices(self, req: Request) -> list[list[Any]]:
        after = self._tables(req.rid)
        new: list[tuple[int, int, int]] = []  # (block index, group, block id)
        popped: list[int] = []
        for g, (old, now) in enumerate(zip(self._before_tables, after, strict=True)):
            for i, b in enumerate(now):
                fresh = i >= len(old) or (old[i] != b and old[i] == self.pool.null_id
                                          and b != self.pool.null_id)
                if fresh and b != self.pool.null_id:
                    new.append((i, g, b))
                    popped.append(b)
        victims = [["victim", [0, 0, b - 1]] for b in popped if b in self._before_cached]
        slots = [["slot", b - 1] for _, _, b in sorted(new)]
        return victims + slots

    def admitted(self, req: Request, hit: int, end: int, hashes: list[Any]) -> None:
        """Admission with a hit of `hit` tokens (`before` had its blocks); `hashes`: the
        request's block hashes."""
        s = self.seq(req)
        self._event("create", {"seq": s, "prompt": req.tokens[:hit]}, choices=self._hit)
        self._event("resume", {"seq": s}, True, choices=[])
        self.scheduled(req, hit, end, hashes)

    def scheduled(self, req: Request, start: int, end: int, hashes: list[Any]) -> None:
        s = self.seq(req)
        self._event("resize", {"seq": s, "capacity": end, "history": start}, True,
                    choices=self._choices(req), observed=self._observed(req.rid, end))
        self._event("commit", {"seq": s, "tokens": req.tokens[start:end]},
                    choices=self._clash_choices(req, start, end, hashes))

    def freed(self, req: Request) -> None:
        self._event("close", {"seq": self.seq(req)}, choices=[])

    def reset(self, cached: list[int]) -> None:
        """`reset_prefix_cache` succeeded: every cached block (all free) was dropped; each is
        a recorded victim, so the safety spec need not search the eviction order."""
        self._event("pressure", {"level": 0, "pool_group": 0, "slots": self.cfg.num_blocks - 1},
                    True, choices=[["victim", [0, 0, b - 1]] for b in cached])

    def close(self) -> list[str]:
        if not self.closed:
            self.lines.append(json.dumps({"kvpocket_end": self._events,
                                          "digest": "sha256:" + self._digest.hexdigest()},
                                         separators=(",", ":")))
            self.closed = True
        return self.lines
