"""The verdict of every engine's report, stated once.

Each engine (a fuzz campaign, the fuzz matrix, a real engine's target campaign, `prove`)
writes a JSON report. Its verdict, an exit status of `exits` with a few words, is read off
that report here, and nowhere else: the command that ran the engine returns it, and
`kvpocket verdict REPORT...` reads the same function from the file, so the two cannot
differ. The rule is the same for every engine, in this order: a bug found; interrupted;
a plan that ran short, or a check left undecided (a proof's unknown); a rare state the plan
never reached (the run checked less than it says); clean.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvpocket.verify.exits import EXIT_FOUND, EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK


@dataclass(frozen=True)
class Verdict:
    what: str  # "fuzz", "prove", "vllm", ...
    code: int  # an exit status (`exits`)
    words: str  # the verdict in a few words, with what was run

    def line(self) -> str:
        return f"{self.what}: {self.words}"


Report = Mapping[str, Any]


def _gaps(names: list[str]) -> str:
    return f"{len(names)} rare states never reached ({', '.join(names)})"


def _ruled(what: str, ran: str, found: str | None, interrupted: bool, gaps: list[str],
           clean: str, short: str | None = None) -> Verdict:
    """The rule of the module's docstring for an engine that runs examples: `found` (the
    bug's words), `short` (why the plan ran short), `gaps` (rare states never reached)."""
    if found is not None:
        return Verdict(what, EXIT_FOUND, f"BUG FOUND{found} ({ran})")
    if interrupted:
        return Verdict(what, EXIT_INTERRUPTED, f"interrupted after {ran}")
    if short is not None:
        return Verdict(what, EXIT_INCOMPLETE, f"incomplete: {short}")
    if gaps:
        return Verdict(what, EXIT_INCOMPLETE, f"incomplete: no bug found, but {_gaps(gaps)} "
                       f"({ran})")
    return Verdict(what, EXIT_OK, clean)


def matrix_verdict(d: Report) -> Verdict:
    ran = f"{d['examples']:,} examples, {len(d['cells'])} cells"
    f = d["failures"][0] if d["failures"] else None
    short = f"{d['examples']:,} of the {d['intended_examples']:,} examples its plan intends " \
        "ran" if d.get("ran_short") else None
    # Hypothesis may run a few more examples than a slice asks for: the plan is the count
    plan = f"a plan of {d['total_examples']:,}, " if d.get("total_examples") else ""
    return _ruled("fuzz", ran, None if f is None else f" in {f['cell']}: {f['kind']}",
                  d["interrupted"], d.get("unreached") or [],
                  f"no bug found, the plan ran to its end "
                  f"({plan}{d['examples']:,} examples run, {len(d['cells'])} cells)", short)


def campaign_verdict(d: Report) -> Verdict:
    ran = f"{d['examples']:,} examples of {d['config']}/{d['policy']}"
    found = f": {(d['failures'][0]['message'].splitlines() or ['failure'])[0]}" \
        if d["failures"] else None
    return _ruled("fuzz", ran, found, d["interrupted"], d.get("coverage_gaps") or [],
                  f"no bug found ({ran})")


def target_verdict(d: Report) -> Verdict:
    ran = f"{d['examples']:,} examples of {d['target']} {d['version']} {d['config']}"
    f = d["failure"]
    known = f", known engine bug {d['known_engine_bug']}" if d.get("known_engine_bug") else ""
    return _ruled(d["target"], ran, None if f is None else f" ({f['check']}{known})",
                  bool(d.get("interrupted")), d["coverage_gaps"],
                  f"no bug found, every rare state reached ({ran})")


def prove_verdict(d: Report) -> Verdict:
    counts = {k: sum(c[k] for c in d["summary"].values())
              for k in ("proved", "violated", "unknown")}
    total = sum(counts.values())
    if counts["violated"]:
        return Verdict("prove", EXIT_FOUND, f"VIOLATED: {counts['violated']} of {total} "
                       "obligations")
    if d.get("interrupted"):
        return Verdict("prove", EXIT_INTERRUPTED, f"interrupted: {d['cells_finished']} of "
                       f"{d['cells']} configurations finished")
    if counts["unknown"]:
        return Verdict("prove", EXIT_INCOMPLETE, f"NOT ALL PROVED: {counts['proved']} proved, "
                       f"{counts['unknown']} unknown (a resource limit) of {total}")
    return Verdict("prove", EXIT_OK, f"all {total} obligations proved")


def _kind(d: Report) -> Callable[[Report], Verdict] | None:
    if d.get("kind") == "matrix":
        return matrix_verdict
    if "summary" in d and "obligations" in d:
        return prove_verdict
    if "target" in d and "coverage_gaps" in d:
        return target_verdict
    if "rare_states" in d and "config" in d:
        return campaign_verdict
    return None


def verdict_of(d: Report) -> Verdict | None:
    """The verdict of any engine's report; None for a dictionary that is none of them.
    Raises KeyError or TypeError for a report that lacks a field its kind has."""
    read = _kind(d)
    return None if read is None else read(d)
