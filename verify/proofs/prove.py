"""`kvpocket prove`: the matrix of Z3 obligations and its report.

For each configuration of the default matrix (or the one named) and each pocket
policy: Init => Inv, Inv and T => Inv' (per page action), Inv => Safe. Bounded
model checking from Init runs over the API actions on the configurations marked
`api_bmc` (to `--depth`, 7 by default: the depth of the unsafe policy's
migration-during-park counterexample) and over the page actions on those marked
`page_bmc` (every configuration when one is named with --config). `--engine` picks
the BMC engine: `explicit` (the default: breadth-first on the executable model,
`explicit_bmc.py`), `symbolic` (the Z3 unrolling, `symbolic_bmc.py`; 5 steps by default under the
safe policies, plus two API steps on from the park prefix, `PARK_PREFIX`, which reach
depth 7 along that run), or `both`, which also checks that they agree. Violations
print a readable CTI or write a replayable trace file.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpocket.model.config import KVConfig, PocketPolicy, full_life_cycle, swa_life_cycle
from kvpocket.model.state import Layout
from kvpocket.verify.interrupts import quiet_worker, z3_leaves_ctrl_c_to_us
from kvpocket.verify.presets import ConfigFileError, is_config_file, load_config_file
from kvpocket.verify.proofs.bounded import BmcResult, properties
from kvpocket.verify.proofs.explicit_bmc import explicit_bmc
from kvpocket.verify.proofs.obligations import PROVED, UNKNOWN, VIOLATED, prove_config
from kvpocket.verify.proofs.symbolic_bmc import bmc
from kvpocket.verify.terminal import Progress
from kvpocket.verify.terminal import console as terminal_console
from kvpocket.verify.traces.trace import Trace, TraceStep, unused_path, write_atomic, write_trace
from kvpocket.verify.verdicts import prove_verdict

# API steps from Init to a page parked in the pocket (SWA window 3, 2 tokens per block):
# the unsafe policy breaks within PARK_DEPTH steps after them (pressure, then a pop), at
# depth 7 from Init, the depth BMC from Init finds under `unsafe`.
PARK_PREFIX: tuple[TraceStep, ...] = (
    TraceStep("create", {"seq": 0, "prompt": []}),
    TraceStep("resume", {"seq": 0}),
    TraceStep("stop_committing", {"seq": 0}),
    TraceStep("resize", {"seq": 0, "capacity": 4, "history": 2}),
    TraceStep("resize", {"seq": 0, "capacity": 4, "history": 4}),
)
PARK_DEPTH = 2

POLICIES = ("revalidate", "pin", "unsafe")
DEFAULT_POLICIES = ("revalidate", "pin")
UNSAFE_DEPTH = 7  # the unsafe policy's migration-during-park counterexample's depth
DEFAULT_DEPTH = UNSAFE_DEPTH  # API-level BMC from Init, every policy (explicit engine)
SYMBOLIC_DEPTH = 5  # ... the symbolic engine's default under revalidate / pin
ENGINES = ("explicit", "symbolic", "both")
DEFAULT_ENGINE = "explicit"
DEFAULT_PAGE_DEPTH = 3
DEFAULT_WORKERS = 2  # (configuration, policy) cells run in parallel processes
MAX_DEPTH = 30  # --depth and --page-depth
MAX_WORKERS_PER_CORE = 4


class ProveUsageError(ValueError):
    """A bad option value; the message names the option and the allowed values."""


def _cfg(slots: tuple[int, ...], seqs: int = 1, full: bool = False, blocks: int = 3,
         pages: int = 0) -> KVConfig:
    lcs = (swa_life_cycle(window=3), full_life_cycle()) if full else (swa_life_cycle(window=3),)
    return KVConfig(tokens_per_block=2, life_cycles=lcs, slots_per_level=slots,
                    num_sequences=seqs, max_blocks=blocks, max_pages=pages)


@dataclass(frozen=True)
class ProveConfig:
    name: str
    description: str
    config: KVConfig
    page_bmc: bool = False  # page-level BMC from Init in the default matrix
    api_bmc: bool = False  # API-level BMC from Init (symbolic: and from PARK_PREFIX)
    api_content: bool = False  # ... explicit alone: with token content (commit, prompts)
    cost: float = 1.0  # relative run time, to start the slow cells first


# One page record per slot (`pages`): the derived bound would add one per pocket position
# for slotless dropped parked pages (evict_parked=drop), which the induction does not need
# (it holds for any number of records) and which doubles the solver's work.
PROVE_CONFIGS: dict[str, ProveConfig] = {c.name: c for c in (
    ProveConfig("gpu", "GPU only (3 slots), 1 sequence, SWA window 3, 3 blocks",
                _cfg((3,)), page_bmc=True),
    ProveConfig("gpu-host", "GPU + host (2 + 2 slots), 1 sequence",
                _cfg((2, 2), pages=4),
                api_bmc=True, api_content=True, cost=2.0),
    ProveConfig("gpu-host-disk", "GPU + host + disk (2 + 1 + 1 slots), 1 sequence",
                _cfg((2, 1, 1), pages=4), api_bmc=True, cost=1.5),
    ProveConfig("gpu-host-2seq", "GPU + host (2 + 2 slots), 2 sequences, 2 blocks",
                _cfg((2, 2), seqs=2, blocks=2, pages=4), api_bmc=True, cost=3.0),
    ProveConfig("gpu-host-full", "GPU + host (2 + 1 slots), SWA + full attention, 1 sequence, "
                "2 blocks", _cfg((2, 1), full=True, blocks=2, pages=3)),
)}
DEFAULT_MATRIX = ("gpu", "gpu-host", "gpu-host-disk", "gpu-host-2seq")


def add_prove_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None,
                        help="one configuration (default: the matrix " +
                        ", ".join(DEFAULT_MATRIX) + "); one of " + ", ".join(PROVE_CONFIGS)
                        + ", or a JSON configuration file")
    parser.add_argument("--policy", default=None,
                        help="pocket policy: revalidate|pin|unsafe (default: revalidate and pin)")
    parser.add_argument("--depth", type=int, default=None,
                        help=f"API-level BMC depth from Init (default {DEFAULT_DEPTH}; with "
                        f"--engine symbolic {SYMBOLIC_DEPTH} under the safe policies; 0 skips "
                        f"BMC; at most {MAX_DEPTH})")
    parser.add_argument("--engine", default=DEFAULT_ENGINE,
                        help="BMC engine: explicit (breadth-first on the model), symbolic "
                        "(Z3 unrolling) or both, which also checks that they agree "
                        f"(default {DEFAULT_ENGINE})")
    parser.add_argument("--page-depth", type=int, default=DEFAULT_PAGE_DEPTH,
                        help=f"page-level BMC depth (default {DEFAULT_PAGE_DEPTH}; 0 skips it; "
                        f"at most {MAX_DEPTH})")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                        help=f"parallel processes (default {DEFAULT_WORKERS}; 1: in-process; "
                        f"at most {MAX_WORKERS_PER_CORE} per core)")
    parser.add_argument("--json", dest="json_path", default=None,
                        help="write every obligation's row, the summary and the "
                        "counterexamples here")
    parser.add_argument("--out", default="prove-out", help="directory for counterexample traces")
    parser.add_argument("--verbose", action="store_true",
                        help="also print every obligation's row (the JSON always has them)")
    parser.add_argument("--parametric", action="store_true",
                        help="prove the pocket-safety invariants for every size instead "
                        "(quantified invariants over unbounded sorts; verify/proofs/parametric.py)")


def _validate(config_name: str | None, policy: str | None, depth: int, page_depth: int,
              workers: int = DEFAULT_WORKERS) -> None:
    if config_name is not None and config_name not in PROVE_CONFIGS:
        raise ProveUsageError(f"argument --config: unknown configuration {config_name!r}; expected one "
                              "of " + ", ".join(PROVE_CONFIGS))
    if policy is not None and policy not in POLICIES:
        raise ProveUsageError(f"argument --policy: unknown policy {policy!r}; expected one of "
                              + ", ".join(POLICIES))
    for flag, value in (("--depth", depth), ("--page-depth", page_depth)):
        if not isinstance(value, int) or value < 0 or value > MAX_DEPTH:
            raise ProveUsageError(f"argument {flag}: expected an integer in [0, {MAX_DEPTH}], "
                                  f"got {value!r}")
    most = MAX_WORKERS_PER_CORE * (os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= most:
        raise ProveUsageError(f"argument --workers: expected an integer in [1, {most}], "
                              f"got {workers!r}")


@dataclass
class Row:
    config: str
    obligation: str
    status: str
    seconds: float
    detail: str = ""


def run_prove(config_name: str | None, policy: str | None, depth: int | None,
              json_path: str | None, out_dir: str, workers: int = DEFAULT_WORKERS,
              page_depth: int = DEFAULT_PAGE_DEPTH, verbose: bool = False,
              parametric: bool = False, engine: str = DEFAULT_ENGINE) -> int:
    """Run the matrix; 0 if everything is proved, 1 on a violation, 2 on bad options, 3
    when nothing is violated but some obligation is unknown (a resource limit: `solver.py`).

    Prints a summary first (per configuration: proved/violated/unknown and time), then
    any counterexample; every obligation's row only with `verbose` (always in the JSON).
    `depth` None: DEFAULT_DEPTH (the unsafe counterexample's depth), or SYMBOLIC_DEPTH
    when the symbolic engine runs under the safe policies.
    """
    console = terminal_console()
    try:
        if engine not in ENGINES:
            raise ProveUsageError(f"argument --engine: unknown engine {engine!r}; expected one "
                                  "of " + ", ".join(ENGINES))
        if depth is None:
            depth = (DEFAULT_DEPTH if policy == "unsafe" or engine == "explicit"
                     else SYMBOLIC_DEPTH)
        custom = _config_file(config_name)
        _validate(None if custom else config_name, policy, depth, page_depth, workers)
    except ProveUsageError as exc:
        print(f"kvpocket prove: error: {exc}", file=sys.stderr)
        return 2
    known = {**PROVE_CONFIGS, **({custom.name: custom} if custom else {})}
    names = [custom.name] if custom else [config_name] if config_name else list(DEFAULT_MATRIX)
    policies = [policy] if policy else list(DEFAULT_POLICIES)
    if parametric:  # every size: one cell per configuration shape and policy
        # the parametric engine only for --parametric (`kvpocket --help` imports this module)
        from kvpocket.verify.proofs.parametric import run_parametric

        return run_parametric([(f"{n}/{pol}", known[n].config.with_pocket(True, pol))
                               for n in names for pol in policies], json_path, workers)
    rows: list[Row] = []
    traces: list[str] = []
    texts: list[str] = []
    t_all = time.perf_counter()
    page_all = config_name is not None
    jobs = [_Job(name, pol, depth, page_depth, out_dir, page_all, engine, custom)
            for name in names for pol in policies]
    # Plain lines, on a terminal too: the workers print theirs to the same stderr.
    line = Progress("prove", live=False, final_line=False).__enter__()
    finished = 0

    def done_one(i: int) -> None:
        nonlocal finished
        finished += 1
        line.note(f"{jobs[i].config}/{jobs[i].policy} done ({finished} of {len(jobs)} cells)")

    results: list[tuple[list[Row], list[str], list[str]] | None] = [None] * len(jobs)
    interrupted = False
    z3_leaves_ctrl_c_to_us()
    try:
        if len(jobs) > 1 and workers > 1:
            # Slowest cells first (better packing); results are put back in job order.
            # Ctrl-C is the parent's: it terminates the workers at once (`interrupts`).
            order = sorted(range(len(jobs)), key=lambda i: -known[jobs[i].config].cost)
            with mp.Pool(min(workers, len(jobs)), initializer=quiet_worker) as pool:
                try:
                    for i, result in pool.imap_unordered(_prove_indexed,
                                                         [(i, jobs[i]) for i in order]):
                        results[i] = result
                        done_one(i)
                finally:
                    pool.terminate()
        else:
            for i, job in enumerate(jobs):
                results[i] = _prove_one(job)
                done_one(i)
    except KeyboardInterrupt:  # the cells that finished are reported, marked interrupted
        interrupted = True
    ordered = [r for r in results if r is not None]
    for job_rows, job_texts, job_traces in ordered:
        rows.extend(job_rows)
        traces.extend(job_traces)
        texts.extend(job_texts)
    total = time.perf_counter() - t_all
    summary = summarize(rows)
    if interrupted:
        console.print(f"[yellow bold]INTERRUPTED[/]: {len(ordered)} of {len(jobs)} "
                      "configurations finished; no verdict (the summary covers those only)")
    print_summary(console, summary, total, interrupted)
    for text in texts:  # counterexamples (CTIs, traces) and unknown BMC runs
        console.print(text, markup=False)
    if verbose:
        print_rows(console, rows)
    elif rows:
        console.print(f"({len(rows)} obligations; --verbose prints every row"
                      + (", as does --json)" if not json_path else f"; all are in {json_path})"))
    data: dict[str, Any] = {
        "summary": summary,
        "obligations": [{"config": r.config, "obligation": r.obligation,
                         "status": r.status, "seconds": round(r.seconds, 3),
                         "detail": r.detail} for r in rows],
        "counterexamples": traces, "seconds": round(total, 3),
        "interrupted": interrupted, "cells": len(jobs), "cells_finished": len(ordered),
    }
    if json_path:
        write_atomic(json_path, json.dumps(data, indent=2) + "\n")
    return prove_verdict(data).code


def _prove_indexed(item: tuple[int, _Job]) -> tuple[int, tuple[list[Row], list[str], list[str]]]:
    return item[0], _prove_one(item[1])


def summarize(rows: list[Row]) -> dict[str, dict[str, Any]]:
    """Per configuration (name/policy): proved, violated and unknown counts, and seconds."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        c = out.setdefault(r.config, {PROVED: 0, VIOLATED: 0, UNKNOWN: 0, "seconds": 0.0})
        c[r.status if r.status in (PROVED, VIOLATED) else UNKNOWN] += 1
        c["seconds"] = round(c["seconds"] + r.seconds, 3)
    return out


def print_summary(console: Any, summary: dict[str, dict[str, Any]], total: float,
                  interrupted: bool = False) -> None:
    # rich only when a table is printed (`kvpocket --help` imports this module)
    from rich.table import Table

    proved = sum(c[PROVED] for c in summary.values())
    violated = sum(c[VIOLATED] for c in summary.values())
    unknown = sum(c[UNKNOWN] for c in summary.values())
    verdict = ("[red bold]VIOLATED[/]" if violated else
               "[yellow bold]INTERRUPTED[/]" if interrupted else
               "[yellow bold]NOT ALL PROVED[/]" if unknown else "[green bold]ALL PROVED[/]")
    console.print(f"{verdict}: {proved} proved, {violated} violated, {unknown} unknown, "
                  f"{len(summary)} configurations, {total:.1f} s")
    table = Table(title="kvpocket prove: summary")
    for col, justify in (("configuration", "left"), ("proved", "right"), ("violated", "right"),
                         ("unknown", "right"), ("seconds", "right")):
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for name, c in summary.items():
        bad = c[VIOLATED]
        table.add_row(name, str(c[PROVED]), f"[red]{bad}[/]" if bad else "0",
                      f"[yellow]{c[UNKNOWN]}[/]" if c[UNKNOWN] else "0", f"{c['seconds']:.1f}")
    console.print(table)


def print_rows(console: Any, rows: list[Row]) -> None:
    # rich only when a table is printed (`kvpocket --help` imports this module)
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="kvpocket prove: every obligation")
    for col in ("configuration", "obligation", "status", "seconds"):
        table.add_column(col)
    colors = {PROVED: "green", VIOLATED: "red", UNKNOWN: "yellow"}
    for row in rows:
        table.add_row(row.config, escape(row.obligation),
                      f"[{colors.get(row.status, 'white')}]{row.status}[/]", f"{row.seconds:.2f}")
    console.print(table)


