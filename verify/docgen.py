"""Regenerate the generated sections of the docs from the model.

Sections sit between `<!-- BEGIN GENERATED: NAME -->` and `<!-- END GENERATED: NAME -->`.
`python -m kvpocket.verify.docgen` rewrites them in place; a test fails when they are stale,
so the docs cannot drift from the action table.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from kvpocket.model.spec import markdown_tables, mermaid_page_life

from .presets import DEFAULT_PRESET, preset

DOCS = Path(__file__).resolve().parents[1] / "docs"

GENERATORS: dict[str, Callable[[], str]] = {
    "page-life": lambda: "```mermaid\n" + mermaid_page_life() + "\n```",
    "spec-tables": lambda: markdown_tables(preset(DEFAULT_PRESET)),
}


def render(text: str) -> str:
    def fill(m: re.Match[str]) -> str:
        name = m.group(1)
        return f"<!-- BEGIN GENERATED: {name} -->\n{GENERATORS[name]()}\n<!-- END GENERATED: {name} -->"

    return re.sub(r"<!-- BEGIN GENERATED: ([\w-]+) -->.*?<!-- END GENERATED: \1 -->", fill, text,
                  flags=re.DOTALL)


def main() -> int:
    for path in sorted(DOCS.glob("*.md")):
        old = path.read_text()
        new = render(old)
        if new != old:
            path.write_text(new)
            print(f"updated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
