#!/usr/bin/env bash
# The SGLang target against older sglang releases: real bugs found in affected releases
# and not in fixed ones (issue 34; docs/targets/sglang.md, "Older releases"; not in CI).
#
#   scripts/sglang_history.sh                     the recorded cases (below), each checked
#   scripts/sglang_history.sh VERSION CONFIG ...  other (version, preset) pairs, reported only
#
# Each version's wheel is installed without its dependencies into its own folder
# ($HOME/.cache/kvpocket/sglang-history/VERSION, once) and imported on top of the pinned
# environment of scripts/sglang.sh (torch, transformers, triton, ...). xgrammar, which
# releases up to 0.5.20 import at start-up, goes in a shared folder, also --no-deps. The
# target detects which API the loaded release speaks (verify/targets/sglang_compat.py):
# SWARadixCache up to 0.5.20, the unified tree from 0.5.21. Releases before 0.5.22 have
# no CPU path in the paged allocator (a triton kernel), so only the token presets run.
# Each case is `kvpocket fuzz --target sglang --config CONFIG --examples N --seed 0`
# (N = $KVPOCKET_HISTORY_EXAMPLES, default 3000, the default plan); reproducers go to
# kvpocket-out/sglang-history/VERSION. Exit 0 when every recorded case comes out as recorded.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/sglang.sh --setup
pinned=${KVPOCKET_SGLANG_VERSION:-0.5.23}
py=${KVPOCKET_SGLANG_VENV:-$HOME/.cache/kvpocket/sglang-$pinned}/bin/python
root=$HOME/.cache/kvpocket/sglang-history
examples=${KVPOCKET_HISTORY_EXAMPLES:-3000}
# version config expected (docs/targets/sglang.md, "Real bugs in released SGLang")
# Measured (docs/targets/sglang.md): 0.5.22 stops at an engine assertion
# (checkpoint_into_tree, at the end of a run) that the pinned 0.5.23 does not reach;
# not yet matched to a tracker entry.
cases=(
  "$pinned hybrid clean"
  "0.5.22 hybrid found"
  "0.5.22 hybrid-paged found"
  "0.5.21 hybrid clean"
)
if [ $# -gt 0 ]; then
  cases=()
  while [ $# -ge 2 ]; do cases+=("$1 $2 any"); shift 2; done
fi
pip() { "$py" -m pip -q --disable-pip-version-check "$@"; }
[ -d "$root/extra/xgrammar" ] || pip install --no-deps --target "$root/extra" xgrammar
status=0
summary=()
for case in "${cases[@]}"; do
  read -r v config expected <<<"$case"
  path=""
  if [ "$v" != "$pinned" ]; then
    [ -f "$root/$v/.done" ] || { pip install --no-deps --target "$root/$v" "sglang==$v" \
                                 && touch "$root/$v/.done"; }
    path="$root/$v:"
  fi
  echo "== sglang $v, $config (expected: $expected)"
  rc=0
  PYTHONPATH="$path$root/extra:$PWD/.devpath" "$py" -m kvpocket.verify.cli fuzz \
    --target sglang --config "$config" --examples "$examples" --seed 0 \
    --out "kvpocket-out/sglang-history/$v" || rc=$?
  got=clean; [ $rc = 1 ] && got=found; [ $rc -gt 1 ] && got="error ($rc)"
  summary+=("$v $config: $got (expected $expected)")
  if [ "$expected" != any ] && [ "$got" != "$expected" ]; then status=1; fi
done
printf '%s\n' "${summary[@]}"
exit $status
