"""`kvpocket verdict REPORT...`: one line that combines the verdicts of several reports.

`scripts/main.sh` ends with it, so a run of the main job closes on one line that says
whether every check it made ran to its end and found nothing, and exits with the worst
of their statuses (`exits.worst`): a fuzz campaign that found nothing beside a proof with
an unknown obligation is incomplete, never clean. Each report is read from the JSON that
`kvpocket fuzz --json` (the model's or a target's) and `kvpocket prove --json` write; the
verdict of each is `verify/verdicts.py`'s, the same the command returned.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvpocket.verify.exits import EXIT_OK, NAMES, worst
from kvpocket.verify.verdicts import Verdict, verdict_of


class ReportError(ValueError):
    """A file that is not a report this command reads; the message names it."""


def read_verdict(path: Path) -> Verdict:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: not a JSON report ({exc})") from None
    try:
        verdict = verdict_of(d) if isinstance(d, dict) else None
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ReportError(f"{path}: a report without its field {exc}") from None
    if verdict is not None:
        return verdict
    raise ReportError(f"{path}: not a report of `kvpocket fuzz --json` or `kvpocket prove "
                      "--json`")


def combine(verdicts: list[Verdict]) -> tuple[int, str]:
    """The worst status, and the line that names every verdict."""
    code = worst(v.code for v in verdicts)
    head = "CLEAN" if code == EXIT_OK else NAMES[code].upper()
    return code, f"kvpocket: {head}: " + "; ".join(v.line() for v in verdicts)
