"""Seeded bugs as source patches, applied from outside the product code.

The implementation (`impl/`) carries no switches. A seeded bug (a mutant of
`verify/quality/seeded.py` or a bug of the zoo, `verify/quality/zoo.py`) is a list of
`SourceEdit`s, each replacing one exact piece of text in one function of `impl/`. To
switch bugs on, `patched(bugs)` reads each target function's source as it is in the
file, applies the edits to that copy (every `old` text must occur exactly once in it),
compiles the copy in the function's module namespace and puts it in place of the
original; on leaving the block the originals come back, whatever happened. A refactor
of `impl/` that moves an edit's text makes the edit fail loudly (`PatchError`), never
silently apply nothing.

The edited functions share a dictionary `bug_state` (a fresh one each time bugs are
switched on), for a bug that needs to remember something between two methods; a bug
keys its entries so that they cannot meet another bug's.

What is switched on is known here (`active()`), so that:

* a campaign's worker processes apply the same bugs (`install`, from the pool
  initializer of `verify/conformance/fuzz.py`);
* a reproducer records the names (the trace header's `seeded_bugs`), and replay refuses
  a trace whose bugs are not switched on (`missing_bugs`) instead of replaying it on the
  correct implementation.

Names are resolved to edits by the quality layer (`verify/quality/patches.py: BUGS`);
this module knows no names, so every layer of `verify/` may use it.
"""

from __future__ import annotations
import __future__

import importlib
import inspect
import textwrap
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import FunctionType
from typing import Any

TRACE_KEY = "seeded_bugs"  # the trace header field naming the bugs a reproducer needs


class PatchError(Exception):
    """A seeded bug's edit does not apply to the current source (or its target is not a
    plain function): the bug's definition must follow the code it patches."""


@dataclass(frozen=True)
class SourceEdit:
    """Replace `old` (which must occur exactly once, indentation included, in the target
    function's source as written in its file) by `new`.

    `target` is "module:Qualified.name", e.g. "kvpocket.impl.kvcache:KVCache._pop"."""

    target: str
    old: str
    new: str


@dataclass(frozen=True)
class SeededBug:
    """A named bug: the edits that make it, applied together. Picklable (it travels to
    spawned worker processes)."""

    name: str
    edits: tuple[SourceEdit, ...]


_ACTIVE: list[SeededBug] = []  # what is switched on now, in order
_ORIGINALS: dict[str, tuple[Any, str, Any]] = {}  # target -> (owner, attribute, original)


def active() -> tuple[SeededBug, ...]:
    """The bugs switched on in this process."""
    return tuple(_ACTIVE)


def active_names() -> list[str]:
    return [b.name for b in _ACTIVE]


def _resolve(target: str) -> tuple[Any, str, Any]:
    """(owner object, attribute name, current raw attribute value) of `target`."""
    module_name, sep, qualname = target.partition(":")
    if not sep or not qualname:
        raise PatchError(f"edit target {target!r}: expected 'module:Qualified.name'")
    owner: Any = importlib.import_module(module_name)
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    if attr not in vars(owner):
        raise PatchError(f"edit target {target!r}: {attr!r} is not defined there")
    return owner, attr, vars(owner)[attr]


