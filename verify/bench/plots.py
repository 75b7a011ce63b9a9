"""PNG plots of a `kvpocket bench` result (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

COLORS = {False: "tab:red", True: "tab:blue"}


def _label(pocket: bool) -> str:
    return "pocket on" if pocket else "pocket off"


def _series(rows: list[dict[str, Any]], x: str, y: str, pocket: bool) -> tuple[list[Any], list[Any]]:
    sel = sorted((r for r in rows if r["pocket"] is pocket and not r["pressure"]), key=lambda r: r[x])
    return [r[x] for r in sel], [r[y] for r in sel]


def _scaling_plot(rows: list[dict[str, Any]], x: str, xlabel: str, title: str, path: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for pocket in (False, True):
        c = COLORS[pocket]
        xs, ys = _series(rows, x, "resize_crossing_us_median", pocket)
        ax1.plot(xs, ys, "o-", color=c, label=f"{_label(pocket)}: crossing (median)")
        xs, ys = _series(rows, x, "resize_crossing_us_p99", pocket)
        ax1.plot(xs, ys, "o:", color=c, alpha=0.6, label=f"{_label(pocket)}: crossing (p99)")
        xs, ys = _series(rows, x, "resize_non_crossing_us_median", pocket)
        ax1.plot(xs, ys, "s--", color=c, label=f"{_label(pocket)}: non-crossing (median)")
        xs, ys = _series(rows, x, "allocator_calls_per_step", pocket)
        ax2.plot(xs, ys, "o-", color=c, label=f"{_label(pocket)}: allocator calls")
        xs, ys = _series(rows, x, "events_per_step", pocket)
        ax2.plot(xs, ys, "s--", color=c, label=f"{_label(pocket)}: events recorded")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    ax1.set_ylabel("resize() per sequence [µs]")
    ax1.set_yscale("log")
    ax2.set_ylabel("per decode step (whole batch)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ab_plot(rows: list[dict[str, Any]], path: Path, backend: str) -> None:
    offs = [r for r in rows if not r["pocket"]]
    ons = {(r["batch"], r["window"], r["tokens_per_block"], r["pressure"]): r
           for r in rows if r["pocket"]}
    labels, cross, noncross, alloc_off, alloc_on = [], [], [], [], []
    for r in offs:
        key = (r["batch"], r["window"], r["tokens_per_block"], r["pressure"])
        on = ons.get(key)
        if on is None:
            continue
        labels.append(f"{r['batch']}×{r['window']}/{r['tokens_per_block']}"
                      + (" P" if r["pressure"] else ""))
        cross.append(on["resize_crossing_us_median"] / r["resize_crossing_us_median"]
                     if r["resize_crossing_us_median"] else 0.0)
        noncross.append(on["resize_non_crossing_us_median"] / r["resize_non_crossing_us_median"]
                        if r["resize_non_crossing_us_median"] else 0.0)
        alloc_off.append(r["allocator_calls_per_crossing"])
        alloc_on.append(on["allocator_calls_per_crossing"])
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 0.55 * len(labels) + 2), 7), sharex=True)
    xs = list(range(len(labels)))
    wd = 0.38
    ax1.bar([x - wd / 2 for x in xs], cross, wd, color="tab:blue", label="crossing steps")
    ax1.bar([x + wd / 2 for x in xs], noncross, wd, color="tab:gray", label="non-crossing steps")
    ax1.axhline(1.0, color="black", lw=0.8)
    ax1.set_ylabel("resize() median, pocket on / off")
    ax1.legend(fontsize=8)
    ax1.grid(True, axis="y", alpha=0.3)
    ax2.bar([x - wd / 2 for x in xs], alloc_off, wd, color=COLORS[False], label="pocket off")
    ax2.bar([x + wd / 2 for x in xs], alloc_on, wd, color=COLORS[True], label="pocket on")
    ax2.set_ylabel("allocator calls per crossing")
    ax2.legend(fontsize=8)
    ax2.grid(True, axis="y", alpha=0.3)
    ax2.set_xticks(xs)
    ax2.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    fig.suptitle(f"decode A/B ({backend}); batch×window/tokens_per_block, P = tenant pressure",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(result: dict[str, Any], out_dir: str) -> list[str]:
    """Write the plots the result has data for; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    backend = str(result.get("backend", "numpy"))
    if result.get("decode"):
        p = out / f"bench-decode-ab-{backend}.png"
        _ab_plot(result["decode"], p, backend)
        written.append(str(p))
    scaling = result.get("scaling") or {}
    cfg = result.get("config", {})
    if scaling.get("batch"):
        w, t = cfg.get("batch_sweep_preset", (128, 32))
        p = out / f"bench-scaling-batch-{backend}.png"
        _scaling_plot(scaling["batch"], "batch", "batch size (sequences)",
                      f"cost against batch size (window {w}, {t} tokens/block, {backend})", p)
        written.append(str(p))
    if scaling.get("window"):
        n, t = cfg.get("window_sweep_batch", 256), cfg.get("window_sweep_tpb", 32)
        p = out / f"bench-scaling-window-{backend}.png"
        _scaling_plot(scaling["window"], "window", "window (tokens)",
                      f"cost against window size ({n} sequences, {t} tokens/block, {backend})", p)
        written.append(str(p))
    return written
