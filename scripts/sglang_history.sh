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
# (a triton kernel): the target runs their own naive reading of it (alloc_extend_naive),
# so the paged presets run there too. The all-SWA presets need 0.5.15.post1 or
# later (PureSWARadixCache); no release builds swa-paged. The case format and the runner:
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
  # all-SWA models (PureSWARadixCache, 0.5.15.post1 on; docs/targets/sglang.md, "Real bugs")
  # sglang#31486: with the evict floor 0 (a model that is not prefill-aware) a finished
  # request's insert takes the KV its decode freed out of the window: every release
  "$pinned swa found $examples"
  "0.5.20 swa found $examples"
  "0.5.15.post1 swa found $examples"
  "$pinned swa found 1 --replay $traces/sglang-31486-window-evicted-kv-recached.json"
  "0.5.21 swa found 1 --replay $traces/sglang-31486-window-evicted-kv-recached.json"
  "0.5.20 swa found 1 --replay $traces/sglang-31486-window-evicted-kv-recached.json"
  "0.5.15.post1 swa found 1 --replay $traces/sglang-31486-window-evicted-kv-recached.json"
  "$pinned swa clean $examples --avoid-known all"
  # its other half, a retraction (no insert) freeing those slots again: up to 0.5.20,
  # gone with 0.5.21's release path
  "0.5.20 swa found $examples --avoid-known pure-swa-recache-window-evicted"
  "0.5.20 swa found 1 --replay $traces/sglang-31486-retract-frees-window-evicted-kv.json"
  "0.5.19 swa found 1 --replay $traces/sglang-31486-retract-frees-window-evicted-kv.json"
  "0.5.21 swa clean 1 --replay $traces/sglang-31486-retract-frees-window-evicted-kv.json"
  "0.5.21 swa clean $examples --avoid-known pure-swa-recache-window-evicted"
  # sglang#38349: a prefill-aware model's request retracted before its first window free
  # leaks its KV past the evict floor (up to 0.5.19, fixed in 0.5.20)
  "0.5.19 swa-prefill-aware found $examples"
  "0.5.19 swa-prefill-aware found 1 --replay $traces/sglang-38349-pure-swa-tail-not-freed.json"
  "0.5.15.post1 swa-prefill-aware found 1 --replay $traces/sglang-38349-pure-swa-tail-not-freed.json"
  "0.5.20 swa-prefill-aware clean 1 --replay $traces/sglang-38349-pure-swa-tail-not-freed.json"
  "0.5.20 swa-prefill-aware clean $examples"
  "$pinned swa-prefill-aware clean $examples"
)
[ -d "$root/extra/xgrammar" ] || history_pip install --no-deps --target "$root/extra" xgrammar
run_history_cases "$@"
