#!/usr/bin/env bash
# Generic mutation testing of impl/ with cosmic-ray: every mutant of the six core modules
# (kvcache, storage, eviction, allocator, radix, undo) runs the default fuzz campaign
# (`kvpocket fuzz`, one worker, a short budget); a campaign that finds a bug kills it.
# See docs/assurance.md for the filters, the last score and the survivors.
#
# Mutations are written to files on disk, so everything runs in a scratch copy of the
# tracked (and untracked, non-ignored) files: the working tree is never touched.
#
#   scripts/mutation.sh                       # a 200-mutant stratified sample
#   MUTATION_SAMPLE=all scripts/mutation.sh   # every mutant (~1600: about 3 hours)
#   scripts/mutation.sh --verifier            # the verifier scope instead (below)
#
# --verifier: the same machinery over the code that decides verdicts (the lockstep comparison
# and views, the trace checker, the invariants and their derived checks, the data oracle:
# mutation_probe.VERIFIER_MODULES), each mutant judged by the tests that cover that code
# (mutation_probe.VERIFIER_TESTS, pytest -x, Hypothesis seeded by KVPOCKET_SEED): a failing
# test kills it. The budget variables do not apply; MUTATION_HARD_S does (default 300).
#
# Environment:
#   MUTATION_SAMPLE    number of mutants to run, or `all` (default 200)
#   MUTATION_PER_MODULE  at most this many mutants per module instead (seeded by
#                      MUTATION_SEED; default 0: MUTATION_SAMPLE decides)
#   MUTATION_SEED      sampling seed (default 12); the campaign seed is KVPOCKET_SEED (0)
#   MUTATION_BUDGET_S  campaign budget per mutant in seconds (default 20)
#   MUTATION_EXAMPLES  campaign budget per mutant in examples instead (`fuzz
#                      --total-examples`): the same verdict on any machine, and score.json
#                      reports examples-to-kill, median and worst (default 0: seconds)
#   MUTATION_HARD_S    hard timeout per mutant; past it the mutant counts as a timeout
#                      (a kill, reported apart) (default 2 x budget + 20)
#   MUTATION_WORKERS   parallel shards, each a scratch copy running one mutant at a time
#                      (default 1)
#   MUTATION_WALL_S    stop executing after this many seconds (default: no limit); the
#                      report then covers the mutants that ran
#   MUTATION_EXCLUDE_OPERATORS  comma-separated regexes of cosmic-ray operators to skip
#   MUTATION_MODULES   comma-separated: only these modules of the scope (default: all)
#   MUTATION_TESTS     comma-separated: --verifier's kill tests instead of VERIFIER_TESTS
#   MUTATION_WORK      scratch directory (default ${TMPDIR:-/tmp}/kvpocket-mutation, with
#                      -verifier appended for --verifier)
#   MUTATION_OUT       report directory (default kvpocket-out/mutation, or
#                      kvpocket-out/mutation-verifier)
#   MUTATION_RESUME=1  keep the scratch sessions and run only what is still pending
#
# Output: $MUTATION_OUT/score.json (killed, survived, timeout, incompetent, score, 95%
# interval), survivors.md (file:line, operator and diff of each survivor), filter.json.
# Exits 0 when the run completed (whatever the score), 1 if the unmutated baseline fails.
set -euo pipefail
SCOPE=impl
for arg in "$@"; do
  case "$arg" in
    --verifier) SCOPE=verifier ;;
    *) echo "mutation.sh: unknown option $arg (allowed: --verifier)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
