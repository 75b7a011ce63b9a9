#!/usr/bin/env bash
# The main job: the default lockstep fuzz campaign (implementation vs model on the matrix
# of configurations and policies, CPU backend) and the Z3 proofs. Installs what it needs
# into .venv first. Reports land in kvpocket-out/.
#   KVPOCKET_MINUTES   campaign length in minutes (default 2)
#   KVPOCKET_EXAMPLES  an example budget instead (the matrix: --total-examples; a preset:
#                      --examples): the same run, and verdict, on any machine
#   KVPOCKET_CONFIG    one preset instead of the matrix (`kvpocket fuzz --list-configs`)
#   KVPOCKET_WORKERS   worker processes (default: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh
export PATH="$PWD/.venv/bin:$PATH"
out=kvpocket-out
mkdir -p "$out"
status=0
config=()
[ -n "${KVPOCKET_CONFIG:-}" ] && config=(--config "$KVPOCKET_CONFIG")
budget=(--minutes "${KVPOCKET_MINUTES:-2}")
if [ -n "${KVPOCKET_EXAMPLES:-}" ]; then
  if [ -n "${KVPOCKET_CONFIG:-}" ]; then budget=(--examples "$KVPOCKET_EXAMPLES")
  else budget=(--total-examples "$KVPOCKET_EXAMPLES"); fi
fi
kvpocket fuzz "${config[@]}" "${budget[@]}" \
  --workers "${KVPOCKET_WORKERS:-$(nproc)}" --json "$out/fuzz.json" --out "$out" || status=$?
kvpocket prove --json "$out/prove.json" --out "$out/prove" || status=$?
echo "reports: $out/fuzz.json $out/prove.json"
exit "$status"
