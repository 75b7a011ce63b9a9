"""Verifier speed: fuzz steps per second, proof and BMC times, mutant time-to-kill."""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvpocket.model.state import Layout
from kvpocket.verify.bench.cases import (
    Suite,
)
from kvpocket.verify.presets import DEFAULT_PRESET, preset
from kvpocket.verify.proofs.explicit_bmc import explicit_bmc
from kvpocket.verify.proofs.prove import DEFAULT_DEPTH, PROVE_CONFIGS, UNSAFE_DEPTH, run_prove
from kvpocket.verify.proofs.symbolic_bmc import bmc
from kvpocket.verify.quality.seeded import MUTANTS, run_mutant


# ---- verifier speed -------------------------------------------------------------------
def _quiet() -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    return stack


def bench_fuzz(suite: Suite, out_dir: str) -> list[dict[str, Any]]:
    # Hypothesis (about a second to import) only when it runs: `kvpocket --help` imports this module
    from kvpocket.verify.conformance.fuzz import CampaignSpec, run_campaign
    rows = []
    workers = [1] + ([os.cpu_count() or 1] if suite.fuzz_all_cores else [])
    for k in workers:
        spec = CampaignSpec(DEFAULT_PRESET, preset(DEFAULT_PRESET), profile="dev",
                            examples=suite.fuzz_examples,
                            minutes=None if suite.fuzz_seconds is None else suite.fuzz_seconds / 60,
                            seed=0, out_dir=str(Path(out_dir) / f"fuzz-{k}"))
        t0 = time.perf_counter()
        with _quiet():
            rep = run_campaign(spec, workers=1, show_progress=False) if k == 1 \
                else _campaign_pool(spec, k)
        rows.append({"config": DEFAULT_PRESET, "profile": "dev", "workers": k,
                     "examples": rep.examples, "steps": rep.steps,
                     "seconds": time.perf_counter() - t0,
                     "steps_per_second": rep.steps_per_second,
                     "failures": len(rep.failures),
                     "budget": ({"examples": suite.fuzz_examples} if suite.fuzz_examples
                                else {"seconds": suite.fuzz_seconds})})
    return rows


def _campaign_pool(spec: Any, workers: int) -> Any:
    """`workers` spawned processes running `fuzz.run_worker`, merged (as `run_campaign`
    does, without its shared progress counter)."""
    # Hypothesis (about a second to import) only when it runs: `kvpocket --help` imports this module
    from kvpocket.verify.conformance.fuzz import CampaignSpec, merge, run_worker

    per = None if spec.examples is None else max(1, spec.examples // workers)
    specs = [CampaignSpec(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__},
                             "seed": spec.seed + 7919 * i, "examples": per,
                             "out_dir": str(Path(spec.out_dir) / f"w{i}")})
             for i in range(workers)]
    t0 = time.monotonic()
    with mp.get_context("spawn").Pool(workers) as pool:
        reports = pool.map(run_worker, specs)
    return merge(reports, spec, time.monotonic() - t0)


def bench_prove(names: Sequence[str], out_dir: str) -> list[dict[str, Any]]:
    rows = []
    for name in names:
        path = Path(out_dir) / f"prove-{name}.json"
        t0 = time.perf_counter()
        with _quiet():
            rc = run_prove(name, "revalidate", DEFAULT_DEPTH, str(path), str(Path(out_dir) / "prove"))
        secs = time.perf_counter() - t0
        data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        obl = data.get("obligations", [])
        rows.append({"config": name, "policy": "revalidate", "depth": DEFAULT_DEPTH, "rc": rc,
                     "seconds": secs, "obligations": len(obl),
                     "proved": sum(o.get("status") == "proved" for o in obl)})
    return rows


BMC_TARGET_S = 10.0  # issue 16: from Init to the unsafe counterexample


def bench_bmc_unsafe(config_name: str = "gpu-host",
                     engines: Sequence[str] = ("explicit", "symbolic")) -> dict[str, Any]:
    """API-level BMC from Init under `unsafe`, per engine: time to the eviction-during-park
    counterexample at its minimal depth (every shallower depth is refuted first). The
    explicit engine carries the target; the symbolic one is its cross-check. Its
    parametric counterpart, a counterexample to induction for every size, is
    `kvpocket prove --parametric --policy unsafe` (`verify/proofs/parametric.py`)."""
    lay = Layout(PROVE_CONFIGS[config_name].config.with_pocket(True, "unsafe"))
    rows = []
    for engine in engines:
        t0 = time.perf_counter()
        r = (explicit_bmc(lay, "api", UNSAFE_DEPTH) if engine == "explicit"
             else bmc(lay, "api", UNSAFE_DEPTH))
        rows.append({"engine": engine, "status": r.status, "depth": r.depth,
                     "broken": r.broken, "seconds": time.perf_counter() - t0,
                     "solve_seconds": r.seconds, "build_seconds": r.build_seconds,
                     "states": r.states})
    return {"config": config_name, "policy": "unsafe", "layer": "api",
            "max_depth": UNSAFE_DEPTH, "target_seconds": BMC_TARGET_S, "rows": rows}


def bench_mutants(budget_s: float = 8.0) -> dict[str, Any]:
    """Mutant time-to-kill through `quality.seeded.run_mutant` (every mutant, `budget_s`
    each)."""
    rows = []
    for m in MUTANTS.values():
        t0 = time.perf_counter()
        with _quiet(), tempfile.TemporaryDirectory() as td:
            r = run_mutant(m, budget_s=budget_s, out_dir=td)
        data = r.to_json()
        data.pop("trace", None)
        data["wall_seconds"] = time.perf_counter() - t0
        rows.append(data)
    return {"source": "verify.quality.seeded.run_mutant", "budget_s": budget_s, "rows": rows}