ROOT=$PWD
SAMPLE=${MUTATION_SAMPLE:-200}
SEED=${MUTATION_SEED:-12}
BUDGET=${MUTATION_BUDGET_S:-20}
EXAMPLES=${MUTATION_EXAMPLES:-0}
suffix=""
default_hard=$(( ${BUDGET%.*} * 2 + 20 ))
if [ "$SCOPE" = verifier ]; then suffix=-verifier; default_hard=300; fi
HARD=${MUTATION_HARD_S:-$default_hard}
WORKERS=${MUTATION_WORKERS:-1}
WORK=${MUTATION_WORK:-${TMPDIR:-/tmp}/kvpocket-mutation$suffix}
OUT=${MUTATION_OUT:-$ROOT/kvpocket-out/mutation$suffix}
CAMPAIGN_SEED=${KVPOCKET_SEED:-0}
case "$OUT" in /*) ;; *) OUT=$ROOT/$OUT ;; esac

[ -x .venv/bin/python ] || scripts/setup-env.sh
PY=$ROOT/.venv/bin/python
if ! "$PY" -c 'import cosmic_ray' 2>/dev/null; then
  find_links=()
  [ -d /opt/wheels ] && find_links=(--find-links /opt/wheels)
  # the `mutation` extra of pyproject.toml, without reinstalling the project itself
  "$PY" -m pip install -q --disable-pip-version-check "${find_links[@]}" "cosmic-ray>=8.7"
fi
CR=$ROOT/.venv/bin/cosmic-ray
mkdir -p "$OUT"

copy_tree() {  # the files git would commit (tracked + untracked non-ignored), as they are now
  local dest=$1
  rm -rf "$dest"; mkdir -p "$dest"
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -co --exclude-standard -z \
      | while IFS= read -r -d '' f; do
          if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
        done \
      | tar --null -T - -cf - | tar -xf - -C "$dest"
  else
    tar --exclude=./.venv --exclude=./kvpocket-out --exclude=./.git -cf - . | tar -xf - -C "$dest"
  fi
}

probe() {  # the scratch copy's own mutation_probe, with the scratch copy on the path
  local tree=$1; shift
  (cd "$tree" && PYTHONPATH="$tree/.devpath" "$PY" -m kvpocket.verify.quality.mutation_probe "$@")
}

sessions=()
for ((i = 0; i < WORKERS; i++)); do sessions+=("$WORK/tree$i/session.sqlite"); done

if [ "${MUTATION_RESUME:-0}" != 1 ] || [ ! -f "${sessions[0]}" ]; then
  T0=$WORK/tree0
  copy_tree "$T0"
  where=$(cd "$T0" && PYTHONPATH="$T0/.devpath" "$PY" -c \
    'import kvpocket.impl.kvcache as m; print(m.__file__)')
  case "$where" in "$T0"/*) ;; *) echo "mutation: imports resolve to $where, not the copy" >&2; exit 1 ;; esac
  probe "$T0" config --out "$T0/cosmic-ray.toml" --budget "$BUDGET" --hard "$HARD" \
    --seed "$CAMPAIGN_SEED" --exclude-operators "${MUTATION_EXCLUDE_OPERATORS:-}" \
    --examples "$EXAMPLES" --scope "$SCOPE" --modules "${MUTATION_MODULES:-}" \
    --tests "${MUTATION_TESTS:-}"
  if [ "$SCOPE" = verifier ]; then
    echo "== baseline: the verifier's kill tests on the unmutated copy"
  else
    echo "== baseline: the default campaign on the unmutated copy (${BUDGET}s)"
  fi
  if ! (cd "$T0" && PYTHONPATH="$T0/.devpath" "$CR" baseline cosmic-ray.toml); then
    echo "mutation: the campaign fails on the unmutated tree; fix that first" >&2
    exit 1
  fi
  echo "== init"
  (cd "$T0" && PYTHONPATH="$T0/.devpath" "$CR" init cosmic-ray.toml session.sqlite)
  # cosmic-ray's own filters first (operator excludes, `# pragma: no mutate` lines), then
  # ours: exception message text, annotations, and the sample.
  (cd "$T0" && "$ROOT/.venv/bin/cr-filter-operators" session.sqlite cosmic-ray.toml)
  (cd "$T0" && "$ROOT/.venv/bin/cr-filter-pragma" session.sqlite)
  probe "$T0" filter session.sqlite --root . --sample "$SAMPLE" --seed "$SEED" \
    --per-module "${MUTATION_PER_MODULE:-0}" \
    --json "$OUT/filter.json"
  for ((i = 1; i < WORKERS; i++)); do
    rm -rf "$WORK/tree$i"; cp -a "$T0" "$WORK/tree$i"
  done
  for ((i = 0; i < WORKERS; i++)); do
    probe "$WORK/tree$i" shard session.sqlite --index "$i" --of "$WORKERS"
  done
fi

echo "== exec ($SCOPE): $WORKERS shard(s), hard timeout ${HARD}s a mutant"
limit=()
[ -n "${MUTATION_WALL_S:-}" ] && limit=(timeout -s INT -k 60 "$MUTATION_WALL_S")
pids=()
for ((i = 0; i < WORKERS; i++)); do
  (cd "$WORK/tree$i" && PYTHONPATH="$WORK/tree$i/.devpath" \
    "${limit[@]}" "$CR" exec cosmic-ray.toml session.sqlite > "$WORK/exec$i.log" 2>&1) &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || echo "mutation: a shard stopped early (see $WORK/exec*.log)" >&2; done

echo "== report"
probe "$WORK/tree0" report "${sessions[@]}" --out "$OUT" --scope "$SCOPE" \
  --equivalents "$ROOT/scripts/mutation-equivalents.tsv"
echo "mutation: $OUT/score.json, $OUT/survivors.md"