def _compile(target: str, original: Any, edits: list[tuple[str, SourceEdit]],
             bug_state: dict[Any, Any]) -> FunctionType:
    if not isinstance(original, FunctionType) or original.__closure__:
        raise PatchError(f"{target}: only plain functions and methods (no closures, "
                         f"decorators or super()) can be edited, got {type(original).__name__}")
    lines, first = inspect.getsourcelines(original)
    src = "".join(lines)
    for bug, e in edits:
        found = src.count(e.old)
        if found != 1:
            raise PatchError(f"seeded bug {bug}: the text to replace occurs {found} times in "
                             f"{target} (expected once): {e.old.strip()!r}")
        src = src.replace(e.old, e.new)
    if src.lstrip().startswith("@"):
        raise PatchError(f"{target}: a decorated function cannot be edited")
    module = inspect.getmodule(original)
    if module is None:
        raise PatchError(f"{target}: its module is unknown")
    names = ", ".join(sorted({b for b, _ in edits}))
    flags = 0
    if getattr(module, "annotations", None) is __future__.annotations:
        flags = __future__.annotations.compiler_flag
    # Blank lines keep the line numbers of the file (tracebacks point near the edit).
    code = compile("\n" * (first - 1) + textwrap.dedent(src),
                   f"{inspect.getsourcefile(original)} (seeded bug {names})", "exec",
                   flags=flags, dont_inherit=True)
    namespace: dict[str, Any] = dict(vars(module))
    namespace["bug_state"] = bug_state
    exec(code, namespace)
    fn = namespace[original.__name__]
    if not isinstance(fn, FunctionType):
        raise PatchError(f"{target}: the edited source defines no function")
    fn.__qualname__ = original.__qualname__
    fn.__defaults__, fn.__kwdefaults__ = original.__defaults__, original.__kwdefaults__
    return fn


def _restore_all() -> None:
    for owner, attr, original in _ORIGINALS.values():
        setattr(owner, attr, original)
    _ORIGINALS.clear()


def _apply_all(bugs: Iterable[SeededBug]) -> None:
    """Restore every original, then put the edited functions of `bugs` in place."""
    _restore_all()
    by_target: dict[str, list[tuple[str, SourceEdit]]] = {}
    for bug in bugs:
        for e in bug.edits:
            by_target.setdefault(e.target, []).append((bug.name, e))
    state: dict[Any, Any] = {}
    try:
        for target, edits in by_target.items():
            owner, attr, original = _resolve(target)
            fn = _compile(target, original, edits, state)
            _ORIGINALS[target] = (owner, attr, original)
            setattr(owner, attr, fn)
    except BaseException:
        _restore_all()
        raise


@contextmanager
def patched(bugs: Iterable[SeededBug]) -> Iterator[None]:
    """Switch `bugs` on for the block (on top of any switched on already); the product
    code comes back when the block ends, however it ends."""
    saved = list(_ACTIVE)
    wanted = saved + [b for b in bugs if b not in saved]
    _apply_all(wanted)
    _ACTIVE[:] = wanted
    try:
        yield
    finally:
        _ACTIVE[:] = saved
        _apply_all(saved)


def install(bugs: Iterable[SeededBug]) -> None:
    """Switch `bugs` on for the rest of this process (a campaign's worker process, which
    the pool stops when the campaign ends)."""
    wanted = list(bugs)
    if wanted:
        _apply_all(wanted)
        _ACTIVE[:] = wanted


def trace_bugs(extra: Mapping[str, Any]) -> list[str]:
    """The seeded bugs a trace's header says it was recorded with."""
    names = extra.get(TRACE_KEY, [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"header field {TRACE_KEY!r}: expected a list of seeded-bug names, "
                         f"got {names!r}")
    return names


def missing_bugs(extra: Mapping[str, Any]) -> list[str]:
    """The bugs a trace was recorded with that are not switched on now."""
    on = set(active_names())
    return [n for n in trace_bugs(extra) if n not in on]


def edited_copy(edits: Iterable[SourceEdit], name: str = "planted") -> FunctionType:
    """The function the edits (all on one target) make, compiled in a copy of its module's
    namespace and put nowhere: a patched copy of a third-party engine's method, which a
    test installs on a subclass of one object's class (the engine's files and classes stay
    as installed)."""
    edits = list(edits)
    targets = {e.target for e in edits}
    if len(targets) != 1:
        raise PatchError(f"edited_copy: the edits name {len(targets)} targets, expected one")
    target = targets.pop()
    _, _, original = _resolve(target)
    return _compile(target, original, [(name, e) for e in edits], {})


def rebound(fn: FunctionType, **names: Any) -> FunctionType:
    """`fn`'s code over a copy of its module's globals with `names` replaced: a copy of
    an engine's function that calls patched copies (`edited_copy`) of the ones it names."""
    namespace = dict(fn.__globals__)
    namespace.update(names)
    out = FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    return out
