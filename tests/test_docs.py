"""The docs cannot fall behind the code: generated sections are current, and every CLI
command, invariant and page action is mentioned."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvpocket.model.errors import UnknownSequenceError
from kvpocket.model.executor import Executor
from kvpocket.model.invariants import INVARIANTS
from kvpocket.model.pages import PAGE_ACTIONS
from kvpocket.verify import layers
from kvpocket.verify.cli.commands import COMMANDS
from kvpocket.verify.cli.docgen import render
from kvpocket.verify.layers import Import

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


# ---- docs/architecture.md: the claims a test can check ------------------------------------
ARCHITECTURE = ROOT / "docs" / "architecture.md"


@functools.cache
def _imports() -> list[Import]:
    return layers.imports()


def _prose(path: Path) -> str:
    """A doc without its generated sections."""
    return re.sub(r"<!-- BEGIN GENERATED.*?END GENERATED: [\w-]+ -->", "", path.read_text(),
                  flags=re.S)


def test_architecture_names_only_files_and_definitions_that_exist() -> None:
    """`dir/file.py: name, other` and `model.x` references: the file or module exists and
    defines each name (a def, class or assignment, or an action-table key)."""
    text = _prose(ARCHITECTURE)
    missing: list[str] = []
    refs = re.findall(r"`((?:model|impl|verify|tests|docs|scripts)/[\w/.-]*\.(?:py|md|json|sh))"
                      r"(?:(?::: ?|: )([^`]+))?`", text)
    assert len(refs) > 40
    for path, names in refs:
        if not (ROOT / path).exists():
            missing.append(path)
            continue
        source = (ROOT / path).read_text()
        for name in filter(None, re.split(r"[,/ ]+", names)):
            name = name.split(".")[-1]
            if not re.search(rf"(def|class) {name}\b|^\s*{name}\s*[:=]|\b{name} = |\"{name}\"",
                             source, re.M):
                missing.append(f"{path}: {name}")
    for module in re.findall(r"`((?:model|impl|verify)(?:\.\w+)+)`", text):
        base = ROOT.joinpath(*module.split("."))
        if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
            missing.append(module)
    assert not missing, "docs/architecture.md names what does not exist: " + ", ".join(missing)


def test_architecture_names_what_impl_reads_of_the_model() -> None:
    found = _imports()
    assert not {i.target for i in found if i.module.split(".")[0] == "model"
                and i.target.split(".")[0] in ("impl", "verify")}
    reads = {i.target for i in found if i.module.split(".")[0] == "impl"
             and i.target.split(".")[0] == "model"}
    section = _prose(ARCHITECTURE).split("## Packages and layers", 1)[1].strip().split("\n\n")[0]
    named = set(re.findall(r"`(model\.\w+)`", section))
    assert reads == named, f"impl/ reads {sorted(reads)}; the page says {sorted(named)}"


def _toy_flush(ex: Executor, seq: int) -> None:
    """A toy API action: the sequence must exist; nothing changes."""
    ex.require(0 <= seq < ex.lay.seqs, UnknownSequenceError(f"toy_flush: no sequence {seq}"))


def test_adding_an_action_touches_the_files_named_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a toy action in the table, the docs that go stale are among those the page says
    to regenerate, and the files it says to edit by hand are the table's, the
    implementation handle's and the adapter guide, whose check the toy fails."""
    from kvpocket.impl.kvcache import KVCache
    from kvpocket.model import api
    from kvpocket.verify.traces.trace import event_params

    line = next(x for x in ARCHITECTURE.read_text().splitlines()
                if x.startswith("Files an action touches:"))
    by_hand_part, regenerated_part = line.split(";")
    by_hand = set(re.findall(r"`([\w/.-]+)`", by_hand_part))
    regenerated = set(re.findall(r"`([\w/.-]+)`", regenerated_part))
    assert len(by_hand) == 3 and len(regenerated) == 2
    toy = api.ApiAction("toy_flush", "api", (api.Param("seq", "seq"),), _toy_flush, False,
                        ("unknown_sequence",), "the sequence exists")
    monkeypatch.setitem(api.API, "toy_flush", toy)
    # The minimal log is recorded by the implementation, which has no toy_flush to call: the
    # section as committed stands in for it (the toy changes nothing in it).
    from kvpocket.verify.cli import docgen

    committed = _generated(ADAPTER_GUIDE.read_text(), "minimal-log").rstrip("\n")
    monkeypatch.setitem(docgen.GENERATORS, "minimal-log", lambda: committed)
    # architecture.md regenerates after any code edit (its sizes); the others only if stale.
    stale = {f"docs/{p.name}" for p in DOCS
             if p != ARCHITECTURE and render(p.read_text()) != p.read_text()}
    assert "docs/spec.md" in stale and stale | {"docs/architecture.md"} == regenerated
    assert "toy_flush" in event_params()
    assert "| `toy_flush` |" not in (ROOT / "docs" / "adapter-guide.md").read_text()
    assert by_hand == {m.removeprefix("kvpocket.").replace(".", "/") + ".py"
                       for m in (api.__name__, KVCache.__module__)} | {"docs/adapter-guide.md"}


