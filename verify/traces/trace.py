"""Trace files: one action per line, replayable by the model and the lockstep checker.

Line 1 is a header: {"kvpocket_trace": 1, "config": {...}, "source": "fuzz"|"bmc"|...,
"policy": ..., "backend": "numpy", "eager": false}. Every other line is one action:
{"action": NAME, "params": {...}, "layer": "api"|"page", "choices": [[kind, value], ...]}.
API-level actions are those of the API table (`model.api.API`, in the lockstep's form:
`adapter.alphabet()`); page-level ones are the model's page actions. Choices are the
model's (BMC counterexamples record them); fuzz traces leave them out, since the
implementation makes its own.
The last line is the end marker, {"kvpocket_end": N, "digest": "sha256:..."}: the number
of action lines and the SHA-256 of the header and action lines as written (each followed
by a newline). A file without it was cut short (or predates markers: `allow_unterminated`).
Malformed files raise `TraceError` naming the file and line.

Every line has a closed set of keys (an unknown or misspelled key is an error naming it
and the allowed ones), typed fields, and sizes checked against the header's configuration
before anything is built from them. A line is at most MAX_LINE_BYTES bytes (4 MiB); a
longer one is an error, found after reading that many bytes, never the whole line.

Event logs (`"kind": "events"` in the header) extend this format for integrators: the
same header and action lines, with the manager's own sequence ids, `commit` carrying
its `"tokens"`, choices as labels, and optional `"result"` and `"observed"` fields. They
are parsed by `parse_events`/`read_events` and checked by `tracecheck.py`; the format is
documented in docs/adapter-guide.md. They end with the same end marker (written by the
manager's `shutdown`). Files are read one line at a time (`open_events` streams an event
log in bounded memory).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TextIO, cast

from kvpocket.model import errors as model_errors
from kvpocket.model.api import API, CLASH_LABELS, Param
from kvpocket.model.choices import CLASH, RECORDED, REUSE, SLOT
from kvpocket.model.config import (
    ConfigError,
    JsonValueError,
    KVConfig,
    PocketPolicy,
    huge_int_message,
    strict_loads,
)
from kvpocket.model.executor import RecordedChooser
from kvpocket.model.machine import Model
from kvpocket.model.pages import PAGE_ACTIONS
from kvpocket.verify.traces.alphabet import api_form, check_params, trace_params
from kvpocket.verify.traces.schema import UNSET, EventDecoder
from kvpocket.verify.usage import CliError

TRACE_VERSION = 1
EVENTS_KIND = "events"  # header "kind" of an event log (see `parse_events`)
END_KEY = "kvpocket_end"  # the end marker: {"kvpocket_end": N, "digest": "sha256:..."}
MAX_ABS_INT = 2**63  # every integer in a trace or log is a signed 64-bit value
LONG_NUMBER = re.compile(r"\d{19}")  # 2**63 has 19 digits: a shorter number is in range
MAX_LINE_BYTES = 4 * 1024 * 1024  # one line of a trace or log, its newline included
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")  # the end marker's digest: lowercase hex
BACKENDS = ("numpy", "cupy")
UNTERMINATED_HINT = ("a file written before end markers existed can be read with "
                     "--allow-unterminated")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_INT_ONLY = frozenset({int})


def _all_ints(xs: list[Any]) -> bool:
    """Every element `_is_int` (a parsed row holds plain ints: their types are compared in
    one pass, element by element only when another type is there)."""
    return set(map(type, xs)) <= _INT_ONLY or all(_is_int(x) for x in xs)


class TraceError(ValueError):
    """A malformed trace: the message names the line and what is wrong."""


class EndDigest:
    """The end marker's running count and digest: SHA-256 over the header line and every
    action/event line, each as written (without its newline) followed by "\n"."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.count = -1  # the header is not counted

    def add(self, line: str) -> None:
        self._h.update(line.encode("utf-8") + b"\n")
        self.count += 1

    def add_raw(self, raw: bytes) -> None:
        """A line as read, its newline included (the same bytes `add` hashes)."""
        self._h.update(raw)
        self.count += 1

    @property
    def digest(self) -> str:
        return "sha256:" + self._h.hexdigest()

    def marker(self) -> str:
        """The end line for what was added so far."""
        return json.dumps({END_KEY: max(self.count, 0), "digest": self.digest})


def with_end_marker(lines: Iterable[str]) -> list[str]:
    """`lines` (a header and action/event lines, without newlines) and their end marker."""
    out = [ln for ln in lines if ln.strip()]
    d = EndDigest()
    for ln in out:
        d.add(ln)
    return [*out, d.marker()]


