#!/usr/bin/env bash
# The SGLang target against older sglang releases: real bugs found in affected releases
# and not in fixed ones (issue 34; docs/targets/sglang.md, "Older releases"; not in CI).
#
#   scripts/sglang_history.sh                     the recorded cases (below), each checked
#   scripts/sglang_history.sh VERSION CONFIG ...  other (version, preset) pairs, reported only
#                                                 ($KVPOCKET_HISTORY_FLAGS: fuzz flags for them)
#
# Each version's wheel is imported on top of the pinned environment of scripts/sglang.sh
# (torch, transformers, triton, ...). xgrammar, which releases up to 0.5.20 import at
# start-up, goes in a shared folder, also --no-deps. The target detects which API the
# loaded release speaks (verify/targets/sglang_compat.py): SWARadixCache up to 0.5.20, the
# unified tree from 0.5.21. Releases before 0.5.22 have no CPU path in the paged allocator
# (a triton kernel), so only the token presets run. The case format and the runner:
# scripts/history_cases.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/sglang.sh --setup
target=sglang
package=sglang
pinned=${KVPOCKET_SGLANG_VERSION:-0.5.23}
py=${KVPOCKET_SGLANG_VENV:-$HOME/.cache/kvpocket/sglang-$pinned}/bin/python
root=$HOME/.cache/kvpocket/sglang-history
examples=${KVPOCKET_HISTORY_EXAMPLES:-3000}
case_env() { :; }
source scripts/history_cases.sh
traces=tests/targets/engine_cases
cases=(
  "$pinned hybrid clean $examples"
  # 0.5.22's finished insert asserted (checkpoint_into_tree) only because the target
  # skipped the checkpoint SGLang's result processor makes after a prefill's last chunk;
  # with it, clean (docs/targets/sglang.md, "Older releases")
  "0.5.22 hybrid clean $examples"
  "0.5.22 hybrid-paged clean $examples"
  "0.5.21 hybrid clean $examples"
  # sglang#29352: SWARadixCache's insert over a tombstone frees full KV slots a running
  # request still holds locked (in 0.5.13.post1 and 0.5.14, fixed in 0.5.15.post1)
  "0.5.13.post1 hybrid-tight found $examples"
  "0.5.13.post1 hybrid-tight found 1 --replay $traces/sglang-29352-tombstone-insert-frees-locked-kv.json"
  "0.5.14 hybrid-tight found 1 --replay $traces/sglang-29352-tombstone-insert-frees-locked-kv.json"
  "0.5.15.post1 hybrid-tight clean 1 --replay $traces/sglang-29352-tombstone-insert-frees-locked-kv.json"
  "0.5.15.post1 hybrid-tight clean $examples"
)
[ -d "$root/extra/xgrammar" ] || history_pip install --no-deps --target "$root/extra" xgrammar
run_history_cases "$@"
