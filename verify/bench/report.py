"""The rich tables `kvpocket bench` prints."""

from __future__ import annotations

from typing import Any

from kvpocket.verify.bench.cases import BenchResult
from kvpocket.verify.terminal import console


def _fmt(v: Any, nd: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def print_result(res: BenchResult) -> None:
    # rich only when a table is printed (`kvpocket --help` imports this module)
    from rich.table import Table

    con = console()  # piped: as wide as the tables (a narrow terminal folds them)
    m = res.machine
    con.print(f"[bold]kvpocket bench[/] suite {res.suite}, backend {res.backend}; python "
              f"{m['python']}, numpy {m['numpy']}, {m['cpu_count']} cpus; {res.seconds:.1f} s")
    if res.decode:
        con.print("decode: lockstep SWA decode, committing stopped, steady state after one block "
                  "period of warm-up; pressure = a tenant asks GPU for max(1, batch/64) more "
                  "free slots per step. Counts per decode step of the batch; times per "
                  "resize() call in µs; ratio = pocket-on / pocket-off.")
        _decode_table(con, Table, "decode A/B (pocket off vs on)", res.decode)
    for name, rows in res.scaling.items():
        _decode_table(con, Table, f"scaling against {name}", rows)
    fz = res.verifier.get("fuzz")
    if fz:
        tb = Table(title="verifier: lockstep fuzz (preset two-level, profile dev)")
        for c in ("workers", "examples", "steps", "seconds", "steps/s", "failures"):
            tb.add_column(c, justify="right")
        for r in fz:
            tb.add_row(str(r["workers"]), str(r["examples"]), str(r["steps"]),
                       _fmt(r["seconds"], 1), _fmt(r["steps_per_second"], 1), str(r["failures"]))
        con.print(tb)
    pv = res.verifier.get("prove")
    if pv:
        tb = Table(title="verifier: prove per configuration (policy revalidate)")
        for c in ("config", "depth", "obligations", "proved", "rc", "seconds"):
            tb.add_column(c, justify="right")
        for r in pv:
            tb.add_row(r["config"], str(r["depth"]), str(r["obligations"]), str(r["proved"]),
                       str(r["rc"]), _fmt(r["seconds"], 1))
        con.print(tb)
    b = res.verifier.get("bmc_unsafe")
    if b:
        for r in b["rows"]:
            cost = (f"{r['states']} states" if r["engine"] == "explicit"
                    else f"unrolling {r['build_seconds']:.1f} s")
            con.print(f"verifier: BMC from Init, {r['engine']} engine ({b['config']}, policy "
                      f"unsafe, layer {b['layer']}, max depth {b['max_depth']}): {r['status']} "
                      f"at depth {r['depth']} ({', '.join(r['broken'])}) in "
                      f"{r['seconds']:.1f} s ({cost}; target {b['target_seconds']:.0f} s)")
    mu = res.verifier.get("mutants")
    if mu is not None:
        if mu["rows"]:
            tb = Table(title=f"verifier: mutant time-to-kill (from {mu['source']})")
            for c in ("mutant", "layer", "killed", "time to kill s", "detectors"):
                tb.add_column(c)
            for r in mu["rows"]:
                if isinstance(r, dict):
                    tb.add_row(str(r.get("name", "?")), str(r.get("layer", "")),
                               _fmt(r.get("killed")), _fmt(r.get("seconds")),
                               ", ".join(r.get("detectors", [])))
            con.print(tb)
        else:
            con.print(f"verifier: mutant time-to-kill: {mu.get('note')}")
    geo = res.verifier.get("trace_geometry")
    if geo:
        st, th = geo["startup"], geo["throughput"]
        con.print(f"verifier: trace check, header-only start-up at {st['slots_per_level']:,} "
                  f"slots per level: {st['seconds']:.3f} s (target 0.5 s), "
                  f"{st['stored_positions']} positions stored")
        con.print(f"verifier: trace check of {th['events']:,} events at "
                  f"{th['slots_per_level']:,} slots per level: {th['events_per_second']:,.0f} "
                  f"events/s (target 50,000), peak memory {th['peak_rss_mb']:,.0f} MB "
                  f"(target 1,000 MB), {'valid' if th['ok'] else 'REJECTED: ' + th['kind']}")
        per_event = th["page_actions"] / th["events"] if th["events"] else 0.0
        con.print(f"verifier: the floor under it, events per CPU second: checking "
                  f"{th['events_per_cpu_second']:,.0f} ({per_event:.1f} page actions of the "
                  f"model per event); reading only {th['reader_events_per_cpu_second']:,.0f}; "
                  f"json.loads only {th['json_events_per_cpu_second']:,.0f}")
        dec = th["declared"]
        con.print(f"verifier: the same log declaring {dec['num_sequences']:,} sequences of "
                  f"{dec['max_blocks']:,} blocks: {dec['events_per_cpu_second']:,.0f} events per "
                  f"CPU second, {'valid' if dec['ok'] else 'REJECTED: ' + dec['kind']}")
    fp = res.verifier.get("full_pool")
    if fp:
        con.print(f"verifier: trace check of a full pool ({fp['slots_per_level']:,} GPU slots, "
                  f"{fp['events']:,} events, every allocation evicting once it fills): "
                  f"{fp['events_per_cpu_second']:,.0f} events per CPU second (target "
                  f"15,000), {fp['page_actions_per_event']:.1f} page actions per event, peak "
                  f"memory {fp['peak_rss_mb']:,.0f} MB (target 1,000 MB), "
                  f"{'valid' if fp['ok'] else 'REJECTED: ' + fp['kind']}")
    cr = res.long_run.get("create")
    if cr:
        tb = Table(title="long run: create cost vs sequences closed (preset tiny)")
        for c in ("closed before", "create us", "handles held", "live streams"):
            tb.add_column(c, justify="right")
        for r in cr:
            tb.add_row(str(r["closed"]), _fmt(r["create_us"]), str(r["handles_held"]),
                       _fmt(r["live_streams"]))
        con.print(tb)
    rec = res.long_run.get("record")
    if rec:
        con.print(f"long run: `{rec['command']}`: peak RSS {rec['peak_rss_mb']:.1f} MB, "
                  f"{rec['seconds']:.1f} s, log {rec['log_mb']:.1f} MB")
    if res.gpu:
        mg, orc = res.gpu["migration"], res.gpu["oracle"]
        con.print(f"gpu: migration of {mg['pages']} x {mg['slot_bytes']} B: GPU->host "
                  f"{mg['gpu_to_host_GBps']:.2f} GB/s ({mg['gpu_to_host_ratio_vs_bulk']:.2f} of a "
                  f"plain bulk copy, {mg['gpu_to_host_ratio_vs_per_slot']:.2f} of per-slot copies); "
                  f"host->GPU {mg['host_to_gpu_GBps']:.2f} GB/s "
                  f"({mg['host_to_gpu_ratio_vs_bulk']:.2f} / {mg['host_to_gpu_ratio_vs_per_slot']:.2f})")
        con.print(f"gpu: data oracle {orc['batch']} seqs x {orc['steps']} steps: "
                  f"{orc['decode_steps_per_second']:.0f} decode steps/s, "
                  f"{orc['verified_positions_per_second']:.0f} verified positions/s, "
                  f"{orc['mismatches']} mismatches")


def _decode_table(con: Any, table_cls: Any, title: str, rows: list[dict[str, Any]]) -> None:
    head = ("batch", "w/t", "press.", "pocket")

    def key(r: dict[str, Any]) -> list[str]:
        pocket = f"on/{r['evict_parked']}" if r["pocket"] and r.get("evict_parked") else (
            "on" if r["pocket"] else "off")
        return [str(r["batch"]), f"{r['window']}/{r['tokens_per_block']}", _fmt(r["pressure"]),
                pocket]

    tb = table_cls(title=f"{title}: traffic per decode step (whole batch)")
    for c in (*head, "alloc", "alloc/cross", "releases", "events", "events/cross", "waits",
              "slots/seq", "refused"):
        tb.add_column(c, justify="right")
    for r in rows:
        tb.add_row(*key(r), _fmt(r["allocator_calls_per_step"]),
                   _fmt(r["allocator_calls_per_crossing"]), _fmt(r["releases_per_step"]),
                   _fmt(r["events_per_step"]), _fmt(r["events_per_crossing"]),
                   _fmt(r["cross_stream_waits_per_step"]), _fmt(r["distinct_slots_per_sequence"], 1),
                   f"{r['pop_refusal_share']:.0%}" if r["pocket"] and r["pressure"] else "-")
    con.print(tb)
    pressed = [r for r in rows if r["pressure"] and "d2h_copies_per_step" in r]
    if pressed:
        tb = table_cls(title=f"{title}: device-to-host copies per decode step under pressure, "
                       f"{pressed[0]['slot_bytes']} B per slot (on/migrate copies evicted "
                       "parked pages, on/drop releases them)")
        for c in (*head, "D2H copies", "of parked", "D2H bytes", "parked drops", "refused"):
            tb.add_column(c, justify="right")
        for r in pressed:
            tb.add_row(*key(r), _fmt(r["d2h_copies_per_step"], 3),
                       _fmt(r["d2h_parked_copies_per_step"], 3),
                       _fmt(r["d2h_bytes_per_step"], 1), _fmt(r["parked_drops_per_step"], 3),
                       f"{r['pop_refusal_share']:.0%}" if r["pocket"] else "-")
        con.print(tb)
    tb = table_cls(title=f"{title}: resize() per sequence, µs (ratio: pocket on / off)")
    for c in (*head, "median", "p99", "cross med", "cross p99", "non-cross med", "non-cross p99",
              "ratio med", "ratio cross"):
        tb.add_column(c, justify="right")
    for r in rows:
        tb.add_row(*key(r), _fmt(r["resize_us_median"]), _fmt(r["resize_us_p99"]),
                   _fmt(r["resize_crossing_us_median"]), _fmt(r["resize_crossing_us_p99"]),
                   _fmt(r["resize_non_crossing_us_median"]), _fmt(r["resize_non_crossing_us_p99"]),
                   _fmt(r.get("resize_ratio_on_off_median")),
                   _fmt(r.get("resize_crossing_ratio_on_off_median")))
    con.print(tb)