@dataclass
class TraceStep:
    action: str
    params: dict[str, Any]
    layer: str = "api"
    choices: list[tuple[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "params": self.params, "layer": self.layer,
                "choices": [list(c) for c in self.choices]}


@dataclass
class Trace:
    config: KVConfig
    steps: list[TraceStep]
    source: str = "fuzz"
    policy: str = ""  # informational; the config's pocket policy is what replays
    extra: dict[str, Any] = field(default_factory=dict)
    backend: str = "numpy"
    eager: bool = False  # the stream simulator runs work only when a step advances it

    def lines(self) -> Iterator[str]:
        """The header, one line per step, and the end marker."""
        header = {"kvpocket_trace": TRACE_VERSION, "config": self.config.to_json(),
                  "source": self.source, "policy": self.policy or self.config.pocket.policy.value,
                  "backend": self.backend, "eager": self.eager, **self.extra}
        digest = EndDigest()
        for line in (json.dumps(header), *(json.dumps(s.to_json()) for s in self.steps)):
            digest.add(line)
            yield line
        yield digest.marker()

    def write(self, path: Path) -> None:
        """Write the whole trace or nothing (a temporary file beside it, then a rename)."""
        write_atomic(path, "\n".join(self.lines()) + "\n")


class OutputError(CliError):
    """A report, trace or log that could not be written (a full disk, a bad path, a
    folder in the way): one line naming the file, exit status 2 (`CliError`). What was
    written elsewhere is kept; the file itself is left as it was."""

    def __init__(self, path: str | Path, exc: OSError) -> None:
        why = exc.strerror or type(exc).__name__
        super().__init__(f"cannot write {path} ({why})")
        self.path, self.errno = str(path), exc.errno


def write_atomic(path: str | Path, text: str) -> None:
    """Write a whole file or nothing: a temporary file in the same folder, then a rename,
    so a reader never sees half a file and an interrupted write leaves the old one. The
    one writer of every report, trace, reproducer and log kvpocket writes; a failure to
    write raises `OutputError`."""
    with atomic_output(path) as f:
        f.write(text)


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[TextIO]:
    """A text file to write `path` through: a temporary file in the same folder, renamed
    over `path` when the block ends normally, removed when it raises (Ctrl-C and SIGTERM
    included: `interrupts` turns SIGTERM into an exception). The new file gets the old
    one's permissions, or the usual ones (umask applied). An OSError while writing it
    (ENOSPC, a folder in the way, a path through a file) raises `OutputError` naming it."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OutputError(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield cast(TextIO, _Guarded(f, path))
            _io(path, f.flush)
            _io(path, lambda: os.fsync(f.fileno()))
        _io(path, lambda: os.chmod(tmp, _mode_for(path)))
        _io(path, lambda: os.replace(tmp, path))
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, OutputError):
            # the close in `with os.fdopen` flushes: a full disk shows there too
            raise OutputError(path, exc) from None
        raise


def _io(path: Path, op: Callable[[], object]) -> None:
    try:
        op()
    except OSError as exc:
        raise OutputError(path, exc) from None


class _Guarded:
    """The temporary file, with a failed write raised as `OutputError` naming `path`."""

    def __init__(self, f: TextIO, path: Path) -> None:
        self._f, self._path = f, path

    def write(self, text: str) -> int:
        try:
            return self._f.write(text)
        except OSError as exc:
            raise OutputError(self._path, exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def unused_path(path: Path) -> Path:
    """`path`, or `path` with -2, -3, ... before its suffix: what a campaign found is
    never overwritten by a later one."""
    n = 2
    candidate = path
    while candidate.exists():
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
        n += 1
    return candidate


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0o022)
        os.umask(umask)
        return 0o666 & ~umask


# ---- reading: lines, the header, the end marker ------------------------------------------

Row = tuple[int, str, bool]  # (line number, text without its newline, ended by a newline)
RawRow = tuple[int, bytes]  # (line number, the line's bytes as read, its newline included)


def line_too_long(where: str, what: str) -> TraceError:
    return TraceError(f"{where}: a line of the {what} is longer than {MAX_LINE_BYTES} bytes "
                      "(the most a line may hold)")


def _memory_rows(lines: Iterable[str], name: str, what: str) -> Iterator[RawRow]:
    for i, ln in enumerate(lines):
        if len(ln) > MAX_LINE_BYTES:
            raise line_too_long(f"{name}:{i + 1}", what)
        yield i + 1, ln.rstrip("\r\n").encode("utf-8", "surrogatepass") + b"\n"


def _file_rows(path: Path, what: str) -> Iterator[RawRow]:
    """The file's lines, read one at a time (bounded memory for any length of log)."""
    try:
        f = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    yield from stream_rows(f, str(path), what)


def stream_rows(f: BinaryIO, name: str, what: str) -> Iterator[RawRow]:
    """The lines of an open binary file, read one at a time, closing it at the end."""
    with f:
        lineno = 0
        readline = f.readline
        try:
            # readline with a limit: a line without an end (/dev/zero) costs at most
            # MAX_LINE_BYTES of memory before it is refused
            for lineno, raw in enumerate(iter(lambda: readline(MAX_LINE_BYTES + 1), b""), 1):
                if len(raw) > MAX_LINE_BYTES:
                    raise line_too_long(f"{name}:{lineno}", what)
                yield lineno, raw
        except OSError as exc:
            raise TraceError(f"{name}:{lineno + 1}: cannot read the {what} ({exc.strerror})"
                             ) from None


def _text_row(name: str, what: str, lineno: int, raw: bytes) -> Row:
    """A line's text, without its newline: UTF-8, ended by LF alone."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"{name}:{lineno}: the {what} is not UTF-8 text") from None
    if text.endswith("\r\n"):  # the digest is over the bytes as written
        raise TraceError(f"{name}:{lineno}: the line ends with CR LF (\\r\\n); "
                         f"the lines of {_a(what)} end with LF (\\n) alone "
                         "(convert it with dos2unix, or write it with "
                         "newline='\\n')")
    return lineno, text.rstrip("\r\n"), text.endswith("\n")


class _Framing:
    """Reads a trace or log: the header, then each body line, checking the end marker.

    A missing end marker (a file cut at a line boundary, or written before markers
    existed) is reported as truncation naming the last line read, unless
    `allow_unterminated`. A marker whose count or digest disagrees with the lines above it,
    or any line after it, is an error too."""

    def __init__(self, rows: Iterator[RawRow], name: str, what: str,
                 allow_unterminated: bool, line_keys: tuple[str, ...]) -> None:
        self.rows, self.name, self.what = rows, name, what
        self.line_keys = line_keys
        self.allow_unterminated = allow_unterminated
        self.digest = EndDigest()
        self.last_line = 0
        self.terminated = False
        self.header_line = 1

    def _nonblank(self) -> Iterator[Row]:
        for lineno, raw in self.rows:
            row = _text_row(self.name, self.what, lineno, raw)
            if row[1].strip():
                yield row

    def header(self, check_kind: Callable[[dict[str, Any], str], None],
               fields: dict[str, HeaderField]) -> tuple[dict[str, Any], KVConfig]:
        """The header line: the version, then its kind (`check_kind`, so a file of the
        other kind is named as such), then every field against `fields` (a closed set,
        each typed), then the configuration."""
        self._it = self._nonblank()
        first = next(self._it, None)
        if first is None:
            raise TraceError(f"{self.name}: the {self.what} is empty (expected a header line)")
        lineno, text, complete = first
        self.header_line = self.last_line = lineno
        header = self._parse(lineno, text, complete, strict=True)
        version = header.get("kvpocket_trace") if isinstance(header, dict) else None
        if version is not None and not (_is_int(version) and version == TRACE_VERSION):
            raise TraceError(f"{self.name}:{lineno}: a kvpocket {self.what} of format version "
                             f"{json.dumps(header['kvpocket_trace'])[:40]}; this kvpocket reads "
                             f"version {TRACE_VERSION} only (\"kvpocket_trace\": {TRACE_VERSION})")
        if not isinstance(header, dict) or "kvpocket_trace" not in header:
            raise TraceError(f"{self.name}:{lineno}: not a kvpocket trace header (expected "
                             f"{{\"kvpocket_trace\": {TRACE_VERSION}, \"config\": ...}})")
        where = f"{self.name}:{lineno}"
        check_kind(header, where)
        _check_header_fields(header, fields, where, self.what)
        cfg = _header_config(header, where)
        _check_ints(header, where)  # a seed of 10**30 is no seed
        self.digest.add(text)
        return header, cfg

    def body(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(line number, object) for each action/event line; checks the end at the end."""
        for lineno, text, complete in self._it:
            obj = self.line(lineno, text, complete)
            if obj is not None:
                yield lineno, obj
        self.finish()

    def line(self, lineno: int, text: str, complete: bool) -> dict[str, Any] | None:
        """One nonblank body line: its object, or None for the end marker (checked)."""
        obj = self._parse(lineno, text, complete)
        if self.terminated:
            raise TraceError(f"{self.name}:{lineno}: a line after the end marker "
                             f"(line {self.last_line})")
        self.last_line = lineno
        if isinstance(obj, dict) and END_KEY in obj:
            if not complete:
                raise TraceError(f"{self.name}:{lineno}: the end marker has no final "
                                 "newline (every line, the last included, ends with \\n): "
                                 f"the {self.what} is truncated or was not closed")
            self._check_end(lineno, obj)
            self.terminated = True
            return None
        if isinstance(obj, dict) and "kvpocket_trace" in obj:
            raise TraceError(f"{self.name}:{lineno}: a second header (the header is "
                             f"line {self.header_line})")
        if not isinstance(obj, dict):
            raise TraceError(f"{self.name}:{lineno}: expected a JSON object, got "
                             f"{type(obj).__name__}")
        for key in ("action", "params"):
            if key not in obj:
                raise TraceError(f"{self.name}:{lineno}: missing field '{key}'")
        unknown = sorted(set(obj) - set(self.line_keys))
        if unknown:
            raise TraceError(f"{self.name}:{lineno}: unknown field "
                             f"{', '.join(map(repr, unknown))}; a line of the {self.what} "
                             f"has {', '.join(self.line_keys)}")
        if LONG_NUMBER.search(text):  # 19+ digits: maybe beyond 64 bits, look closer
            _check_ints(obj, f"{self.name}:{lineno}")
        self.digest.add(text)
        return obj

    def accepted(self, lineno: int, raw: bytes) -> None:
        """A body line a fast reading took (complete, before any end marker): counted and
        added to the digest as `line` does."""
        self.last_line = lineno
        self.digest.add_raw(raw)

    def finish(self) -> None:
        """At the end of the rows: the end marker must have been read."""
        if not self.terminated and not self.allow_unterminated:
            raise TraceError(
                f"{self.name}:{self.last_line}: the {self.what} is truncated: no end marker "
                f"after line {self.last_line}, the last line read ({_count(self.digest.count, self.what)}"
                " read); "
                + UNTERMINATED_HINT)

    def _check_end(self, lineno: int, obj: dict[str, Any]) -> None:
        where = f"{self.name}:{lineno}"
        n, digest = obj.get(END_KEY), obj.get("digest")
        if not _is_int(n) or not isinstance(digest, str) or set(obj) != {END_KEY, "digest"}:
            raise TraceError(f"{where}: a malformed end marker (expected "
                             f"{{\"{END_KEY}\": N, \"digest\": \"sha256:...\"}})")
        if not DIGEST.fullmatch(digest):
            raise TraceError(f"{where}: a malformed digest in the end marker: expected "
                             f"\"sha256:\" and 64 lowercase hex digits, got {digest[:80]!r}")
        if n != self.digest.count:
            raise TraceError(f"{where}: the end marker counts {n} lines, the {self.what} "
                             f"holds {self.digest.count}: lines are missing or were added")
        if digest != self.digest.digest:
            raise TraceError(f"{where}: the end marker's digest does not match the lines "
                             f"above it: the {self.what} was altered")

    def _parse(self, lineno: int, text: str, complete: bool, strict: bool = False) -> Any:
        """A line's JSON; `strict` (the header): no key twice, no integer beyond 64 bits."""
        try:
            return strict_loads(text) if strict else json.loads(text)
        except json.JSONDecodeError as exc:
            if not complete:  # a writer that died mid-line leaves a truncated last line
                raise TraceError(f"{self.name}:{lineno}: the {self.what} is truncated (last "
                                 "line is incomplete)") from None
            raise TraceError(f"{self.name}:{lineno}: invalid JSON: {exc.msg} (column "
                             f"{exc.colno})") from None
        except RecursionError:
            raise TraceError(f"{self.name}:{lineno}: invalid JSON: nested too deeply"
                             ) from None
        except JsonValueError as exc:
            raise TraceError(f"{self.name}:{lineno}: {exc}") from None
        except ValueError:  # Python's int-string limit: an integer of thousands of digits
            raise TraceError(f"{self.name}:{lineno}: {huge_int_message(text)}") from None


def _count(n: int, what: str) -> str:
    noun = "event" if what == "event log" else "step"
    return f"{max(n, 0)} {noun}{'' if n == 1 else 's'}"


def _check_ints(obj: Any, where: str, depth: int = 0) -> None:
    """Every integer fits a signed 64-bit value (2**70 is no slot, sequence or length)."""
    if _is_int(obj):
        if not -MAX_ABS_INT <= obj < MAX_ABS_INT:
            raise TraceError(f"{where}: the integer {obj} is out of range (a signed 64-bit "
                             "value is expected)")
    elif isinstance(obj, dict):
        for v in obj.values():
            _check_ints(v, where, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            _check_ints(v, where, depth + 1)


def _header_config(header: dict[str, Any], where: str) -> KVConfig:
    raw = header.get("config")
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: header field \"config\" must be a configuration object, "
                         f"got {raw!r}")
    missing = [k for k in CONFIG_KEYS if k not in raw]
    if missing:
        raise TraceError(f"{where}: header field \"config\" lacks {', '.join(missing)}")
    try:
        return KVConfig.from_json(raw)
    except ConfigError as exc:
        raise TraceError(f"{where}: header field \"config\": {exc}") from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise TraceError(f"{where}: header field \"config\": {exc}") from None


@dataclass(frozen=True)
class HeaderField:
    """A header field: a test of its value and the value expected, for the message."""

    ok: Callable[[object], bool]
    expected: str


def _any(v: object) -> bool:  # checked by the caller (the configuration, the kind)
    return True


def _is_str(v: object) -> bool:
    return isinstance(v, str)


_COMMON_HEADER = {
    "kvpocket_trace": HeaderField(_any, str(TRACE_VERSION)),
    "kind": HeaderField(_any, "a kind"),
    "config": HeaderField(_any, "a configuration object"),
    "source": HeaderField(_is_str, "a string"),
    # informational (the config's pocket says what runs), but never a name of no policy;
    # "off": a manager without a pocket (a real engine's log: verify/targets/vllm_eventlog.py)
    "policy": HeaderField(lambda v: v in {*(p.value for p in PocketPolicy), "off"},
                          "one of " + ", ".join(p.value for p in PocketPolicy) + " or off"),
}
TRACE_HEADER: dict[str, HeaderField] = {
    **_COMMON_HEADER,
    "backend": HeaderField(lambda v: v in BACKENDS, "numpy or cupy"),
    "eager": HeaderField(lambda v: isinstance(v, bool), "true or false"),
    # written by fuzz (seed, config_name), BMC (broken, layer), the regression traces
    "seed": HeaderField(_is_int, "an int"),
    "config_name": HeaderField(_is_str, "a string"),
    "broken": HeaderField(lambda v: isinstance(v, list) and all(map(_is_str, v)),
                          "a list of invariant names"),
    "layer": HeaderField(lambda v: v in ("api", "page"), "\"api\" or \"page\""),
    "doc": HeaderField(_is_str, "a string"),
    "expect": HeaderField(_is_str, "a string"),
    # a reproducer's switches (their names are checked where they are switched on):
    # seeded implementation bugs, spec overrides, whether its example checked the
    # implementation's event log, and the simulator's modes it ran in
    "seeded_bugs": HeaderField(lambda v: isinstance(v, list) and all(map(_is_str, v)),
                               "a list of seeded bug names"),
    "model_overrides": HeaderField(lambda v: isinstance(v, dict), "an object of overrides"),
    "event_log": HeaderField(lambda v: isinstance(v, bool), "true or false"),
    "race_check": HeaderField(lambda v: isinstance(v, bool), "true or false"),
    "device_mirror": HeaderField(lambda v: isinstance(v, bool), "true or false"),
}
EVENT_HEADER: dict[str, HeaderField] = dict(_COMMON_HEADER)
TRACE_LINE_KEYS = ("action", "params", "layer", "choices")
EVENT_LINE_KEYS = (*TRACE_LINE_KEYS, "result", "observed")


def _a(noun: str) -> str:
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def _check_header_fields(header: dict[str, Any], fields: dict[str, HeaderField], where: str,
                         what: str) -> None:
    unknown = sorted(set(header) - set(fields))
    if unknown:
        raise TraceError(f"{where}: unknown header field {', '.join(map(repr, unknown))}; "
                         f"the header of {_a(what)} has {', '.join(fields)}")
    for key, value in header.items():
        f = fields[key]
        if not f.ok(value):
            raise TraceError(f"{where}: header field \"{key}\": expected {f.expected}, "
                             f"got {json.dumps(value)[:80]}")


def _error_categories() -> tuple[str, ...]:
    """What an event's `{"error": ...}` may name: a usage-error category of the model (the
    five the model raises; running out of pages is `false`, not an error)."""
    cats = {c.category for c in vars(model_errors).values()
            if isinstance(c, type) and issubclass(c, model_errors.UsageError)
            and c is not model_errors.UsageError}
    return tuple(sorted(cats))


ERROR_CATEGORIES = _error_categories()


@functools.cache
def _decoder_for(table: tuple[tuple[str, tuple[Param, ...]], ...]) -> EventDecoder:
    return EventDecoder(dict(table), ERROR_CATEGORIES)


def event_decoder() -> EventDecoder:
    """The schema decoder of event lines for the API table as it is now (read at call
    time, as `api_form` is: a table changed by a test gets its own decoder)."""
    return _decoder_for(tuple(api_form().items()))
CONFIG_KEYS = ("tokens_per_block", "life_cycles", "slots_per_level", "num_sequences",
               "max_blocks", "pocket")


def parse_trace(lines: Iterable[str], name: str = "trace", allow_unterminated: bool = True
                ) -> Trace:
    """Parse a trace held in memory (a file: `read_trace`, which wants the end marker)."""
    return _parse_trace(_memory_rows(lines, name, "trace"), name, allow_unterminated)


def _trace_kind(header: dict[str, Any], where: str) -> None:
    kind = header.get("kind")
    if kind == EVENTS_KIND:
        raise TraceError(f"{where}: this is an event log; check it with `kvpocket trace check`")
    if kind is not None:
        raise TraceError(f"{where}: header field \"kind\": a trace has none (an event log "
                         f"has \"{EVENTS_KIND}\"), got {kind!r}")


def _parse_trace(rows: Iterator[RawRow], name: str, allow_unterminated: bool) -> Trace:
    frame = _Framing(rows, name, "trace", allow_unterminated, TRACE_LINE_KEYS)
    header, cfg = frame.header(_trace_kind, TRACE_HEADER)
    backend = header.get("backend", "numpy")
    bounds = _param_bounds(cfg)
    steps = []
    for lineno, obj in frame.body():
        layer = obj.get("layer", "api")
        params = obj["params"]
        if layer not in ("api", "page"):
            raise TraceError(f"{name}:{lineno}: layer must be \"api\" or \"page\", got {layer!r}")
        if not isinstance(params, dict):
            raise TraceError(f"{name}:{lineno}: \"params\" must be an object")
        if layer == "api":
            try:
                check_params(obj["action"], params)
            except ValueError as exc:
                raise TraceError(f"{name}:{lineno}: {exc}") from None
            seq = params.get("seq")
            if isinstance(seq, int) and not -1 <= seq <= cfg.num_sequences:
                raise TraceError(f"{name}:{lineno}: parameter 'seq' is {seq}; the header's "
                                 f"config has {cfg.num_sequences} sequences (a trace may name "
                                 f"-1 to {cfg.num_sequences} to test misuse)")
            _check_sizes(obj["action"], params, bounds, f"{name}:{lineno}")
        else:
            _check_page_step(obj["action"], params, cfg, f"{name}:{lineno}")
        choices = obj.get("choices", [])
        if not isinstance(choices, list) or not all(
                isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) and _is_int(c[1])
                for c in choices):
            raise TraceError(f"{name}:{lineno}: \"choices\" must be a list of [kind, value] "
                             "pairs, each value an int")
        steps.append(TraceStep(obj["action"], params, layer, [(c[0], c[1]) for c in choices]))
    known = {"kvpocket_trace", "config", "source", "policy", "backend", "eager"}
    return Trace(cfg, steps, str(header.get("source", "unknown")), str(header.get("policy", "")),
                 {k: v for k, v in header.items() if k not in known},
                 str(backend), header.get("eager", False) is True)


