"""Every bad input a user can give the CLI is answered with one line and exit status 2:
the message names the option or the file, line and field; no traceback; no file written,
replaced or left half-written (the folder the case runs in is compared byte for byte).

The table covers every subcommand and option kind, and every kind of broken input file
(traces and event logs). Cases that would need minutes of work when the check is
missing fail fast instead: every output path is checked before the run."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvpocket.model import config
from kvpocket.verify.cli.commands import main
from kvpocket.verify.presets import preset
from kvpocket.verify.traces.record import record
from kvpocket.verify.traces.trace import with_end_marker

REGRESSIONS = Path(__file__).parents[2] / "verify" / "regressions"
TRACE = REGRESSIONS / "migration-during-park-revalidate.jsonl"
ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0


# ---- the input files ------------------------------------------------------------------


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _body(path: Path) -> list[str]:
    """Header and action/event lines, without the end marker."""
    return [ln for ln in _lines(path) if '"kvpocket_end"' not in ln]


def _terminated(lines: list[str]) -> str:
    return "\n".join(with_end_marker(lines)) + "\n"


def _event_header(**over: object) -> str:
    h: dict[str, object] = {"kvpocket_trace": 1, "kind": "events",
                            "config": preset("tiny").to_json(), **over}
    return json.dumps(h)


def _trace_header(**over: object) -> str:
    h: dict[str, object] = {"kvpocket_trace": 1, "config": preset("tiny").to_json(), **over}
    return json.dumps(h)


CREATE = '{"action": "create", "params": {"seq": 3, "prompt": []}}'


def make_files(d: Path) -> None:
    """Every broken input file, beside a valid trace and event log."""
    (d / "cwd").mkdir()
    (d / "folder").mkdir()
    (d / "afile").write_text("a file, not a folder\n")
    (d / "existing.json").write_text('{"kept": true}\n')
    log = d / "valid.ndjson"
    record(preset("tiny"), 40, 0, log)
    body = _body(log)
    trace_body = _body(TRACE)
    files: dict[str, str | bytes] = {
        "empty.ndjson": "",
        "blank.ndjson": "\n\n  \n",
        "binary.ndjson": bytes(range(256)) * 4,
        "array.ndjson": "[1, 2, 3]\n",
        "non-utf8.ndjson": body[0].encode() + b'\n{"action": "cl\xffose", "params": {}}\n',
        "cut-mid-line.ndjson": log.read_text()[:-40],
        "cut-at-line.ndjson": "\n".join(body[:-3]) + "\n",
        "no-marker-old.ndjson": "\n".join(body) + "\n",
        "marker-count.ndjson": "\n".join([*body[:-1], with_end_marker(body)[-1]]) + "\n",
        # the same events, one line re-spaced: only the digest can tell
        "marker-digest.ndjson": "\n".join([*body[:-1], json.dumps(json.loads(body[-1])),
                                           with_end_marker(body)[-1]]) + "\n",
        "after-marker.ndjson": log.read_text() + body[-1] + "\n",
        "missing-keys.ndjson": _terminated([body[0], '{"action": "resume"}']),
        "wrong-types.ndjson": _terminated([body[0], '{"action": "resume", "params": '
                                                    '{"seq": "seven"}}']),
        "huge-int.ndjson": _terminated([body[0], '{"action": "resume", "params": {"seq": '
                                        f"{2**70}}}}}"]),
        "negative-id.ndjson": _terminated([_event_header(), '{"action": "resume", '
                                           '"params": {"seq": -4}}']),
        "dup-header.ndjson": _terminated([body[0], body[0], *body[1:4]]),
        "no-header.ndjson": _terminated(body[1:5]),
        "deep.ndjson": _terminated([_event_header(), '{"action": "resume", "params": '
                                    + "[" * 100_000 + "]" * 100_000 + "}"]),
        "kind-bogus.ndjson": _terminated([_event_header(kind="eventz"), CREATE]),
        "kind-missing.ndjson": _terminated([_trace_header(), CREATE]),
        "config-empty.ndjson": _terminated([_event_header(config={}), CREATE]),
        "config-not-object.ndjson": _terminated([_event_header(config=[1]), CREATE]),
        "error-bogus.ndjson": _terminated([_event_header(), '{"action": "resume", "params": '
                                           '{"seq": 3}, "result": {"error": "bogus"}}']),
        "too-many-seqs.ndjson": _terminated([_event_header(), *(
            f'{{"action": "create", "params": {{"seq": {i}, "prompt": []}}}}'
            for i in range(5))]),
        # lockstep traces
        "trace-valid.jsonl": TRACE.read_text(),
        "trace-no-marker.jsonl": "\n".join(trace_body) + "\n",
        "trace-cut.jsonl": "\n".join(trace_body[:-2]) + "\n",
        "trace-seq-beyond.jsonl": _terminated([_trace_header(), '{"action": "create", '
                                               '"params": {"seq": 5, "prompt": []}}']),
        "trace-seq-negative.jsonl": _terminated([_trace_header(), '{"action": "create", '
                                                 '"params": {"seq": -7, "prompt": []}}']),
        "trace-backend-tpu.jsonl": _terminated([_trace_header(backend="tpu"), CREATE]),
        "trace-kind-events.jsonl": _terminated([_event_header(), CREATE]),
        "trace-kind-bogus.jsonl": _terminated([_trace_header(kind="x"), CREATE]),
        "trace-huge.jsonl": _terminated([_trace_header(), '{"action": "resize", "params": '
                                         f'{{"seq": 0, "capacity": {2**70}, "history": 0}}}}']),
        "trace-deep.jsonl": _terminated([_trace_header(), '{"action": "resume", "params": '
                                         + "[" * 100_000 + "]" * 100_000 + "}"]),
        "trace-page-action.jsonl": _terminated([_trace_header(), '{"action": "fly", '
                                                '"params": {}, "layer": "page"}']),
        "trace-page-params.jsonl": _terminated([_trace_header(), '{"action": "release", '
                                                '"params": {"slot": 1}, "layer": "page"}']),
        "trace-page-domain.jsonl": _terminated([_trace_header(), '{"action": "release", '
                                                '"params": {"page": 999}, "layer": "page"}']),
        "trace-choice.jsonl": _terminated([_trace_header(), '{"action": "create", "params": '
                                           '{"seq": 0, "prompt": []}, "choices": '
                                           '[["slot", [1, 2]]]}']),
        "trace-config-empty.jsonl": _terminated([_trace_header(config={}), CREATE]),
        "trace-layer.jsonl": _terminated([_trace_header(), '{"action": "create", "params": '
                                          '{"seq": 0, "prompt": []}, "layer": "gpu"}']),
        "trace-bug-unknown.jsonl": _terminated([_trace_header(seeded_bugs=["no-such-bug"]),
                                                CREATE.replace('"seq": 3', '"seq": 0')]),
        "trace-bug-type.jsonl": _terminated([_trace_header(seeded_bugs="pop-no-revalidate"),
                                             CREATE.replace('"seq": 3', '"seq": 0')]),
        "trace-overrides-bad.jsonl": _terminated([_trace_header(
            model_overrides={"page is uncommitted": ["sometimes", 1]}),
            CREATE.replace('"seq": 3', '"seq": 0')]),
    }
    # hardening II: closed key sets, typed header fields, sizes, line length, markers
    first_event = json.loads(body[1])
    misspelled = {"Choices": first_event.get("choices", []), "reslt": True,
                  "observd": {"status": "ACTIVE"}}
    for key, value in misspelled.items():
        files[f"key-{key}.ndjson"] = _terminated([body[0], json.dumps(
            {"action": first_event["action"], "params": first_event["params"], key: value})])
    files["key-step.ndjson"] = _terminated([body[0], json.dumps({**first_event, "step": 1})])
    files["header-key.ndjson"] = _terminated([_event_header(engine="mine"), CREATE])
    files["header-source-int.ndjson"] = _terminated([_event_header(source=7), CREATE])
    files["status-running.ndjson"] = _terminated([_event_header(), CREATE[:-1]
                                                  + ', "observed": {"status": "RUNNING"}}'])
    upper = with_end_marker(body)
    digest = json.loads(upper[-1])
    upper[-1] = json.dumps({**digest, "digest": digest["digest"].upper().replace("SHA256",
                                                                                 "sha256")})
    files["digest-upper.ndjson"] = "\n".join(upper) + "\n"
    files["marker-no-newline.ndjson"] = log.read_text().rstrip("\n")
    files["long-line.ndjson"] = body[0] + "\n" + " " * (4 * 1024 * 1024 + 10) + "\n"
    files["trace-key.jsonl"] = _terminated([_trace_header(), CREATE[:-1] + ', "step": 1}'])
    files["trace-header-key.jsonl"] = _terminated([_trace_header(engine="x"), CREATE])
    files["trace-eager-string.jsonl"] = _terminated([_trace_header(eager="false"), CREATE])
    files["trace-commit-huge.jsonl"] = _terminated([
        _trace_header(), '{"action": "create", "params": {"seq": 0, "prompt": []}}',
        f'{{"action": "commit", "params": {{"seq": 0, "n": {2**62}}}}}'])
    files["trace-resize-huge.jsonl"] = _terminated([_trace_header(), '{"action": "resize", '
                                                    f'"params": {{"seq": 0, "capacity": {2**40}'
                                                    ', "history": 0}}'])
    files["trace-long-line.jsonl"] = _trace_header() + "\n" + "[" * (4 * 1024 * 1024 + 1)
    # hardening III: sizes bounded where they are read, values and fields stated once
    files.update(_hardening_iii_files(body))
    for name, content in files.items():
        if isinstance(content, bytes):
            (d / name).write_bytes(content)
        else:
            (d / name).write_text(content)


def _config(**over: object) -> dict[str, object]:
    """The tiny preset's complete configuration with fields replaced ("window" and
    "sink_tokens" go to its life cycle, "pocket" replaces the pocket)."""
    cfg = preset("tiny").to_json()
    for key, value in over.items():
        if key in ("window", "sink_tokens"):
            cfg["life_cycles"][0][key] = value
        else:
            cfg[key] = value
    return cfg


DIGITS = "9" * 5000  # beyond Python's int-string limit (4,300 digits)


def _hardening_iii_files(body: list[str]) -> dict[str, str]:
    cfg_text = json.dumps(_config())
    no_enabled = _config(pocket={"capacity": 2, "policy": "unsafe", "evict_parked": "drop"})
    out = {
        "cfg-window-1e30.json": json.dumps(_config(window=10**30)),
        "cfg-window-2e63.json": json.dumps(_config(window=2**63)),
        "cfg-sinks-1e20.json": json.dumps(_config(sink_tokens=10**20)),
        "cfg-slots-3x2e24.json": json.dumps(_config(slots_per_level=[2**24] * 3, max_pages=0)),
        "cfg-t4096.json": json.dumps(_config(tokens_per_block=4096)),
        "cfg-seqs-2e20.json": json.dumps(_config(num_sequences=2**20, max_pages=0)),
        "cfg-digits.json": cfg_text.replace('"max_blocks": 16', f'"max_blocks": {DIGITS}'),
        "cfg-dup-key.json": cfg_text[:-1] + ', "order": "lru"}',
        "cfg-no-enabled.json": json.dumps(no_enabled),
        "cfg-valid.json": cfg_text,
        "header-window-1e30.ndjson": _terminated([_event_header(config=_config(window=10**30)),
                                                  CREATE]),
        "header-window-2e63.ndjson": _terminated([_event_header(config=_config(window=2**63)),
                                                  CREATE]),
        "header-version-99.ndjson": _terminated([_event_header(kvpocket_trace=99), CREATE]),
        "header-policy.ndjson": _terminated([_event_header(policy="sometimes"), CREATE]),
        "header-dup-key.ndjson": _terminated([_event_header()[:-1] + ', "kind": "events"}',
                                              CREATE]),
        "event-digits.ndjson": _terminated([body[0], '{"action": "resume", "params": '
                                            f'{{"seq": {DIGITS}}}}}']),
        "header-digits.ndjson": _terminated([_event_header(config=json.loads(
            cfg_text.replace('"max_blocks": 16', '"max_blocks": 0'))).replace(
                '"max_blocks": 0', f'"max_blocks": {DIGITS}'), CREATE]),
        "crlf.ndjson": "".join(ln + "\r\n" for ln in with_end_marker(body)),
        "trace-window-2e63.jsonl": _terminated([_trace_header(config=_config(window=2**63)),
                                                CREATE.replace('"seq": 3', '"seq": 0')]),
        "trace-seed-digits.jsonl": _terminated([_trace_header()[:-1] + f', "seed": {DIGITS}}}',
                                                CREATE.replace('"seq": 3', '"seq": 0')]),
        "trace-seqs-2e20.jsonl": _terminated([_trace_header(config=_config(
            num_sequences=2**20, max_pages=0)), CREATE.replace('"seq": 3', '"seq": 0')]),
        "repro-digits.json": '{"kvpocket_target_reproducer": ' + DIGITS + "}",
    }
    return out


# ---- the table ------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    argv: str  # {d}: the case's folder
    needles: tuple[str, ...]  # all must appear in stderr
    code: int = 2


def case(argv: str, *needles: str, code: int = 2, skip: bool = False, why: str = ""
         ) -> object:
    marks = [pytest.mark.skipif(skip, reason=why)] if skip else []
    return pytest.param(Case(argv, needles, code), id=argv.replace("{d}/", ""), marks=marks)


CASES = [
    # -- no command, unknown command
    case("nope", "invalid choice"),
    case("spec --config nope", "nope"),
    case("spec --policy sideways", "--policy"),
    case("spec --json --diagram", "--diagram"),
    # -- fuzz --target (the target campaign; vLLM absent from this interpreter or not)
    case("fuzz --target trtllm", "--target", "vllm", "sglang"),
    # SGLang is never in the main venv (pip cannot install it on a CPU machine)
    case("fuzz --target sglang", "--target", "scripts/sglang.sh"),
    case("fuzz --replay {d}/valid.ndjson", "--replay", "--target"),
    case("fuzz --avoid-known", "--avoid-known", "--target"),
    case("fuzz --target vllm --policy pin", "--policy", "not used with --target"),
    case("fuzz --target vllm --examples 0", "--examples", "[1, "),
    case("fuzz --target vllm --replay {d}/valid.ndjson", "--replay", "JSON reproducer"),
    # -- fuzz: numbers
    case("fuzz --minutes nan", "--minutes", "(0, 10080]"),
    case("fuzz --minutes inf", "--minutes", "(0, 10080]"),
    case("fuzz --minutes 1e308", "--minutes", "(0, 10080]"),
    case("fuzz --minutes -1", "--minutes"),
    case("fuzz --minutes 0", "--minutes"),
    case("fuzz --minutes x", "--minutes", "invalid float"),
    case("fuzz --workers 0", "--workers", "[1, "),
    case("fuzz --workers 100000", "--workers", "[1, "),
    case("fuzz --workers x", "--workers", "invalid int"),
    case("fuzz --steps 0", "--steps", "[1, 500]"),
    case("fuzz --steps 99999999999999999999", "--steps", "[1, 500]"),
    case("fuzz --examples 0", "--examples"),
    case("fuzz --examples -3", "--examples"),
    case("fuzz --seed -1", "--seed"),
    case(f"fuzz --seed {2**63}", "--seed"),
    case("fuzz --minutes 1 --examples 3", "not allowed with"),
    # -- fuzz: names, outputs, databases
    case("fuzz --config nope", "nope"),
    case("fuzz --policy sideways", "--policy"),
    case("fuzz --backend tpu", "--backend", "numpy or cupy"),
    case("fuzz --profile warp", "--profile"),
    case("fuzz --json ''", "--json"),
    case("fuzz --json {d}/folder", "--json", "folder"),
    case("fuzz --json /dev/full", "--json", "not a regular file", skip=not Path("/dev/full")
         .exists(), why="no /dev/full"),
    case("fuzz --json {d}/afile/report.json", "--json", "not a folder"),
    case("fuzz --out {d}/afile", "--out", "not a folder"),
    case("fuzz --out ''", "--out"),
    case("fuzz --database http://x", "--database", "redis://"),
    case("fuzz --database ''", "--database"),
    case("fuzz --database redis://127.0.0.1:1 --config tiny", "--database", "cannot reach"),
    case("fuzz --database {d}/afile", "--database", "not a folder"),
    case("fuzz --mutant nope", "--mutant", "'nope'", "pop-no-revalidate", "zoo-resume-no-pin"),
    # -- replay
    case("replay {d}/missing.jsonl", "cannot read"),
    case("replay {d}/folder", "cannot read"),
    case("replay {d}/empty.ndjson", "empty"),
    case("replay {d}/blank.ndjson", "empty"),
    case("replay {d}/binary.ndjson", ":1:"),
    case("replay {d}/array.ndjson", ":1: not a kvpocket trace header"),
    case("replay {d}/trace-no-marker.jsonl", "truncated", "no end marker", "--allow-unterminated"),
    case("replay {d}/trace-cut.jsonl", "truncated", "no end marker"),
    case("replay {d}/trace-seq-beyond.jsonl", ":2:", "'seq'"),
    case("replay {d}/trace-seq-negative.jsonl", ":2:", "'seq'"),
    case("replay {d}/trace-backend-tpu.jsonl", ":1:", "\"backend\"", "tpu"),
    case("replay {d}/trace-kind-events.jsonl", ":1:", "event log"),
    case("replay {d}/trace-kind-bogus.jsonl", ":1:", "\"kind\""),
    case("replay {d}/trace-huge.jsonl", ":2:", "out of range"),
    case("replay {d}/trace-layer.jsonl", ":2:", "layer"),
    case("replay {d}/trace-page-action.jsonl", ":2:", "unknown page action 'fly'"),
    case("replay {d}/trace-page-params.jsonl", ":2:", "page action 'release' takes"),
    case("replay {d}/trace-page-domain.jsonl", ":2:", "parameter 'page'", "999"),
    case("replay {d}/trace-choice.jsonl", ":2:", "\"choices\""),
    case("replay {d}/trace-bug-unknown.jsonl", "'seeded_bugs'", "'no-such-bug'", "expected one of"),
    case("replay {d}/trace-bug-type.jsonl", "\"seeded_bugs\"", "list of seeded bug names"),
    case("replay {d}/trace-overrides-bad.jsonl", "'model_overrides'", "always, add"),
    case("replay {d}/trace-deep.jsonl", ":2:", "nested too deeply"),
    case("replay {d}/trace-valid.jsonl --backend tpu", "--backend"),
    case("replay {d}/trace-config-empty.jsonl", ":1:", "\"config\""),
    # -- trace check
    case("trace", "check or record"),
    case("trace check {d}/missing.ndjson", "cannot read"),
    case("trace check {d}/folder", "cannot read"),
    case("trace check {d}/empty.ndjson", "empty"),
    case("trace check {d}/binary.ndjson", ":1:"),
    case("trace check {d}/array.ndjson", ":1: not a kvpocket trace header"),
    case("trace check {d}/non-utf8.ndjson", ":2:", "not UTF-8"),
    case("trace check {d}/cut-mid-line.ndjson", "truncated", "incomplete"),
    case("trace check {d}/cut-at-line.ndjson", "truncated", "no end marker", "last line read"),
    case("trace check {d}/no-marker-old.ndjson", "truncated", "--allow-unterminated"),
    case("trace check {d}/marker-count.ndjson", "end marker counts"),
    case("trace check {d}/marker-digest.ndjson", "digest"),
    case("trace check {d}/after-marker.ndjson", "after the end marker"),
    case("trace check {d}/missing-keys.ndjson", ":2:", "missing field 'params'"),
    case("trace check {d}/wrong-types.ndjson", ":2:", "parameter 'seq'"),
    case("trace check {d}/huge-int.ndjson", ":2:", "out of range"),
    case("trace check {d}/negative-id.ndjson", ":2:", "'seq'", ">= 0"),
    case("trace check {d}/dup-header.ndjson", ":2:", "second header"),
    case("trace check {d}/no-header.ndjson", ":1: not a kvpocket trace header"),
    case("trace check {d}/deep.ndjson", ":2:", "nested too deeply"),
    case("trace check {d}/kind-bogus.ndjson", ":1:", "\"kind\"", "eventz"),
    case("trace check {d}/kind-missing.ndjson", ":1:", "\"kind\"", "kvpocket replay"),
    case("trace check {d}/config-empty.ndjson", ":1:", "\"config\"", "tokens_per_block"),
    case("trace check {d}/config-not-object.ndjson", ":1:", "\"config\""),
    case("trace check {d}/error-bogus.ndjson", ":2:", "error category", "bogus"),
    case("trace check {d}/too-many-seqs.ndjson", "sequence slots"),
    case("trace check {d}/trace-valid.jsonl", ":1:", "\"kind\""),
    case("trace check {d}/valid.ndjson --config nope", "nope"),
    case("trace check {d}/valid.ndjson --policy sideways", "--policy"),
    # -- trace record
    case("trace record --out {d}/existing.json --steps 0", "--steps", "[1, 10000000]"),
    case("trace record --out {d}/existing.json --steps -5", "--steps"),
    case(f"trace record --out {{d}}/existing.json --steps {10**12}", "--steps"),
    case("trace record --out {d}/existing.json --seed -1", "--seed"),
    case("trace record --out {d}/existing.json --config nope", "nope"),
    case("trace record --out {d}/existing.json --policy sideways", "--policy"),
    case("trace record --out {d}/folder", "--out", "folder"),
    case("trace record --out /dev/full", "--out", "not a regular file",
         skip=not Path("/dev/full").exists(), why="no /dev/full"),
    case("trace record --out {d}/afile/log.ndjson", "--out", "not a folder"),
    case("trace record --out ''", "--out"),
    case("trace record --steps 10", "--out"),
    case("trace record --out {d}/ro/log.ndjson", "--out", "writable", skip=ROOT_USER,
         why="root writes anywhere"),
    # -- prove
    case("prove --workers 0", "--workers", "[1, "),
    case("prove --workers -1", "--workers", "[1, "),
    case("prove --workers 1000000", "--workers"),
    case("prove --workers x", "--workers", "invalid int"),
    case("prove --depth -1", "--depth", "[0, 30]"),
    case("prove --depth 31", "--depth", "[0, 30]"),
    case("prove --page-depth 99", "--page-depth", "[0, 30]"),
    case("prove --config nope", "--config", "nope"),
    case("prove --policy yolo", "--policy", "yolo"),
    case("prove --engine z3", "--engine", "explicit, symbolic, both"),
    case("prove --json {d}/folder", "--json", "folder"),
    case("prove --json ''", "--json"),
    case("prove --json {d}/afile/p.json", "--json", "not a folder"),
    case("prove --out {d}/afile", "--out", "not a folder"),
    # -- mutants
    case("mutants --budget 0", "--budget", "(0, 3600]"),
    case("mutants --budget nan", "--budget", "(0, 3600]"),
    case("mutants --budget inf", "--budget"),
    case("mutants --budget -5", "--budget"),
    case("mutants --budget 4000", "--budget"),
    case("mutants --only nope", "--only", "nope"),
    case("mutants --json {d}/folder", "--json", "folder"),
    case("mutants --json /dev/full", "--json", "not a regular file",
         skip=not Path("/dev/full").exists(), why="no /dev/full"),
    # -- bench
    case("bench --suite warp", "--suite", "warp"),
    case("bench --backend tpu", "--backend", "tpu"),
    case("bench --suite smoke --json {d}/folder", "--json", "folder"),
    case("bench --suite smoke --json /dev/full", "--json", "not a regular file",
         skip=not Path("/dev/full").exists(), why="no /dev/full"),
    case("bench --suite smoke --json ''", "--json"),
    case("bench --suite smoke --plots {d}/afile", "--plots", "not a folder"),
    case("bench --suite smoke --out {d}/afile", "--out", "not a folder"),
    # -- hardening II: unknown keys, typed header fields, sizes checked before use
    case("trace check {d}/key-Choices.ndjson", ":2:", "unknown field 'Choices'", "choices"),
    case("trace check {d}/key-reslt.ndjson", ":2:", "unknown field 'reslt'", "result"),
    case("trace check {d}/key-observd.ndjson", ":2:", "unknown field 'observd'", "observed"),
    case("trace check {d}/key-step.ndjson", ":2:", "unknown field 'step'"),
    case("trace check {d}/header-key.ndjson", ":1:", "unknown header field 'engine'"),
    case("trace check {d}/header-source-int.ndjson", ":1:", "\"source\"", "a string"),
    case("trace check {d}/status-running.ndjson", ":2:", "\"status\"", "RUNNING", "ACTIVE"),
    case("trace check {d}/digest-upper.ndjson", "malformed digest", "lowercase"),
    case("trace check {d}/marker-no-newline.ndjson", "end marker has no final newline"),
    case("trace check {d}/long-line.ndjson", ":2:", "longer than 4194304 bytes"),
    case("replay {d}/trace-key.jsonl", ":2:", "unknown field 'step'"),
    case("replay {d}/trace-header-key.jsonl", ":1:", "unknown header field 'engine'"),
    case("replay {d}/trace-eager-string.jsonl", ":1:", "\"eager\"", "true or false"),
    case("replay {d}/trace-commit-huge.jsonl", ":3:", "parameter 'n'", "10000"),
    case("replay {d}/trace-resize-huge.jsonl", ":2:", "parameter 'capacity'"),
    case("replay {d}/trace-long-line.jsonl", ":2:", "longer than"),
    case("trace check /dev/zero", "/dev/zero:1:", "longer than", skip=not Path("/dev/zero")
         .exists(), why="no /dev/zero"),
    case("replay /dev/zero", "/dev/zero:1:", "longer than", skip=not Path("/dev/zero")
         .exists(), why="no /dev/zero"),
    # -- one output path for two outputs
    case("fuzz --json {d}/cwd/x --out {d}/cwd/x", "--out", "also the path given to --json"),
    case("fuzz --config tiny --out {d}/cwd/o --database {d}/cwd/o", "--database",
         "also the path given to --out"),
    case("fuzz --json {d}/cwd/db --database {d}/cwd/db", "--database", "--json"),
    case("prove --json {d}/cwd/p --out {d}/cwd/p", "--out", "also the path given to --json"),
    case("bench --suite smoke --out {d}/cwd/b --plots {d}/cwd/b", "--out", "--plots"),
    case("bench --suite smoke --json {d}/cwd/b --plots {d}/cwd/b", "--plots", "--json"),
    # -- an empty value is no default
    case("spec --config ''", "--config", "expected a value"),
    case("fuzz --config ''", "--config", "expected a value"),
    case("fuzz --profile ''", "--profile", "expected a value"),
    case("fuzz --policy ''", "--policy", "expected a value"),
    case("trace record --out {d}/existing.json --config ''", "--config", "expected a value"),
    case("trace check {d}/valid.ndjson --config ''", "--config", "expected a value"),
    case("trace check {d}/valid.ndjson --policy ''", "--policy", "expected a value"),
    case("prove --config ''", "--config", "expected a value"),
    case("prove --policy ''", "--policy", "expected a value"),
    case("mutants --only ''", "--only", "expected a value"),
    case("bench --suite ''", "--suite", "expected a value"),
    case("replay {d}/trace-valid.jsonl --backend ''", "--backend", "expected a value"),
    # -- the lower bound of --examples checks something
    case("fuzz --examples 1", "--examples", "[2, "),
    case("fuzz --config tiny --examples 1", "--examples", "[2, "),
    # -- hardening III: every integer bounded where it is read (config files, headers,
    #    events, reproducers), sizes estimated before anything is built
    case("fuzz --config {d}/cfg-window-1e30.json", "cfg-window-1e30.json",
         "'life_cycles[0].window'", "[1, 2**32]"),
    case("fuzz --config {d}/cfg-window-2e63.json", "'life_cycles[0].window'", "2**32"),
    case("fuzz --config {d}/cfg-sinks-1e20.json", "'life_cycles[0].sink_tokens'", "2**32"),
    case("trace record --out {d}/existing.json --config {d}/cfg-window-2e63.json",
         "'life_cycles[0].window'"),
    case("spec --config {d}/cfg-window-1e30.json", "'life_cycles[0].window'"),
    case("prove --config {d}/cfg-sinks-1e20.json", "'life_cycles[0].sink_tokens'"),
    case("fuzz --config {d}/cfg-slots-3x2e24.json", "'slots_per_level' is too large",
         "checks per example", "the limit is 1,048,576"),
    case("fuzz --config {d}/cfg-t4096.json", "'tokens_per_block' is too large", "GiB",
         "the limit is 8.0 GiB"),
    case("fuzz --config {d}/cfg-seqs-2e20.json", "'num_sequences' is too large",
         "checks per example"),
    case("fuzz --config {d}/cfg-digits.json", "field \"max_blocks\"", "5000 digits"),
    case("trace record --out {d}/existing.json --config {d}/cfg-digits.json", "5000 digits"),
    case("trace check {d}/valid.ndjson --config {d}/cfg-digits.json", "5000 digits"),
    case("trace check {d}/header-window-1e30.ndjson", ":1:", "'life_cycles[0].window'"),
    case("trace check {d}/header-window-2e63.ndjson", ":1:", "'life_cycles[0].window'"),
    case("trace check {d}/header-digits.ndjson", ":1:", "\"max_blocks\"", "5000 digits"),
    case("trace check {d}/event-digits.ndjson", ":2:", "\"seq\"", "5000 digits"),
    case("replay {d}/trace-window-2e63.jsonl", ":1:", "'life_cycles[0].window'"),
    case("replay {d}/trace-seed-digits.jsonl", ":1:", "\"seed\"", "5000 digits"),
    case("replay {d}/trace-seqs-2e20.jsonl", "'num_sequences' is too large"),
    case("fuzz --target vllm --replay {d}/repro-digits.json", "--replay", "5000 digits"),
    # -- values: a key given twice, a policy of no name, a missing field of a config file
    case("fuzz --config {d}/cfg-dup-key.json", "\"order\" is given twice"),
    case("trace check {d}/header-dup-key.ndjson", ":1:", "\"kind\" is given twice"),
    case("trace check {d}/header-policy.ndjson", ":1:", "\"policy\"", "sometimes",
         "revalidate, pin, unsafe"),
    case("fuzz --config {d}/cfg-no-enabled.json", "missing: pocket.enabled (true or false)"),
    case("trace record --out {d}/existing.json --config {d}/cfg-no-enabled.json",
         "pocket.enabled"),
    case("trace check {d}/valid.ndjson --config nosuch", "'nosuch' is no preset",
         "two-level"),
    case("fuzz --total-examples 1", "--total-examples", "[2, "),
    # -- reports: the format version named, the line ending named, the article right
    case("trace check {d}/header-version-99.ndjson", ":1:", "format version 99",
         "version 1 only"),
    case("trace check {d}/crlf.ndjson", ":1:", "CR LF"),
    case("replay {d}/header-version-99.ndjson", ":1:", "format version 99"),
    case("trace check {d}/header-key.ndjson", "the header of an event log has"),
    # -- an output that is an input, or a folder made where an output file goes
    case("trace record --config {d}/cfg-valid.json --out {d}/cfg-valid.json", "--out",
         "the input given to --config"),
    case("fuzz --json {d}/cfg-valid.json --config {d}/cfg-valid.json", "--json",
         "the input given to --config"),
    case("prove --json {d}/cfg-valid.json --config {d}/cfg-valid.json", "--json",
         "the input given to --config"),
    case("bench --suite smoke --json {d}/cwd/W/x --out {d}/cwd/W/x/..", "--out",
         "would create the folder", "--json"),
]


def _snapshot(d: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for p in sorted(d.rglob("*")):
        out[str(p.relative_to(d))] = None if p.is_dir() else p.read_bytes()
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad-inputs")
    make_files(d)
    ro = d / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    return d


@pytest.mark.parametrize("c", CASES)
def test_bad_input(c: Case, files: Path, capsys: pytest.CaptureFixture[str],
                   monkeypatch: pytest.MonkeyPatch) -> None:
    import shlex

    monkeypatch.chdir(files / "cwd")
    # the memory estimate's limit, the same on every machine (half of 16 GiB)
    monkeypatch.setattr(config, "machine_memory", lambda: 16 << 30, raising=False)
    before = _snapshot(files)
    code = main(shlex.split(c.argv.format(d=files)))
    out, err = capsys.readouterr()
    assert code == c.code, (out, err)
    assert "Traceback" not in out + err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines, "no message"
    last = lines[-1]
    assert last.startswith("kvpocket") and ": error: " in last, err
    for needle in c.needles:
        assert needle in err, (needle, err)
    assert _snapshot(files) == before, "a file was written, replaced or removed"


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 190
    commands = {c.values[0].argv.split()[0] for c in CASES  # type: ignore[attr-defined]
                if c.values[0].argv.split()[0] != "nope"}  # type: ignore[attr-defined]
    assert commands == {"spec", "fuzz", "replay", "trace", "prove", "mutants", "bench"}


# ---- the valid files are valid (the broken ones differ from them in one thing) ---------


def test_the_valid_inputs_pass(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "check", str(files / "valid.ndjson")]) == 0
    assert main(["replay", str(files / "trace-valid.jsonl")]) == 0
    assert main(["trace", "check", str(files / "no-marker-old.ndjson"),
                 "--allow-unterminated"]) == 0
    assert main(["replay", str(files / "trace-no-marker.jsonl"), "--allow-unterminated"]) == 0
    assert "Traceback" not in "".join(capsys.readouterr())


def test_a_cut_log_names_the_last_line_read(files: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    n = len(_lines(files / "cut-at-line.ndjson"))
    assert main(["trace", "check", str(files / "cut-at-line.ndjson")]) == 2
    err = capsys.readouterr().err
    assert f"cut-at-line.ndjson:{n}: the event log is truncated" in err
    assert f"after line {n}, the last line read" in err


# ---- outputs: written whole, never half; existing files kept on failure ----------------


def test_record_replaces_an_existing_file_only_when_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from kvpocket.verify.traces import record as rec

    out = tmp_path / "existing.ndjson"
    out.write_text("the old log\n")
    calls = 0
    real = rec.Workload.step

    def step(self: rec.Workload) -> None:
        nonlocal calls
        calls += 1
        if calls == 50:
            raise KeyboardInterrupt
        real(self)

    monkeypatch.setattr(rec.Workload, "step", step)
    assert main(["trace", "record", "--steps", "1000", "--out", str(out)]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert out.read_text() == "the old log\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.ndjson"]  # no temp left
    monkeypatch.setattr(rec.Workload, "step", real)
    assert main(["trace", "record", "--steps", "30", "--out", str(out)]) == 0
    assert main(["trace", "check", str(out)]) == 0


def test_an_interrupted_fuzz_writes_the_partial_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from kvpocket.verify.conformance import progress

    steps = 0

    def tick(self: progress.CampaignProgress, n: int) -> None:
        nonlocal steps
        steps += n
        if steps >= 40:
            raise KeyboardInterrupt

    monkeypatch.setattr(progress.CampaignProgress, "tick", tick)
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "report.json"
    code = main(["fuzz", "--config", "tiny", "--examples", "500", "--out", str(tmp_path / "o"),
                 "--json", str(report), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 130
    assert "INTERRUPTED" in out
    data = json.loads(report.read_text())
    assert data["interrupted"] is True and data["steps"] >= 39 and data["failures"] == []
    assert not (tmp_path / ".hypothesis").exists()  # Hypothesis's files go under --out
    assert not list((tmp_path / "o").glob("failure-*"))  # an interruption is no finding


def test_an_interrupted_matrix_writes_the_partial_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from kvpocket.verify.conformance import progress

    steps = 0

    def tick(self: progress.MatrixProgress, n: int) -> None:
        nonlocal steps
        steps += n
        if steps >= 30:
            raise KeyboardInterrupt

    monkeypatch.setattr(progress.MatrixProgress, "tick", tick)
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "matrix.json"
    code = main(["fuzz", "--minutes", "5", "--workers", "1", "--out", str(tmp_path / "o"),
                 "--json", str(report), "--no-progress"])
    assert code == 130
    assert "INTERRUPTED" in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["kind"] == "matrix" and data["interrupted"] is True and data["failures"] == []
    assert not (tmp_path / ".hypothesis").exists()


def test_an_output_is_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    from kvpocket.verify.traces import trace as tr

    target = tmp_path / "out.json"
    target.write_text("old\n")

    def broken(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(tr.OutputError, match=f"cannot write {target} .No space left"):
        tr.write_atomic(target, "new\n" * 1000)
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]



def test_the_old_mutant_variable_is_refused_not_ignored(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """impl/ has no switches: a KVPOCKET_MUTANT left in the environment would otherwise
    make a user believe a bug is on."""
    monkeypatch.setenv("KVPOCKET_MUTANT", "pop-no-revalidate")
    assert main(["spec"]) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1
    assert "KVPOCKET_MUTANT" in err and "--mutant" in err


def test_a_spec_override_left_in_the_environment_is_refused(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Earlier versions read the variable at import and changed the spec; it is no longer
    read, and a run with it set says so rather than ignore it silently."""
    monkeypatch.setenv("KVPOCKET_MODEL_OVERRIDES", '{"pocket-holds": ["always", true]}')
    assert main(["fuzz", "--total-examples", "1"]) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1
    assert "KVPOCKET_MODEL_OVERRIDES" in err and "kvpocket mutants" in err