def test_architecture_lists_impl_modules_bottom_up() -> None:
    """The "impl/ layering" paragraph names every impl/ module, and none imports one the
    paragraph names later."""
    section = _prose(ARCHITECTURE).split("## impl/ layering", 1)[1].split("\n## ", 1)[0]
    order = [n.rstrip("/") for n in re.findall(r"`([\w/]+)`", section.split("From the bottom:")[1])
             if (ROOT / "impl" / f"{n.rstrip('/')}.py").is_file()
             or (ROOT / "impl" / n.rstrip("/") / "__init__.py").is_file()]
    modules = {m.split(".")[1] for m in layers.modules() if m.count(".") >= 1
               and m.split(".")[0] == "impl"}
    assert sorted(order) == sorted(modules)
    upward = [f"{i.module} -> {i.target}" for i in _imports()
              if i.module.count(".") and i.target.count(".") and i.module.split(".")[0] == "impl"
              and i.target.split(".")[0] == "impl" and i.module.split(".")[1] != i.target.split(".")[1]
              and order.index(i.target.split(".")[1]) > order.index(i.module.split(".")[1])]
    assert not upward, upward


REPEAT_WORDS = 12  # a passage this long, twice in one document, is a paste gone wrong


def _prose_words(text: str) -> list[str]:
    """A document's words outside generated sections, code blocks and table rows (where
    the same cells legitimately repeat)."""
    text = re.sub(r"<!-- BEGIN GENERATED: ([\w-]+) -->.*?<!-- END GENERATED: \1 -->", "", text,
                  flags=re.DOTALL)
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return " ".join(x for x in text.splitlines() if not x.lstrip().startswith("|")).split()


@pytest.mark.parametrize("path", sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]),
                         ids=lambda p: p.name)
def test_no_passage_is_written_twice(path: Path) -> None:
    words = _prose_words(path.read_text())
    first: dict[str, int] = {}
    for i in range(len(words) - REPEAT_WORDS + 1):
        passage = " ".join(words[i:i + REPEAT_WORDS])
        at = first.setdefault(passage, i)
        assert i == at or i - at < REPEAT_WORDS, f"{path.name}: twice: {passage!r}"


ADAPTER_GUIDE = ROOT / "docs" / "adapter-guide.md"


def _generated(text: str, name: str) -> str:
    m = re.search(rf"<!-- BEGIN GENERATED: {name} -->\n(.*?)<!-- END GENERATED: {name} -->",
                  text, flags=re.DOTALL)
    assert m, name
    return m.group(1)