def _param_bounds(cfg: KVConfig) -> dict[str, tuple[int, int]]:
    """The values a trace may give each parameter kind: the legal ones, and one out of
    range on each side (-1, one past the end) that the lockstep uses to test misuse. A
    size beyond these (commit n = 2**62) is refused before anything is built from it."""
    return {"length": (-1, cfg.max_capacity + 1),
            "count": (-1, max(MAX_COMMIT_COUNT, cfg.max_capacity + 1)),
            "level": (-1, cfg.num_levels), "pool_group": (-1, cfg.num_pool_groups),
            "slots": (-1, max(cfg.slots_per_level) + 1), "stream": (-1, cfg.num_sequences + 1)}


MAX_COMMIT_COUNT = 10_000  # the lockstep's out-of-range commit count


def _check_sizes(action: str, params: dict[str, Any], bounds: dict[str, tuple[int, int]],
                 where: str) -> None:
    for p in trace_params(action):
        lo_hi = bounds.get(p.kind)
        v = params[p.name]
        if lo_hi is not None and _is_int(v) and not lo_hi[0] <= v <= lo_hi[1]:
            raise TraceError(f"{where}: parameter '{p.name}' of '{action}' is {v}; for the "
                             f"header's config a trace may give {lo_hi[0]} to {lo_hi[1]}")


