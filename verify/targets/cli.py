"""`kvpocket fuzz --target NAME`: the target campaign from the command line.

Every option is checked before any work (one line, exit 2): the target must be known and
installed, `--config` one of its presets, the lockstep-only options absent. The report's
first line names the engine and its version.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvpocket.verify.targets.base import CheckFailure, Target, TargetUnavailable
from kvpocket.verify.targets.campaign import (
    DEFAULT_STEPS,
    ReproducerError,
    TargetReport,
    known_bug,
    read_reproducer,
    run_campaign,
    run_ops,
)
from kvpocket.verify.targets.registry import TARGETS, load_target
from kvpocket.verify.traces.trace import write_atomic
from kvpocket.verify.usage import (
    MAX_EXAMPLES,
    MAX_SEED,
    MAX_STEPS,
    check_int,
    check_output,
    check_output_dir,
    use_hypothesis_home,
)
from kvpocket.verify.verdicts import target_verdict

# Options of the lockstep campaign a target campaign does not take (flag, default).
LOCKSTEP_ONLY = (("--policy", "policy", None), ("--minutes", "minutes", None),
                 ("--workers", "workers", None), ("--database", "database", None),
                 ("--profile", "profile", None), ("--backend", "backend", "numpy"),
                 ("--keep-going", "keep_going", False), ("--verbose", "verbose", False),
                 ("--mutant", "mutant", None))


def run_target_fuzz(args: argparse.Namespace, error: type[Exception]) -> int:
    """Returns the exit status; raises `error` (the CLI's one-line usage error)."""
    if args.target not in TARGETS:
        raise error(f"argument --target: expected one of {', '.join(TARGETS)}, got {args.target!r}")
    for flag, attr, default in LOCKSTEP_ONLY:
        if getattr(args, attr, default) != default:
            raise error(f"argument {flag}: not used with --target (the target campaign takes "
                        "--config, --examples, --steps, --seed, --out, --json, --replay, "
                        "--avoid-known)")
    check_int("--examples", args.examples, 1, MAX_EXAMPLES)
    check_int("--steps", args.steps, 1, MAX_STEPS)
    check_int("--seed", args.seed, 0, MAX_SEED)
    check_output("--json", args.json)
    check_output_dir("--out", args.out)
    replay = None
    if args.replay is not None:
        try:
            replay = read_reproducer(Path(args.replay))
        except ReproducerError as exc:
            raise error(f"argument --replay: {exc}") from None
        if replay[0] != args.target:
            raise error(f"argument --replay: {args.replay} is a reproducer for target "
                        f"{replay[0]!r}, not {args.target!r}")
    target = load_target(args.target)
    try:
        version = target.version()
    except TargetUnavailable as exc:
        raise error(f"argument --target: {exc}") from None
    avoid = getattr(args, "avoid_known", None)
    if avoid:
        target = _steered_clear(target, avoid, f"{args.target} {version}", error)
    presets = target.presets()
    name = args.config or next(iter(presets))
    if name not in presets:
        raise error(f"argument --config: expected one of {', '.join(presets)} for target "
                    f"{args.target}, got {name!r}")
    # A replay builds the reproducer's own configuration, not the default preset (which an
    # older release may not support).
    built = replay[1] if replay is not None and args.config is None else presets[name]
    try:
        target.build(built)  # imports the engine: a broken install is a usage error
    except TargetUnavailable as exc:
        raise error(f"argument --target: {exc}") from None
    except Exception as exc:  # the engine refuses the preset (a release without the feature)
        raise error(f"argument --config: {built.name} cannot be built by {args.target} "
                    f"{version}: {type(exc).__name__}: {exc}") from None
    print(f"{args.target} {version}", flush=True)
    if replay is not None:
        _, cfg, ops, data = replay
        if data.get("version") != version:
            print(f"note: recorded with {args.target} {data.get('version')}")
        try:
            run_ops(target, cfg, ops)
        except CheckFailure as exc:
            print(f"replay of {len(ops)} ops: FAILS: {exc}")
            return 1
        print(f"replay of {len(ops)} ops: passes every check")
        return 0
    use_hypothesis_home(args.out)
    report = run_campaign(target, presets[name], examples=args.examples or target.default_examples,
                          steps=args.steps or DEFAULT_STEPS, campaign_seed=args.seed,
                          out_dir=args.out, show_progress=not args.no_progress)
    known = None if report.failure is None else known_bug(target, presets[name],
                                                           report.failure.ops)
    print_report(report, known, getattr(target, "checks_line", lambda: None)())
    data = report.to_json()
    data["known_engine_bug"] = known
    if args.json:
        write_atomic(Path(args.json), json.dumps(data, indent=1) + "\n")
    # A plan that never reached one of the target's rare states checked less than it says.
    return target_verdict(data).code


def _steered_clear(target: Target, names: str, release: str, error: type[Exception]) -> Target:
    """The target steered clear of its known bugs ("all") or of those named; a name the
    installed release does not list is a usage error naming those it does."""
    known: dict[str, str] = getattr(target, "known_bugs", dict)()
    only = None if names == "all" else tuple(n.strip() for n in names.split(",") if n.strip())
    unknown = [n for n in only or () if n not in known]
    if only == () or unknown:
        raise error(f"argument --avoid-known: expected 'all' or names of known bugs of "
                    f"{release} ({', '.join(known) or 'none listed'}), got {names!r}")
    # `without_known_bugs` is None where the target lists none: nothing to avoid.
    return getattr(target, "without_known_bugs", lambda only=None: None)(only=only) or target


def print_report(report: TargetReport, known: str | None = None,
                 checks_line: str | None = None) -> None:
    print(report.headline())
    print(f"  examples {report.examples}, ops {report.steps}, {report.seconds:.1f} s, "
          f"{report.steps_per_second:,.0f} ops/s, "
          f"{report.scheduler_steps_per_second:,.0f} scheduler steps/s")
    rare = set(report.rare_states)
    print("  reached: " + ", ".join(f"{k} {v}" for k, v in sorted(report.coverage.items())
                                    if k not in rare))
    if report.rare_states:
        print("  rare states: " + ", ".join(
            f"{k} {v} (first in example {report.first_reached[k]})" if v else f"{k} 0"
            for k, v in report.rare_states.items()))
    f = report.failure
    if f is None and report.coverage_gaps:
        print(f"  INCOMPLETE: coverage gaps (never reached): {', '.join(report.coverage_gaps)}"
              " -- give it more --examples")
    if f is None:
        diverged = sum(v for k, v in report.coverage.items() if k.startswith("trace_divergence"))
        if diverged:  # report mode: say what was not held against the engine
            print("  the data oracle and pool invariants passed; the event log diverged from the "
                  f"kvpocket model in {diverged} example(s), counted, not failed (report mode: "
                  "KVPOCKET_VLLM_TRACE_CHECK=report, docs/targets/vllm.md)")
        elif checks_line is not None:  # a target without an event log names its checks
            print(f"  {checks_line}")
        elif any(k.startswith("trace_off") for k in report.coverage):
            why = sorted(k.removeprefix("trace_off: ") for k in report.coverage
                         if k.startswith("trace_off"))
            print("  every check passed (data oracle, pool invariants; the event log not "
                  f"checked in examples with {'; '.join(why)}: docs/targets/vllm.md)")
        else:
            print("  every check passed (data oracle, pool invariants, event log)")
        return
    print(f"  FAILURE ({f.check}) after {len(f.ops)} ops (shrunk): {f.message}")
    if known:
        print(f"  known engine bug {known}")
    print("  ops: " + " ".join(str(op) for op in f.ops))
    if f.reproducer:
        print(f"  reproducer: {f.reproducer}   (kvpocket fuzz --target {report.target} "
              f"--replay {f.reproducer})")
        print(f"  test:       {f.test}")
