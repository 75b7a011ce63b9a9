"""`kvpocket verdict REPORT...`: one line that combines the verdicts of several reports.

`scripts/main.sh` ends with it, so a run of the main job closes on one line that says
whether every check it made ran to its end and found nothing, and exits with the worst
of their statuses (`exits.worst`): a fuzz campaign that found nothing beside a proof with
an unknown obligation is incomplete, never clean. Each report is read from the JSON that
`kvpocket fuzz --json` and `kvpocket prove --json` write.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpocket.verify.exits import (
    EXIT_FOUND,
    EXIT_INCOMPLETE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    NAMES,
    worst,
)


class ReportError(ValueError):
    """A file that is not a report this command reads; the message names it."""


@dataclass(frozen=True)
class Verdict:
    what: str  # "fuzz", "prove", ...
    code: int  # an exit status (`exits`)
    words: str  # the verdict in a few words, with what was run

    def line(self) -> str:
        return f"{self.what}: {self.words}"


def _matrix(d: dict[str, Any]) -> Verdict:
    ran = f"{d['examples']:,} examples, {len(d['cells'])} cells"
    if d["failures"]:
        f = d["failures"][0]
        return Verdict("fuzz", EXIT_FOUND, f"BUG FOUND in {f['cell']}: {f['kind']} ({ran})")
    if d["interrupted"]:
        return Verdict("fuzz", EXIT_INTERRUPTED, f"interrupted after {ran}")
    if d.get("ran_short"):
        return Verdict("fuzz", EXIT_INCOMPLETE, f"incomplete: {d['examples']:,} of the "
                       f"{d['intended_examples']:,} examples its plan intends ran")
    # Hypothesis may run a few more examples than a slice asks for: the plan is the count
    plan = f"a plan of {d['total_examples']:,}, " if d.get("total_examples") else ""
    gaps = f", {len(d['unreached'])} rare states never reached" if d.get("unreached") else ""
    return Verdict("fuzz", EXIT_OK, f"no bug found, the plan ran to its end "
                   f"({plan}{d['examples']:,} examples run, {len(d['cells'])} cells{gaps})")


def _campaign(d: dict[str, Any]) -> Verdict:
    ran = f"{d['examples']:,} examples of {d['config']}/{d['policy']}"
    if d["failures"]:
        first = (d["failures"][0]["message"].splitlines() or ["failure"])[0]
        return Verdict("fuzz", EXIT_FOUND, f"BUG FOUND: {first} ({ran})")
    if d["interrupted"]:
        return Verdict("fuzz", EXIT_INTERRUPTED, f"interrupted after {ran}")
    return Verdict("fuzz", EXIT_OK, f"no bug found ({ran})")


def _prove(d: dict[str, Any]) -> Verdict:
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


def read_verdict(path: Path) -> Verdict:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: not a JSON report ({exc})") from None
    try:
        if isinstance(d, dict) and d.get("kind") == "matrix":
            return _matrix(d)
        if isinstance(d, dict) and "summary" in d and "obligations" in d:
            return _prove(d)
        if isinstance(d, dict) and "rare_states" in d and "config" in d:
            return _campaign(d)
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ReportError(f"{path}: a report without its field {exc}") from None
    raise ReportError(f"{path}: not a report of `kvpocket fuzz --json` or `kvpocket prove "
                      "--json`")


def combine(verdicts: list[Verdict]) -> tuple[int, str]:
    """The worst status, and the line that names every verdict."""
    code = worst(v.code for v in verdicts)
    head = "CLEAN" if code == EXIT_OK else NAMES[code].upper()
    return code, f"kvpocket: {head}: " + "; ".join(v.line() for v in verdicts)