def _check_page_step(action: object, params: dict[str, Any], cfg: KVConfig, where: str
                     ) -> None:
    """A page-layer step: a page action of the model, its parameters by name, each an
    int in the parameter's domain for the header's configuration."""
    if not isinstance(action, str) or action not in PAGE_ACTIONS:
        raise TraceError(f"{where}: unknown page action {action!r}; expected one of "
                         + ", ".join(PAGE_ACTIONS))
    want = {prm.name: prm for prm in PAGE_ACTIONS[action].params}
    if set(params) != set(want):
        raise TraceError(f"{where}: page action '{action}' takes parameters {sorted(want)}, "
                         f"got {sorted(params)}")
    for k, v in params.items():
        domain = want[k].domain(cfg)
        if not _is_int(v) or v not in domain:
            raise TraceError(f"{where}: parameter '{k}' of page action '{action}' must be an "
                             f"int in [{domain.start}, {domain.stop - 1}], got {v!r}")


def write_trace(path: str | Path, trace: Trace) -> Path:
    p = Path(path)
    trace.write(p)
    return p


def read_trace(path: str | Path, allow_unterminated: bool = False) -> Trace:
    """Read a trace file; it must end with its end marker unless `allow_unterminated`."""
    path = Path(path)
    return _parse_trace(_file_rows(path, "trace"), str(path), allow_unterminated)


