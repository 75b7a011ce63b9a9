#!/usr/bin/env bash
# GPU suite: the gpu-marked implementation tests, then the GPU benchmarks (decode A/B
# pocket off vs on on CuPy, migration bandwidth, oracle throughput), in one go (under 8 min).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export PYTHONPATH=".devpath${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-kvpocket-out}"
mkdir -p "$OUT"
"$PY" -c "from kvpocket.impl import gpu_available; import sys; \
print('gpu_available =', gpu_available()); sys.exit(0 if gpu_available() else 3)"
timeout 300 "$PY" -m pytest tests/impl -m gpu -q -p no:cacheprovider -rs \
  --junitxml="$OUT/gpu-tests.xml"
# Bench suite `gpu` (issue 7): decode A/B on CuPy, migration copy bandwidth against a
# plain CuPy copy of the same bytes, data-oracle throughput; JSON and plots under $OUT.
timeout 240 "$PY" -m kvpocket.verify.bench.suite --suite gpu --json "$OUT/bench-gpu.json" \
  --plots "$OUT/bench-gpu-plots"
