"""The docs cannot fall behind the code: generated sections are current, and every CLI
command, invariant and page action is mentioned."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpocket.model.invariants import INVARIANTS
from kvpocket.model.pages import PAGE_ACTIONS
from kvpocket.verify.cli.commands import COMMANDS
from kvpocket.verify.cli.docgen import render

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_generated_sections_are_current(path: Path) -> None:
    text = path.read_text()
    assert render(text) == text, (
        f"{path.name} is stale: run `python -m kvpocket.verify.cli.docgen`")


def _all_docs() -> str:
    return "\n".join(p.read_text() for p in [*DOCS, ROOT / "README.md"])


@pytest.mark.parametrize("name", [c[0] for c in COMMANDS])
def test_every_cli_command_is_documented(name: str) -> None:
    assert f"kvpocket {name}" in _all_docs()


@pytest.mark.parametrize("name", [i.name for i in INVARIANTS])
def test_every_invariant_is_in_the_spec(name: str) -> None:
    assert f"`{name}`" in (ROOT / "docs" / "spec.md").read_text()


@pytest.mark.parametrize("name", sorted(PAGE_ACTIONS))
def test_every_page_action_is_in_the_spec(name: str) -> None:
    assert f"`{name}`" in (ROOT / "docs" / "spec.md").read_text()


def test_cli_reference_covers_every_subcommand_and_option() -> None:
    import argparse

    from kvpocket.verify.cli.commands import build_parser
    from kvpocket.verify.cli.docgen import _subcommands

    text = (ROOT / "docs" / "cli.md").read_text()
    for name, sub in _subcommands(build_parser()).items():
        assert f"### `kvpocket {name}`" in text
        parsers = {name: sub, **{f"{name} {n}": p for n, p in _subcommands(sub).items()}}
        for label, p in parsers.items():
            assert f"`kvpocket {label}`" in text
            for action in p._actions:
                if isinstance(action, argparse._SubParsersAction):
                    continue
                for opt in action.option_strings:
                    assert opt in text, f"{opt} of `kvpocket {label}` is not in docs/cli.md"


def test_proof_status_matches_the_committed_json() -> None:
    import json

    data = json.loads((ROOT / "docs" / "proof-status.json").read_text())
    rows = data["obligations"]
    assert rows, "docs/proof-status.json holds no obligations"
    assert {r["status"] for r in rows} <= {"proved", "violated", "unknown"}
    spec = (ROOT / "docs" / "spec.md").read_text()
    proved = sum(r["status"] == "proved" for r in rows)
    assert f"{proved} of {len(rows)} obligations proved" in spec
    for config in {r["config"] for r in rows}:
        assert f"| {config} |" in spec


def test_index_links_every_doc() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for path in DOCS:
        if path.name != "index.md":
            assert f"({path.name})" in index, f"docs/index.md does not link {path.name}"
        assert f"docs/{path.name}" in readme, f"README does not list docs/{path.name}"


def test_adapter_guide_names_every_event_action() -> None:
    from kvpocket.verify.traces.trace import CHOICE_KINDS, OBSERVED_KEYS, event_params

    guide = (ROOT / "docs" / "adapter-guide.md").read_text()
    for name, params in event_params().items():
        assert f"| `{name}` |" in guide
        for param in params:
            assert f"`{param}`" in guide
    for kind in (*CHOICE_KINDS, *OBSERVED_KEYS):
        assert f"`{kind}`" in guide