def run_api_step(model: Model, step: TraceStep) -> RecordedChooser:
    """Run one API-level step on the model with the step's recorded choices scripted;
    returns the chooser, whose `left()` holds any recorded choice left unused."""
    script: dict[str, list[object]] = {}
    for kind, value in step.choices:
        script.setdefault(kind, []).append(int(value))
    chooser = RecordedChooser(script, by="candidate")
    model.chooser = chooser
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in step.params.items()}
    model.call(step.action, params)
    return chooser


def replay_on_model(trace: Trace) -> tuple[int, list[str]]:
    """Replay a trace on `Model`; (index of the first step after which an invariant is
    violated, their names), or (-1, []) when every step keeps every invariant.

    API steps are checked against all invariants, page steps against the step-scope ones.
    A recorded choice the model rejects raises `ChoiceRejected`; a page step whose guard
    is false raises `GuardViolation`.
    """
    model = Model(trace.config)
    for i, step in enumerate(trace.steps):
        if step.layer == "page":
            model.apply(step.action, **step.params)
            bad = model.violations("step")
        else:
            chooser = run_api_step(model, step)
            left = chooser.left()
            if left:
                raise TraceError(f"step {i} ({step.action}): recorded choices not used: {left}")
            bad = model.violations("api")
        if bad:
            return i, [inv.name for inv in bad]
    return -1, []


