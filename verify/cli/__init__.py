"""The `kvpocket` command line (`commands`), its rich output (`render`) and the generated
docs (`docgen`). `python -m kvpocket.verify.cli` is `kvpocket`.

`main` (the console script's entry) imports the command line itself, so a Ctrl-C while it
loads (the first second: argparse, NumPy, the model) ends with one line and status 130,
never a traceback; `COMMANDS` and `build_parser` are `commands`' own, loaded on first use."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["COMMANDS", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    try:  # the CLI itself, here: a Ctrl-C while it loads is caught below
        from kvpocket.verify.cli.commands import main as run
    except KeyboardInterrupt:
        sys.stderr.write("kvpocket: interrupted\n")
        return 130
    return run(argv)


def __getattr__(name: str) -> Any:
    if name in ("COMMANDS", "build_parser"):
        # loaded on first use, for the same reason as `main`
        from kvpocket.verify.cli import commands

        return getattr(commands, name)
    raise AttributeError(name)