@dataclass(frozen=True)
class _Job:
    """One (configuration, policy) cell of the matrix and how to run it."""

    config: str
    policy: str
    depth: int
    page_depth: int
    out_dir: str
    page_all: bool  # page-level BMC on every configuration (one was named)
    engine: str
    custom: ProveConfig | None = None  # a configuration from a JSON file (`--config FILE`)


def _config_file(name: str | None) -> ProveConfig | None:
    """`--config FILE.json`: a configuration of the user's own, with page-level and
    API-level BMC as well as induction; None for a matrix name (or none)."""
    if name is None or name in PROVE_CONFIGS or not is_config_file(name):
        return None
    try:
        cfg = load_config_file(name)
    except ConfigFileError as exc:
        raise ProveUsageError(f"argument --config: {exc}") from None
    return ProveConfig(Path(name).stem, f"from {name}", cfg, page_bmc=True, api_bmc=True)


def _bmc_runs(lay: Layout, layer: str, depth: int, engine: str,
              prefix: list[TraceStep] | None = None, content: bool = False,
              line: Progress | None = None) -> list[tuple[str, BmcResult]]:
    """(engine, result) for each BMC engine `engine` names. Alone, the explicit engine
    checks every invariant (and explores token content where `content`); beside the
    symbolic one, only what that one checks and explores, so that their answers must
    agree. `line` shows each depth as its search starts."""
    out: list[tuple[str, BmcResult]] = []

    def seen(k: int, states: int) -> None:
        if line is not None:
            line.update(f"explicit engine, depth {k} of {depth} ({states:,} states so far)")

    if engine == "explicit":
        out.append(("explicit", explicit_bmc(lay, layer, depth, prefix=prefix,
                                             content=content, on_depth=seen)))
    if engine == "both":
        out.append(("explicit", explicit_bmc(lay, layer, depth, prefix=prefix,
                                             props=properties(layer), on_depth=seen)))
    if engine in ("symbolic", "both"):
        out.append(("symbolic", bmc(lay, layer, depth, prefix=prefix, on_depth=lambda k: (
            line.update(f"symbolic engine, depth {k} of {depth}") if line else None))))
    return out