# ---- event logs --------------------------------------------------------------------------

CHOICE_KINDS = RECORDED  # `model/choices.py`: the kinds a manager makes and records
OBSERVED_KEYS = ("free", "status", "index", "pocket")
OBSERVED_STATUSES = ("SUSPENDED", "ACTIVE", "CLOSED")  # a created sequence's statuses


def event_params() -> dict[str, tuple[str, ...]]:
    """Each action's parameters in an event log: the API table's own."""
    return {name: a.param_names for name, a in API.items()}


NO_RESULT = object()  # an event that does not report its result


@dataclass(slots=True)
class Event:
    """One API call of an integrator's manager, as its event log recorded it."""

    line: int
    action: str
    params: dict[str, Any]
    choices: list[tuple[str, Any]] | None = None  # None: not recorded (the model picks)
    result: Any = NO_RESULT  # True/False/None, or {"error": category}
    observed: dict[str, Any] | None = None

    def describe(self) -> str:
        return self.describe_call(self.action, self.params)

    @staticmethod
    def describe_call(action: str, params: dict[str, Any]) -> str:
        """`describe` of an event with this action and these parameters."""
        shown = ", ".join(f"{k}={v}" for k, v in params.items())
        return f"{action}({shown})"


@dataclass
class ParsedEventLog:
    config: KVConfig
    events: list[Event]
    source: str = "unknown"
    policy: str = ""
    header_line: int = 1


