"""The `kvpocket` command line (`commands`), its rich output (`render`) and the generated
docs (`docgen`). `python -m kvpocket.verify.cli` is `kvpocket`."""

from kvpocket.verify.cli.commands import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]
