#!/usr/bin/env bash
# GPU suite (issue 14), one run of under 5 minutes on a GPU box:
#   1. the gpu-marked implementation tests, 10 times in a row, each in a fresh process
#      (the copy-chain test once failed cold); a pass count per test id;
#   2. the device measurements behind the targets (migration bandwidth against a plain
#      bulk copy, per copy strategy; oracle sweep throughput at 256 x 4096) and extras
#      (the batched copy alone on contiguous and scattered slots, the stream-read oracle);
#   3. the gpu bench suite (`kvpocket bench --suite gpu`: decode A/B on CuPy, and again
#      migration and oracle), with the time that is left;
#   4. a summary against the targets (migration >= 0.9 of a bulk copy both ways, oracle
#      >= 1e8 verified positions/s, 10/10 test runs), as JSON and text.
# Results go under $OUT (default kvpocket-out/gpu). Exit status: 0 all targets met,
# 1 a target missed or a step failed, 3 no usable GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export PYTHONPATH=".devpath${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-kvpocket-out/gpu}"
mkdir -p "$OUT"
DEVICE=(-c "import sys; from kvpocket.verify.bench.device import main; sys.exit(main(sys.argv[1:]))")
START=$SECONDS
left() { echo $(( 290 - (SECONDS - START) )); }  # seconds left of the 5-minute budget
status=0

"$PY" -c "from kvpocket.impl import gpu_available; import sys; \
print('gpu_available =', gpu_available()); sys.exit(0 if gpu_available() else 3)" \
  || exit 3
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  > "$OUT/device.txt" 2>&1 || true

# ---- 1. gpu-marked tests, 10 fresh processes (at most 140 s) --------------------------
runs=0
passed_runs=0
: > "$OUT/gpu-tests-runs.txt"
for i in $(seq 1 10); do
  budget=$(( 140 - (SECONDS - START) ))
  if [ "$budget" -lt 8 ]; then
    echo "gpu tests: budget spent after $runs runs" | tee -a "$OUT/gpu-tests-runs.txt"
    break
  fi
  runs=$i
  if timeout "$budget" "$PY" -m pytest tests/impl tests/oracles -m gpu -q -p no:cacheprovider -rs \
      --junitxml="$OUT/gpu-tests-$i.xml" > "$OUT/gpu-tests-$i.log" 2>&1; then
    passed_runs=$(( passed_runs + 1 ))
  fi
  echo "run $i: $(tail -n 1 "$OUT/gpu-tests-$i.log")" | tee -a "$OUT/gpu-tests-runs.txt"
done
[ "$passed_runs" -eq 10 ] || status=1

# ---- 2. device measurements behind the targets, then extras (at most 70 s) -------------
timeout "$(( $(left) - 80 > 20 ? $(left) - 80 : 20 ))" "$PY" "${DEVICE[@]}" extras "$OUT" \
  > "$OUT/device-extras.log" 2>&1 || status=1

# ---- 3. the gpu bench suite (what is left, at least 20 s) --------------------------------
if ! timeout "$(( $(left) > 20 ? $(left) : 20 ))" "$PY" -m kvpocket.verify.cli bench \
    --suite gpu --json "$OUT/bench-gpu.json" --plots "$OUT/bench-gpu-plots" \
    > "$OUT/bench-gpu.log" 2>&1; then
  echo "bench --suite gpu failed or ran out of time (see $OUT/bench-gpu.log)"
  status=1
fi

# ---- 4. summary against the targets -----------------------------------------------------
"$PY" "${DEVICE[@]}" summary "$OUT" "$runs" "$passed_runs" \
  | tee "$OUT/gpu-summary.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "gpu suite: $(( SECONDS - START )) s, results under $OUT"
exit "$status"