def parse_events(lines: Iterable[str], name: str = "event log",
                 allow_unterminated: bool = True) -> ParsedEventLog:
    """Parse an event log held in memory; `TraceError` names the line of the first
    malformed event. (A file: `read_events`, or `open_events` to stream it.)"""
    stream = EventStream(_memory_rows(lines, name, "event log"), name, allow_unterminated)
    return ParsedEventLog(stream.config, list(stream), stream.source, stream.policy,
                          stream.header_line)


def read_events(path: str | Path, allow_unterminated: bool = False) -> ParsedEventLog:
    """Read a whole event log file (it must end with its end marker unless
    `allow_unterminated`); a long log is better streamed with `open_events`."""
    return ParsedEventLog(**_fields(open_events(path, allow_unterminated)))


def _fields(stream: EventStream) -> dict[str, Any]:
    events = list(stream)
    return {"config": stream.config, "events": events, "source": stream.source,
            "policy": stream.policy, "header_line": stream.header_line}


def open_events(path: str | Path, allow_unterminated: bool = False) -> EventStream:
    """An event log file read one line at a time: the header now, each event as iterated
    (memory stays bounded whatever the file's length)."""
    path = Path(path)
    return EventStream(_file_rows(path, "event log"), str(path), allow_unterminated)


def _event_kind(header: dict[str, Any], where: str) -> None:
    kind = header.get("kind")
    if kind != EVENTS_KIND:
        got = "none" if kind is None else repr(kind)
        hint = " (a lockstep trace: replay it with `kvpocket replay`)" if kind is None else ""
        raise TraceError(f"{where}: header field \"kind\": expected \"{EVENTS_KIND}\", "
                         f"got {got}{hint}")


class EventStream:
    """The header of an event log, and its events one at a time (`for ev in stream`).
    Iterating to the end checks the end marker; `line` is the last line read."""

    def __init__(self, rows: Iterator[RawRow], name: str, allow_unterminated: bool) -> None:
        self.name = name
        self._frame = _Framing(rows, name, "event log", allow_unterminated, EVENT_LINE_KEYS)
        header, self.config = self._frame.header(_event_kind, EVENT_HEADER)
        self.header_line = self._frame.header_line
        self.source = str(header.get("source", "unknown"))
        self.policy = str(header.get("policy", ""))

    @property
    def line(self) -> int:
        return self._frame.last_line

    @property
    def events_read(self) -> int:
        """Event lines read so far (the end marker's count)."""
        return max(self._frame.digest.count, 0)

    @property
    def terminated(self) -> bool:
        """The end marker was read (a followed log ends there)."""
        return self._frame.terminated

    def __iter__(self) -> Iterator[Event]:
        """Each line is read by the schema (`schema.py`) first; a line it refuses, and the
        end marker, are read by the reference reading (`_Framing.line`, `_event`), which
        names what is wrong, or takes a line the schema was stricter about."""
        known = api_form()
        frame, name = self._frame, self.name
        decode = event_decoder().decode
        for lineno, raw in frame.rows:
            if not frame.terminated and raw[-1:] == b"\n" and raw[-2:-1] != b"\r":
                got = decode(raw)
                if got is not None:
                    frame.accepted(lineno, raw)
                    result = got[3]
                    yield Event(lineno, got[0], got[1], got[2],
                                NO_RESULT if result is UNSET else result, got[4])
                    continue
            row = _text_row(name, frame.what, lineno, raw)
            if not row[1].strip():
                continue
            obj = frame.line(*row)
            if obj is not None:
                yield _event(lineno, obj, name, known)
        frame.finish()


