#!/usr/bin/env bash
# The main job: a lockstep fuzz campaign (implementation vs model, CPU backend) and the Z3
# proofs. Installs what it needs into .venv first. Reports land in kvpocket-out/.
#   KVPOCKET_MINUTES   campaign length in minutes (default 2)
#   KVPOCKET_CONFIG    preset (default two-level; `kvpocket fuzz --list-configs`)
#   KVPOCKET_WORKERS   worker processes (default: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh
export PATH="$PWD/.venv/bin:$PATH"
out=kvpocket-out
mkdir -p "$out"
status=0
kvpocket fuzz --config "${KVPOCKET_CONFIG:-two-level}" --minutes "${KVPOCKET_MINUTES:-2}" \
  --workers "${KVPOCKET_WORKERS:-$(nproc)}" --json "$out/fuzz.json" --out "$out" || status=$?
kvpocket prove --json "$out/prove.json" --out "$out/prove" || status=$?
echo "reports: $out/fuzz.json $out/prove.json"
exit "$status"
