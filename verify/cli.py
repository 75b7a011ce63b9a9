"""The `kvpocket` command line.

Each subcommand is a small adapter: it parses options, builds a config from
`presets`, and calls the module that does the work. User errors (a bad option
value, a malformed file) print one line naming the option and the allowed
values and exit with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from kvpocket.model.config import ConfigError, KVConfig, PocketPolicy
from kvpocket.model.errors import UsageError
from kvpocket.model.spec import mermaid_page_life, spec_json

from .presets import DEFAULT_PRESET, PRESETS, preset

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliError(message)


def config_from_args(name: str | None, policy: str | None, pocket: bool = True) -> KVConfig:
    cfg = preset(name or DEFAULT_PRESET)
    if policy is not None:
        cfg = cfg.with_pocket(enabled=pocket, policy=PocketPolicy.parse(policy, "--policy"))
    elif not pocket:
        cfg = cfg.with_pocket(enabled=False)
    return cfg


def _add_config_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="NAME",
                   help=f"a preset (default {DEFAULT_PRESET}); `kvpocket fuzz --list-configs`")
    p.add_argument("--policy", metavar="POLICY",
                   help="pocket policy: revalidate (default), pin or unsafe")


def cmd_spec(args: argparse.Namespace) -> int:
    """Print the action table and the invariant catalogue."""
    cfg = config_from_args(args.config, args.policy)
    if args.diagram:
        print(mermaid_page_life())
        return EXIT_OK
    data = spec_json(cfg)
    if args.json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    from .render import print_spec

    print_spec(data)
    return EXIT_OK


Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


def _spec_args(p: argparse.ArgumentParser) -> None:
    _add_config_options(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="print actions and invariants as JSON")
    g.add_argument("--diagram", action="store_true",
                   help="print the page-life state diagram (Mermaid)")


def _list_configs() -> None:
    for p in PRESETS.values():
        print(f"{p.name:12} {p.description}")


COMMANDS: list[Command] = [
    ("spec", _spec_args, cmd_spec),
]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvpocket", description=(
        "Reference spec and verification kit for paged KV caches with an SWA reuse pocket."))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, add_args, run in COMMANDS:
        run_doc = (run.__doc__ or "").strip().splitlines()
        p = sub.add_parser(name, help=run_doc[0] if run_doc else None)
        add_args(p)
        p.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if getattr(args, "list_configs", False):
            _list_configs()
            return EXIT_OK
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        code: int = args.run(args)
        return code
    except (CliError, ConfigError, UsageError) as exc:
        print(f"kvpocket: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kvpocket: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
