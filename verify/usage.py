"""Usage errors and the option checks every command shares.

A `CliError` is a user error: the command line prints it as one line naming the option
and the allowed values, and exits with status 2. Every check runs before any work is
done, so a bad option never costs a campaign or overwrites an output. The checks sit
below every engine so that an engine's own command (`bench`, `fuzz --target`) refuses bad
input with the same words as the rest of the CLI without importing the CLI.
"""

from __future__ import annotations

import math
import os
import tempfile
import tomllib
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


MAX_STEPS = 500  # rules per example; more makes Hypothesis refuse the example as too large
MAX_MINUTES = 7 * 24 * 60.0
MAX_EXAMPLES = 10_000_000
# Hypothesis's first example of a state machine is its simplest, the empty run: one
# example would check nothing, so a budget (and each worker's share) is at least two.
MIN_EXAMPLES = 2
MAX_SEED = 2**63 - 1


def check_int(name: str, value: int | None, lo: int, hi: int) -> None:
    """An integer option in [lo, hi] (None: not given)."""
    if value is not None and not lo <= value <= hi:
        raise CliError(f"argument {name}: expected an integer in [{lo}, {hi}], got {value}")


def check_float(name: str, value: float | None, lo: float, hi: float, what: str = "a number"
                ) -> None:
    """A number option in (lo, hi]; refuses nan and inf."""
    if value is not None and not (math.isfinite(value) and lo < value <= hi):
        raise CliError(f"argument {name}: expected {what} in ({lo:g}, {hi:g}], got {value}")


def _writable_ancestor(option: str, path: Path) -> None:
    """The nearest existing folder above `path` must take a new file (probed for real:
    permission bits say nothing to root, or on a read-only mount)."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise CliError(f"argument {option}: cannot write {path} ({probe} is not a folder)")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".kvpocket-probe-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise CliError(f"argument {option}: cannot write {path} ({probe} is not a writable "
                       f"folder: {exc.strerror})") from None


def check_output(option: str, path: str | None) -> None:
    """Refuse an output file that cannot be written, before any work is done. Outputs are
    written atomically (a temporary file, then a rename), so only a regular file may be
    replaced: never a folder, a device such as /dev/full, or a link to one."""
    if path is None:
        return
    if not path.strip():
        raise CliError(f"argument {option}: expected a file path, got {path!r}")
    p = Path(path)
    if p.is_dir():
        raise CliError(f"argument {option}: {path} is a folder, expected a file path")
    if p.exists() and not p.is_file():
        raise CliError(f"argument {option}: {path} is not a regular file (outputs are written "
                       "to a temporary file and renamed over it)")
    _writable_ancestor(option, p.parent if str(p.parent) else Path("."))


def check_output_dir(option: str, path: str | None) -> None:
    """Refuse an output folder that is a file or cannot be created or written."""
    if path is None:
        return
    if not path.strip():
        raise CliError(f"argument {option}: expected a folder, got {path!r}")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise CliError(f"argument {option}: {path} exists and is not a folder")
    _writable_ancestor(option, p)


def check_outputs(files: Sequence[tuple[str, str | None]],
                  folders: Sequence[tuple[str, str | None]] = (),
                  inputs: Sequence[tuple[str, str | None]] = ()) -> None:
    """Every output path of a command, checked before the run: each one alone (as
    `check_output` / `check_output_dir`), then against all the others and against the
    command's input files: no two name the same path, by resolved path and by inode (a
    report written over a folder of traces, or over the configuration it was run with,
    would be lost at the end of the run), and no output folder is created where an
    output file goes (`--out W/x/..` creates W/x). A file inside an output folder is fine."""
    for option, path in files:
        check_output(option, path)
    for option, path in folders:
        check_output_dir(option, path)
    seen: dict[Path, str] = {}
    inodes: dict[tuple[int, int], str] = {}
    for option, path in inputs:
        if path is not None and Path(path).is_file():
            seen[Path(path).resolve()] = option
            inodes[_inode(Path(path))] = option
    for option, path in (*files, *folders):
        if path is None or path.startswith("redis://"):
            continue
        key = Path(path).resolve()
        other = seen.get(key) or (inodes.get(_inode(Path(path))) if Path(path).exists()
                                  else None)
        if other in dict(inputs):
            raise CliError(f"argument {option}: {path} is the input given to {other} (the "
                           "run would replace it with its output); give the output another "
                           "path")
        if other is not None:
            raise CliError(f"argument {option}: {path} is also the path given to {other}; "
                           "give each output its own path")
        seen[key] = option
    outputs = {Path(p).resolve(): o for o, p in files if p is not None}
    for option, path in folders:
        if path is None or path.startswith("redis://"):
            continue
        for made in _made_by_mkdir(Path(path)):
            if made in outputs:
                raise CliError(f"argument {option}: {path} would create the folder {made}, "
                               f"the path given to {outputs[made]}")


def _inode(p: Path) -> tuple[int, int]:
    st = p.stat()
    return st.st_dev, st.st_ino


def _made_by_mkdir(p: Path) -> list[Path]:
    """The folders `p.mkdir(parents=True)` would create, resolved (each missing prefix
    of the path as written: `W/x/..` creates W/x)."""
    out = []
    for i in range(1, len(p.parts) + 1):
        prefix = Path(*p.parts[:i])
        if not prefix.exists():
            out.append(prefix.resolve())
    return out


def use_hypothesis_home(folder: str | Path) -> Path:
    """Hypothesis keeps its own files in `.hypothesis/`; put them under `folder` (for this
    process and the worker processes it starts) instead of the current directory."""
    # Hypothesis (about a second to import) only when it runs: `kvpocket --help` imports this module
    from hypothesis.configuration import set_hypothesis_home_dir

    home = Path(folder) / ".hypothesis"
    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = str(home)
    set_hypothesis_home_dir(home)
    return home


def kvpocket_version() -> str:
    """The version pyproject.toml declares: read from it in a clone (so a source tree run
    through `.devpath` never reports another install's version), from the installed
    package's metadata otherwise."""
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
        if project.get("name") == "kvpocket":
            return str(project["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    try:
        return metadata.version("kvpocket")
    except metadata.PackageNotFoundError:
        return "unknown (neither a clone nor an installed package)"