def test_the_adapter_guides_minimal_log_is_a_valid_complete_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvpocket.verify.cli.commands import main

    text = ADAPTER_GUIDE.read_text()
    (block,) = re.findall(r"```text\n(.*?)```", _generated(text, "minimal-log"), flags=re.DOTALL)
    log = tmp_path / "minimal.ndjson"
    log.write_text(block)
    assert main(["trace", "check", str(log)]) == 0
    assert "events valid" in capsys.readouterr().out
    lines = block.splitlines()
    actions = {json.loads(x).get("action") for x in lines[1:-1]}
    assert {"create", "resume", "resize", "advance", "stop_committing"} <= actions
    assert '"pocket",' in block and '{"error":' in block  # a pop and a refused misuse
    # The guide's recipe for the end marker computes this log's marker.
    recipe = text.split("<!-- recipe: end-marker -->\n```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, Any] = {}
    exec(recipe, scope)
    assert json.loads(scope["end_marker"](lines[:-1])) == json.loads(lines[-1])


def test_the_adapter_guide_lists_every_config_field() -> None:
    from kvpocket.model.config import KVConfig, LifeCycle

    table = _generated(ADAPTER_GUIDE.read_text(), "config-fields")
    listed = set(re.findall(r"^\| `([\w.\[\]]+)` \|", table, flags=re.MULTILINE))

    def paths(obj: Any, prefix: str = "") -> set[str]:
        if isinstance(obj, dict):
            return {p for k, v in obj.items() for p in {prefix + k} | paths(v, prefix + k + ".")}
        if isinstance(obj, list) and obj and isinstance(obj[0], dict):
            return paths(obj[0], prefix.rstrip(".") + "[].")
        return set()

    cfg = KVConfig(life_cycles=(LifeCycle("swa", window=3),), slots_per_level=(4, 4, 4))
    assert paths(cfg.to_json()) <= listed
    assert {"pocket.evict_parked", "max_pages", "slots_per_level[]", "order"} <= listed
    assert "each** pool group" in table  # slots are per pool group


USER_DOCS = ("README.md", "docs/index.md", "docs/adapter-guide.md", "docs/cli.md",
             "docs/campaigns.md", "docs/spec.md")


@pytest.mark.parametrize("name", USER_DOCS)
def test_user_docs_cite_no_project_history(name: str) -> None:
    """A reader outside the project has no "issue 21 item 2" or "this round" to look up."""
    text = (ROOT / name).read_text()
    found = re.findall(r"(?i)\bissue \d+|\bitem \d+ of|\bthis round\b|\bbefore these changes\b",
                       text)
    assert not found, (name, found)


def _readme_commands() -> list[str]:
    """The `kvpocket ...` lines of the README's CLI block, comments cut (synopsis lines,
    with `[...]`, are not commands to run as written)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## The CLI", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [x.split("  #", 1)[0].strip() for x in block.splitlines()]
    return [x for x in lines if x.startswith("kvpocket ") and "[" not in x]


def test_the_readme_commands_parse_as_written() -> None:
    import shlex

    from kvpocket.verify.cli.commands import build_parser

    commands = _readme_commands()
    assert len(commands) >= 10
    for cmd in commands:
        if "$(" not in cmd:
            build_parser().parse_args(shlex.split(cmd)[1:])  # raises CliError if not


def test_the_readme_replay_command_works_after_several_runs(tmp_path: Path) -> None:
    """Every run that fails writes another failure trace: the command still names one."""
    import os
    import shutil
    import subprocess
    import sys

    (cmd,) = [c for c in _readme_commands() if c.startswith("kvpocket replay")]
    out = tmp_path / "kvpocket-out"
    out.mkdir()
    trace = ROOT / "verify" / "regressions" / "migration-during-park-revalidate.jsonl"
    for name in ("failure-tiny-unsafe-0-r0.jsonl", "failure-tiny-unsafe-0-r0-2.jsonl"):
        shutil.copy(trace, out / name)
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "kvpocket").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m kvpocket "$@"\n')
    (shim / "kvpocket").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT / ".devpath")}
    done = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "implementation and model agree" in done.stdout