def _disagreement(a: BmcResult, b: BmcResult) -> str:
    """Why two engines' answers to the same search contradict each other ("" if they do
    not: an unknown contradicts nothing)."""
    if "unknown" in (a.status, b.status):
        return ""
    if a.status != b.status or (a.status == "violated" and len(a.steps) != len(b.steps)):
        return (f"BMC engines disagree: {a.engine} {a.status} at depth {a.depth}, "
                f"{b.engine} {b.status} at depth {b.depth}")
    return ""


def _prove_one(job: _Job) -> tuple[list[Row], list[str], list[str]]:
    """One (configuration, policy) cell (a worker process), its phases shown on stderr."""
    with Progress(f"prove {job.config}/{job.policy}", live=False, final_line=False) as line:
        return _prove_cell(job, line)


def _prove_cell(job: _Job, line: Progress) -> tuple[list[Row], list[str], list[str]]:
    """One (configuration, policy) cell: induction and BMC.

    BMC runs first: the symbolic engine's incremental search is the longest query here,
    and it is fastest in a Z3 context that the induction queries have not filled yet.
    """
    name, pol, depth, page_depth = job.config, job.policy, job.depth, job.page_depth
    pc = job.custom or PROVE_CONFIGS[name]
    cfg = pc.config.with_pocket(True, pol)
    label = f"{name}/{pol}"
    lay = Layout(cfg)
    rows: list[Row] = []
    texts: list[str] = []
    traces: list[str] = []
    runs: list[tuple[str, str, BmcResult]] = []  # (trace file tag, obligation, result)

    def search(tag: str, obligation: str, layer: str, steps: int,
               prefix: list[TraceStep] | None = None, content: bool = False) -> None:
        if content and job.engine == "explicit":
            obligation += " with token content"
        line.note(f"{obligation} ({job.engine} engine{'s' if job.engine == 'both' else ''})")
        found = _bmc_runs(lay, layer, steps, job.engine, prefix, content, line)
        both = len(found) > 1
        for eng, r in found:
            runs.append((f"{tag}-{eng}" if both else tag,
                         f"{obligation} [{eng}]" if both else obligation, r))
        if both:
            why = _disagreement(found[0][1], found[1][1])
            rows.append(Row(label, f"{obligation}: engines agree", VIOLATED if why else PROVED,
                            0.0, why))
            if why:
                texts.append(f"{label} {obligation}: {why}")

    if page_depth > 0 and (pc.page_bmc or job.page_all):
        search("page", f"bmc:page<= {page_depth}", "page", page_depth)
    if depth > 0 and pc.api_bmc:
        search("api", f"bmc:api<= {depth}", "api", depth, content=pc.api_content)
    if depth > 0 and pc.api_bmc and pol != "unsafe" and depth < len(PARK_PREFIX) + PARK_DEPTH:
        search("api-park", f"bmc:api<= {PARK_DEPTH} after park", "api", PARK_DEPTH,
               list(PARK_PREFIX))
    line.note("induction (Z3): init, one consecution obligation per action, safety")
    for o in prove_config(lay, label):
        rows.append(Row(label, o.obligation, o.status, o.seconds, o.detail))
        if o.cti is not None:
            texts.append(o.cti.render(lay))
    for layer, obligation, r in runs:
        rows.append(Row(label, obligation, _bmc_status(r), r.seconds + r.build_seconds,
                        ", ".join(r.broken) or r.detail))
        if r.status == "unknown" and r.detail:
            texts.append(f"{label} {obligation}: unknown at depth {r.depth}: {r.detail}")
        if r.status == VIOLATED:
            path = counterexample_path(job.out_dir, name, pol, layer)
            write_bmc_trace(path, cfg, r)
            traces.append(str(path))
            texts.append(f"counterexample trace ({len(r.steps)} steps, breaks "
                         f"{', '.join(r.broken)}): {path}")
    return rows, texts, traces


def counterexample_path(out_dir: str | Path, config: str, policy: str, layer: str) -> Path:
    """Where a BMC counterexample goes: never over an earlier one (-2, -3, ... when the
    name is taken, as fuzz failure traces)."""
    return unused_path(Path(out_dir) / f"bmc-{config}-{policy}-{layer}.jsonl")


def _bmc_status(r: BmcResult) -> str:
    return {"violated": VIOLATED, "proved": PROVED}.get(r.status, UNKNOWN)


def write_bmc_trace(path: str | Path, cfg: KVConfig, r: BmcResult) -> Path:
    steps = [TraceStep(s.action, s.params, s.layer, list(s.choices)) for s in r.steps]
    return write_trace(path, Trace(cfg, steps, "bmc", cfg.pocket.policy.value,
                                   {"broken": r.broken, "layer": r.layer}))


PolicyName = PocketPolicy
