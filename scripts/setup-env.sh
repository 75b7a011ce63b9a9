#!/usr/bin/env bash
# Creates (or refreshes) .venv with what the test suite and the main job need, saying what
# it installs and why, one line per step. Idempotent: quick when nothing changed.
#
# Always:  torch, the CPU build (the attention oracle; from /opt/wheels when that folder
#          exists; KVPOCKET_TORCH_SPEC overrides the requirement), and the package with its
#          dev and redis extras (pytest, mypy, ruff, matplotlib for `bench --plots`, the
#          redis client).
# CuPy:    the cuda extra (about 1.6 GB installed), only with KVPOCKET_CUDA=1, or when
#          KVPOCKET_CUDA is unset and `nvidia-smi` works; KVPOCKET_CUDA=0 never installs it.
# Redis:   the redis-server system package (apt-get), only with KVPOCKET_REDIS=1; without
#          a server the Redis database test skips, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "setup-env: $*"; }
bad() { echo "scripts/setup-env.sh: error: $1" >&2; exit 2; }
PY=${PYTHON:-python3}
cuda="${KVPOCKET_CUDA-}"
redis="${KVPOCKET_REDIS:-0}"
[[ "$cuda" =~ ^(|0|1)$ ]] || bad "KVPOCKET_CUDA: expected 0 or 1 (unset: install CuPy when nvidia-smi works), got '$cuda'"
[[ "$redis" =~ ^(0|1)$ ]] || bad "KVPOCKET_REDIS: expected 0 or 1, got '$redis'"

extras=dev,redis
if [ "$cuda" = 1 ]; then
  extras+=,cuda; why_cuda="KVPOCKET_CUDA=1"
elif [ -z "$cuda" ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  extras+=,cuda; why_cuda="nvidia-smi works (KVPOCKET_CUDA=0 leaves CuPy out)"
else
  why_cuda="no CuPy: ${cuda:+KVPOCKET_CUDA=0}${cuda:-no working nvidia-smi} (KVPOCKET_CUDA=1 installs it)"
fi

if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
find_links=()
[ -d /opt/wheels ] && find_links=(--find-links /opt/wheels)
pip=(.venv/bin/python -m pip install --progress-bar off --disable-pip-version-check
     "${find_links[@]}")
# pip's lines for what it fetches and installs, as they come (a long step shows it is
# alive); its last lines are kept to show when it fails. Bash alone: this runs before the
# machine is known to have more than the shell.
pip_tail=()
pip_once() {
  local line rc=1
  pip_tail=()
  while IFS= read -r line; do
    case $line in
      __pip_rc=*) rc=${line#__pip_rc=}; continue ;;
      Collecting*|Downloading*|"Installing collected"*|"Successfully installed"*)
        echo "setup-env:   $line" ;;
    esac
    pip_tail+=("$line")
    [ "${#pip_tail[@]}" -le 25 ] || pip_tail=("${pip_tail[@]:1}")
  done < <("${pip[@]}" "$@" 2>&1; echo "__pip_rc=$?")
  return "$rc"
}
pip_failed() {
  say "pip failed; its last lines:"
  local line
  for line in "${pip_tail[@]}"; do echo "setup-env:   | $line"; done
}
pip_install() {  # a failed install shows pip's own error and is tried once more
  pip_once "$@" && return 0
  pip_failed; say "trying once more"
  pip_once "$@" && return 0
  pip_failed
  return 1
}
stamp=.venv/.kvpocket-deps
want="$(sha256sum pyproject.toml | cut -c1-16) $extras"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  say ".venv is up to date (extras $extras; $why_cuda)"
else
  SECONDS=0
  torch="${KVPOCKET_TORCH_SPEC:-torch==2.13.0}"
  say "installing $torch, the CPU build (the attention oracle; a few hundred MB, minutes the first time)"
  pip_install "$torch" || { say "$torch not found; installing the newest torch instead"; pip_install torch; }
  say "installing kvpocket in editable mode with extras [$extras] ($why_cuda)"
  pip_install -e ".[$extras]"
  echo "$want" > "$stamp"
  say "installed in ${SECONDS} s"
fi
if [ "$redis" = 1 ] && ! command -v redis-server >/dev/null 2>&1; then
  say "installing redis-server with apt-get (KVPOCKET_REDIS=1: the Redis database test)"
  (apt-get install -y -qq redis-server >/dev/null 2>&1 \
    || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq redis-server >/dev/null 2>&1)) \
    || say "note: redis-server could not be installed; the Redis database test will skip"
elif ! command -v redis-server >/dev/null 2>&1; then
  say "no redis-server (KVPOCKET_REDIS=1 installs it): the Redis database test will skip"
fi
