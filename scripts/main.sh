#!/usr/bin/env bash
# The main job: the default lockstep fuzz campaign (implementation vs model on the matrix
# of configurations and policies, CPU backend) and the Z3 proofs. Installs what it needs
# into .venv first (scripts/setup-env.sh says what and why; KVPOCKET_CUDA and KVPOCKET_REDIS
# choose its optional parts). Each step starts with a `== ` line. Reports land in kvpocket-out/.
#   KVPOCKET_EXAMPLES  the campaign's example budget (the matrix: --total-examples,
#                      default 1100, the plan the kill figures are measured with; a preset:
#                      --examples): the same run, and verdict, on any machine
#   KVPOCKET_MINUTES   a time budget instead (a number in (0, 10080]; never the default: a
#                      run that ends before its plan exits 3, incomplete)
#   KVPOCKET_CONFIG    one preset (`kvpocket fuzz --list-configs`) or JSON config file instead
#                      of the matrix
#   KVPOCKET_WORKERS   worker processes (default: all cores; 1 to 4 per core)
# The variables are checked before anything is installed or run: a bad value exits 2
# with one line naming the variable. The last line combines every verdict (`kvpocket
# verdict`); the exit status is the worst of them: 0 clean, 1 a bug found, 2 a usage
# error, 3 incomplete (an obligation unknown, a timed run short of its plan), 130
# interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."

bad() { echo "scripts/main.sh: error: $1" >&2; exit 2; }
minutes="${KVPOCKET_MINUTES-}"
workers="${KVPOCKET_WORKERS-$(nproc)}"
if [ -n "${KVPOCKET_MINUTES+set}" ]; then
  [[ "$minutes" =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)$ ]] \
    && awk -v m="$minutes" 'BEGIN { exit !(m > 0 && m <= 10080) }' \
    || bad "KVPOCKET_MINUTES: expected a number of minutes in (0, 10080], got '$minutes'"
  [ -z "${KVPOCKET_EXAMPLES:-}" ] \
    || bad "KVPOCKET_MINUTES: give either KVPOCKET_MINUTES or KVPOCKET_EXAMPLES, not both"
fi
[[ "$workers" =~ ^[0-9]+$ ]] && (( 10#$workers >= 1 && 10#$workers <= 4 * $(nproc) )) \
  || bad "KVPOCKET_WORKERS: expected an integer in [1, $((4 * $(nproc)))], got '$workers'"
if [ -n "${KVPOCKET_EXAMPLES:-}" ]; then
  [[ "$KVPOCKET_EXAMPLES" =~ ^[0-9]+$ ]] && (( 10#$KVPOCKET_EXAMPLES >= 1 )) \
    || bad "KVPOCKET_EXAMPLES: expected an integer >= 1 (an example budget), got '$KVPOCKET_EXAMPLES'"
fi
if [ -n "${KVPOCKET_CONFIG+set}" ] && [ -z "$KVPOCKET_CONFIG" ]; then
  bad "KVPOCKET_CONFIG: expected a preset name (kvpocket fuzz --list-configs), got ''"
fi

echo "== setup: .venv (scripts/setup-env.sh; minutes the first time, seconds after)"
scripts/setup-env.sh
export PATH="$PWD/.venv/bin:$PATH"
config=()
if [ -n "${KVPOCKET_CONFIG:-}" ] && [ ! -f "$KVPOCKET_CONFIG" ]; then  # a file: fuzz checks it
  python -c "import sys; from kvpocket.verify.presets import PRESETS; sys.exit(sys.argv[1] not in PRESETS)" \
    "$KVPOCKET_CONFIG" || bad "KVPOCKET_CONFIG: unknown preset '$KVPOCKET_CONFIG' (and no such JSON config file); expected one of $(python -c 'from kvpocket.verify.presets import PRESETS; print(", ".join(PRESETS))')"
fi
[ -n "${KVPOCKET_CONFIG:-}" ] && config=(--config "$KVPOCKET_CONFIG")
out=kvpocket-out
mkdir -p "$out"
stamp() { stat -c %y "$1" 2>/dev/null || echo none; }
before=("$(stamp "$out/fuzz.json")" "$(stamp "$out/prove.json")")
budget=()  # the default: the campaign's own plan, counted in examples
if [ -n "$minutes" ]; then budget=(--minutes "$minutes"); fi
if [ -n "${KVPOCKET_EXAMPLES:-}" ]; then
  if [ -n "${KVPOCKET_CONFIG:-}" ]; then budget=(--examples "$KVPOCKET_EXAMPLES")
  else budget=(--total-examples "$KVPOCKET_EXAMPLES"); fi
fi
fuzz_status=0 prove_status=0
echo "== fuzz: kvpocket fuzz ${config[*]} ${budget[*]} --workers $workers (progress on stderr)"
kvpocket fuzz "${config[@]}" "${budget[@]}" --workers "$workers" \
  --json "$out/fuzz.json" --out "$out" || fuzz_status=$?
if [ "$fuzz_status" -ne 2 ] && [ "$fuzz_status" -ne 130 ] && [ "$fuzz_status" -ne 143 ]; then  # stop
  echo "== prove: kvpocket prove (each cell's phases on stderr as they start)"
  kvpocket prove --json "$out/prove.json" --out "$out/prove" || prove_status=$?
fi
reports=()  # only the reports this run wrote
[ "$(stamp "$out/fuzz.json")" != "${before[0]}" ] && reports+=("$out/fuzz.json")
[ "$(stamp "$out/prove.json")" != "${before[1]}" ] && reports+=("$out/prove.json")
if [ "${#reports[@]}" -eq 0 ]; then
  echo "kvpocket: no report written (fuzz exit $fuzz_status, prove exit $prove_status)"
  exit $(( fuzz_status != 0 ? fuzz_status : (prove_status != 0 ? prove_status : 2) ))
fi
echo "reports: ${reports[*]}"
# One line for every verdict; its status is the worst of the reports'. A command that
# wrote no report (a usage error, Ctrl-C) still decides the status.
verdict_status=0
kvpocket verdict "${reports[@]}" || verdict_status=$?
for s in "$fuzz_status" "$prove_status"; do  # a status no report shows (2, 130) wins
  case "$s" in 2|130|143) exit "$s" ;; esac
done
exit "$verdict_status"