def schema_event(lineno: int, raw: bytes) -> Event | None:
    """An event line as the schema reads it (`schema.py`), or None where it refuses it."""
    got = event_decoder().decode(raw)
    if got is None:
        return None
    return Event(lineno, got[0], got[1], got[2], NO_RESULT if got[3] is UNSET else got[3],
                 got[4])


def reference_event(lineno: int, text: str, name: str = "event log") -> Event:
    """An event line as the reference reading takes it (the rule the schema is checked
    against: `tests/traces/test_event_schema.py`); `TraceError` names what is wrong."""
    frame = _Framing(iter(()), name, "event log", True, EVENT_LINE_KEYS)
    obj = frame.line(lineno, text, True)
    if obj is None:
        raise TraceError(f"{name}:{lineno}: an end marker, not an event")
    return _event(lineno, obj, name, api_form())


def _event(lineno: int, obj: dict[str, Any], name: str,
           known: dict[str, tuple[Param, ...]]) -> Event:
    where = f"{name}:{lineno}"
    action, params = obj["action"], obj["params"]
    if obj.get("layer", "api") != "api":
        raise TraceError(f"{where}: event logs hold API events only (layer \"api\")")
    if not isinstance(params, dict):
        raise TraceError(f"{where}: \"params\" must be an object")
    try:
        check_params(action, params, known, events=True)
    except ValueError as exc:
        raise TraceError(f"{where}: {exc}") from None
    seq = params.get("seq")
    if isinstance(seq, int) and seq < 0:
        raise TraceError(f"{where}: parameter 'seq' must be a sequence id >= 0, got {seq}")
    ev = Event(lineno, action, params)
    if "choices" in obj:
        ev.choices = _choices(obj["choices"], where)
    if "result" in obj:
        r = obj["result"]
        ok = r is None or isinstance(r, bool) or (
            isinstance(r, dict) and set(r) == {"error"} and isinstance(r["error"], str))
        if not ok:
            raise TraceError(f"{where}: \"result\" must be true, false, null or "
                             f"{{\"error\": CATEGORY}}, got {r!r}")
        if isinstance(r, dict) and r["error"] not in ERROR_CATEGORIES:
            raise TraceError(f"{where}: \"result\": unknown error category {r['error']!r}; "
                             "expected one of " + ", ".join(ERROR_CATEGORIES))
        ev.result = r
    if "observed" in obj:
        ev.observed = _observed(obj["observed"], where)
    return ev


def _is_location(v: object) -> bool:
    return isinstance(v, list) and len(v) == 3 and _all_ints(v)


def _choices(raw: object, where: str) -> list[tuple[str, Any]]:
    if not isinstance(raw, list):
        raise TraceError(f"{where}: \"choices\" must be a list of [kind, label] pairs")
    out: list[tuple[str, Any]] = []
    for c in raw:
        if not (isinstance(c, list) and len(c) == 2 and c[0] in CHOICE_KINDS):
            raise TraceError(f"{where}: bad choice {c!r}: expected [kind, label] with kind one "
                             f"of {', '.join(CHOICE_KINDS)}")
        kind, label = c
        if kind in (SLOT, REUSE) and not _is_int(label):
            what = "a slot id" if kind == "slot" else "a token count"
            raise TraceError(f"{where}: a {kind} choice's label is {what}, got {label!r}")
        if kind == CLASH:
            if label not in CLASH_LABELS:
                raise TraceError(f"{where}: a clash choice's label is one of "
                                 f"{', '.join(map(json.dumps, CLASH_LABELS))}, got {label!r}")
            out.append((kind, label))
            continue
        if kind not in (SLOT, REUSE) and not _is_location(label):
            raise TraceError(f"{where}: a {kind} choice's label is [level, pool_group, slot], "
                             f"got {label!r}")
        out.append((kind, label if kind in (SLOT, REUSE) else tuple(label)))
    return out


def _observed(raw: object, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: \"observed\" must be an object")
    unknown = sorted(set(raw) - set(OBSERVED_KEYS))
    if unknown:
        raise TraceError(f"{where}: unknown observed field(s) {unknown}; expected "
                         + ", ".join(OBSERVED_KEYS))
    free = raw.get("free", [])
    if not isinstance(free, list) or not all(_is_location(x) for x in free):
        raise TraceError(f"{where}: observed \"free\" must be a list of "
                         "[level, pool_group, free_slots]")
    if "status" in raw and raw["status"] not in OBSERVED_STATUSES:
        raise TraceError(f"{where}: observed \"status\" must be one of "
                         f"{', '.join(OBSERVED_STATUSES)}, got {json.dumps(raw['status'])[:80]}")
    index = raw.get("index", [])
    if not isinstance(index, list) or not all(
            isinstance(r, list) and _all_ints(r) for r in index):
        raise TraceError(f"{where}: observed \"index\" must be a list (per life cycle) of "
                         "lists of ints")
    pocket = raw.get("pocket", [])
    if not isinstance(pocket, list) or not all(
            isinstance(r, list) and all(_is_location(x) for x in r) for r in pocket):
        raise TraceError(f"{where}: observed \"pocket\" must be a list (per life cycle) of "
                         "[level, pool_group, slot] lists")
    return dict(raw)
