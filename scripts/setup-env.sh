#!/usr/bin/env bash
# Creates (or refreshes) .venv with everything the test suite and the main job need.
# Idempotent and quick when nothing changed. torch comes as the CPU build where a
# local wheel directory provides it (set KVPOCKET_TORCH_SPEC to override).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
find_links=()
[ -d /opt/wheels ] && find_links=(--find-links /opt/wheels)
stamp=.venv/.kvpocket-deps
want="$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check "${find_links[@]}" \
    "${KVPOCKET_TORCH_SPEC:-torch==2.13.0}" \
    || .venv/bin/python -m pip install -q --disable-pip-version-check "${find_links[@]}" torch
  .venv/bin/python -m pip install -q --disable-pip-version-check "${find_links[@]}" \
    -e ".[dev,cuda,redis]"
  echo "$want" > "$stamp"
fi
if ! command -v redis-server >/dev/null 2>&1; then
  # The Redis-backed example database is tested against a real server.
  (apt-get install -y -qq redis-server >/dev/null 2>&1 \
    || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq redis-server >/dev/null 2>&1)) \
    || echo "note: redis-server could not be installed; the Redis database test will skip" >&2
fi
