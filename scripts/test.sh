#!/usr/bin/env bash
# The test suite: lint, strict typing, then pytest (CPU; GPU tests skip with a reason).
#
#   scripts/test.sh          every tier but `deep` (what CI runs): under 10 minutes on a
#                            quiet 2-core machine once installed
#   scripts/test.sh --fast   the inner loop: lint, types and the fast tier, the tests not
#                            marked `slow` or `quality` (pyproject.toml); under 2 minutes
#                            on a quiet 2-core machine
#   scripts/test.sh --deep   the `deep` tier alone: proof searches of minutes each, whose
#                            claims CI checks in cheaper forms (run it before a release)
#
# Further arguments go to pytest; KVPOCKET_TEST_WORKERS sets its processes (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=full
case "${1:-}" in
  --fast) tier=fast; shift ;;
  --deep) tier=deep; shift ;;
esac
scripts/setup-env.sh
export PATH="$PWD/.venv/bin:$PATH"
# The real engines' targets (vLLM's, SGLang's) run against pinned releases in their own
# cached environments. Those install in the background while lint and pytest run (pip
# waits on the network and the disk, pytest on the CPU); KVPOCKET_SKIP_<ENGINE>=1 leaves
# one out.
engines=()
if [ "$tier" = full ]; then
  for engine in vllm sglang; do
    skip="KVPOCKET_SKIP_${engine^^}"
    [ -x "scripts/$engine.sh" ] && [ "${!skip:-0}" != 1 ] && engines+=("$engine")
  done
fi
mkdir -p build
declare -A setup_pids=()
for engine in "${engines[@]}"; do
  scripts/$engine.sh --setup > "build/setup-$engine.log" 2>&1 &
  setup_pids[$engine]=$!
done
SECONDS=0  # the phases' times are printed (setup above not counted)
echo "== ruff"; ruff check model impl verify tests
# By package name (not path) so each module is checked once, as `kvpocket.*`.
echo "== mypy --strict"; mypy --strict -p kvpocket.model -p kvpocket.impl -p kvpocket.verify
mypy --strict tests
# worksteal: an idle worker takes queued tests from a busy one (a few tests take minutes)
run_pytest=(python -m pytest -q -p no:cacheprovider -n "${KVPOCKET_TEST_WORKERS:-2}"
            --dist worksteal)
if [ "$tier" = fast ]; then
  echo "== pytest (fast tier: not slow, not quality)"
  exec "${run_pytest[@]}" -m "not slow and not quality" "$@"
fi
if [ "$tier" = deep ]; then
  echo "== pytest (deep tier)"
  exec "${run_pytest[@]}" -m deep "$@"
fi
echo "== pytest (every tier but deep)"
lint_s=$SECONDS
"${run_pytest[@]}" -m "not deep" "$@"
pytest_s=$((SECONDS - lint_s))
# Each engine's target tests against its pinned release (the environment's first install
# takes minutes, in the background since the start; then it is cached).
for engine in "${engines[@]}"; do
  if ! wait "${setup_pids[$engine]}"; then
    echo "== $engine environment failed to install:"; cat "build/setup-$engine.log"; exit 1
  fi
  echo "== $engine target (scripts/$engine.sh --tests)"; scripts/$engine.sh --tests -m "not deep"
done
echo "== done in ${SECONDS} s after setup: ruff and mypy ${lint_s} s, pytest ${pytest_s} s," \
  "engine targets $((SECONDS - lint_s - pytest_s)) s (${engines[*]:-none})"
