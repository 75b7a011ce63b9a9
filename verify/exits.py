"""The exit statuses of every `kvpocket` command and script (docs/cli.md), in one place.

A verdict is one of these; the worst of several verdicts is the one with the highest
`SEVERITY` (`worst`): a found bug outranks an incomplete check, which outranks clean.
"""

from __future__ import annotations

from collections.abc import Iterable

EXIT_OK = 0  # every check ran to its end and found nothing
EXIT_FOUND = 1  # a bug: a divergence, a violated invariant or obligation, wrong data
EXIT_USAGE = 2  # a usage error: a bad option, config or file (the message names it)
# Nothing was found, but the check did not run to its end: an obligation Z3 could not
# decide within its resource limit, a timed campaign that ran short of its plan.
EXIT_INCOMPLETE = 3
EXIT_INTERRUPTED = 130  # Ctrl-C: the report covers the part that ran
EXIT_TERMINATED = 143  # SIGTERM (128 + 15): the same path as Ctrl-C

SEVERITY = (EXIT_OK, EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, EXIT_FOUND)
NAMES = {EXIT_OK: "clean", EXIT_FOUND: "bug found", EXIT_USAGE: "usage error",
         EXIT_INCOMPLETE: "incomplete", EXIT_INTERRUPTED: "interrupted",
         EXIT_TERMINATED: "terminated"}


def worst(codes: Iterable[int]) -> int:
    """The combined verdict of several: the most severe (an unknown code counts as found)."""
    rank = {c: i for i, c in enumerate(SEVERITY)}
    return max(codes, key=lambda c: rank.get(c, len(SEVERITY)), default=EXIT_OK)
