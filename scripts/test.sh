#!/usr/bin/env bash
# The whole test suite: lint, strict typing, then pytest (CPU; GPU tests skip with a reason).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check model impl verify tests
echo "== mypy --strict"; mypy --strict model impl verify tests
echo "== pytest"; python -m pytest -q -p no:cacheprovider -n "${KVPOCKET_TEST_WORKERS:-2}" "$@"
