#!/usr/bin/env bash
# The main job: the default lockstep fuzz campaign (implementation vs model on the matrix
# of configurations and policies, CPU backend) and the Z3 proofs. Installs what it needs
# into .venv first (scripts/setup-env.sh says what and why; KVPOCKET_CUDA and KVPOCKET_REDIS
# choose its optional parts). Each step starts with a `== ` line. Reports land in kvpocket-out/.
#   KVPOCKET_MINUTES   campaign length in minutes (default 2; a number in (0, 10080])
#   KVPOCKET_EXAMPLES  an example budget instead (the matrix: --total-examples; a preset:
#                      --examples; an integer >= 1): the same run, and verdict, on any machine
#   KVPOCKET_CONFIG    one preset (`kvpocket fuzz --list-configs`) or JSON config file instead
#                      of the matrix
#   KVPOCKET_WORKERS   worker processes (default: all cores; 1 to 4 per core)
# The variables are checked before anything is installed or run: a bad value exits 2
# with one line naming the variable.
set -euo pipefail
cd "$(dirname "$0")/.."

bad() { echo "scripts/main.sh: error: $1" >&2; exit 2; }
minutes="${KVPOCKET_MINUTES-2}"
workers="${KVPOCKET_WORKERS-$(nproc)}"
[[ "$minutes" =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)$ ]] \
  && awk -v m="$minutes" 'BEGIN { exit !(m > 0 && m <= 10080) }' \
  || bad "KVPOCKET_MINUTES: expected a number of minutes in (0, 10080], got '$minutes'"
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
status=0
budget=(--minutes "$minutes")
if [ -n "${KVPOCKET_EXAMPLES:-}" ]; then
  if [ -n "${KVPOCKET_CONFIG:-}" ]; then budget=(--examples "$KVPOCKET_EXAMPLES")
  else budget=(--total-examples "$KVPOCKET_EXAMPLES"); fi
fi
echo "== fuzz: kvpocket fuzz ${config[*]} ${budget[*]} --workers $workers (progress on stderr)"
kvpocket fuzz "${config[@]}" "${budget[@]}" --workers "$workers" \
  --json "$out/fuzz.json" --out "$out" || status=$?
if [ "$status" -ne 2 ] && [ "$status" -ne 130 ]; then  # a usage error or Ctrl-C: stop here
  echo "== prove: kvpocket prove (each cell's phases on stderr as they start)"
  kvpocket prove --json "$out/prove.json" --out "$out/prove" || status=$?
fi
reports=()  # only the reports this run wrote
[ "$(stamp "$out/fuzz.json")" != "${before[0]}" ] && reports+=("$out/fuzz.json")
[ "$(stamp "$out/prove.json")" != "${before[1]}" ] && reports+=("$out/prove.json")
if [ "${#reports[@]}" -gt 0 ]; then echo "reports: ${reports[*]}"; else echo "no report written"; fi
exit "$status"
