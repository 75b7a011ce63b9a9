"""The docs cannot fall behind the code: generated sections are current, and every CLI
command, invariant and page action is mentioned."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpocket.model.invariants import INVARIANTS
from kvpocket.model.pages import PAGE_ACTIONS
from kvpocket.verify.cli import COMMANDS
from kvpocket.verify.docgen import render

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_generated_sections_are_current(path: Path) -> None:
    text = path.read_text()
    assert render(text) == text, (
        f"{path.name} is stale: run `python -m kvpocket.verify.docgen`")


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
