#!/usr/bin/env bash
# Runs kvpocket against SGLang's real KV cache bookkeeping (issue 34).
#
#   scripts/sglang.sh [fuzz options]     kvpocket fuzz --target sglang [fuzz options]
#   scripts/sglang.sh --tests [pytest]   the SGLang target tests, for real
#   scripts/sglang.sh --setup            only create the environment
#
# SGLang gets its own virtualenv outside the checkout (2.7 GB), created once and cached by
# a stamp. sglang's metadata pins a CUDA torch stack, so pip cannot resolve it on a CPU
# machine: the local CPU torch wheel goes first, then sglang with --no-deps, then only the
# packages its memory-cache modules import (docs/targets/sglang.md, "Install").
# kvpocket itself is not installed there: it runs from this checkout through .devpath,
# so one environment serves every checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${KVPOCKET_SGLANG_VERSION:-0.5.23}
torch_spec=${KVPOCKET_SGLANG_TORCH_SPEC:-torch==2.13.0}
venv=${KVPOCKET_SGLANG_VENV:-$HOME/.cache/kvpocket/sglang-$version}
PY=${PYTHON:-python3.11}
find_links=()
[ -d /opt/wheels ] && find_links=(--find-links /opt/wheels)
pip() { "$venv/bin/python" -m pip -q --disable-pip-version-check "$@"; }

# installed with their dependencies (none of them pulls torch)
deps=(numpy pyyaml pillow starlette msgspec pydantic pyzmq tqdm ipython aiohttp transformers
      dill apache-tvm-ffi openai==2.8.0 triton
      "hypothesis>=6.100,<7" "z3-solver>=4.12" "rich>=13" "pytest>=8")
# installed without: their own requirements would pull a CUDA torch or are not imported
nodeps=(sentencepiece compressed-tensors einops easydict distro interegular partial_json_parser
        python-multipart setproctitle xxhash zstandard uvloop prometheus-client python-dateutil
        six fastapi uvicorn blobfile gguf tiktoken nvidia-ml-py psutil orjson pybase64 requests
        urllib3 charset-normalizer idna certifi loguru)

stamp="$venv/.kvpocket-sglang"
want="sglang==$version $torch_spec ${deps[*]} ${nodeps[*]}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "scripts/sglang.sh: installing sglang==$version into $venv (once; several minutes)" >&2
  [ -x "$venv/bin/python" ] || { mkdir -p "$(dirname "$venv")"; "$PY" -m venv "$venv"; }
  pip install "${find_links[@]}" "$torch_spec"
  pip install "${find_links[@]}" "$torch_spec" "${deps[@]}"
  pip install --no-deps "sglang==$version" "${nodeps[@]}"
  echo "$want" > "$stamp"
fi
export PYTHONPATH="$PWD/.devpath${PYTHONPATH:+:$PYTHONPATH}"
case "${1:-}" in
  --setup) exit 0 ;;
  --tests) shift; exec "$venv/bin/python" -m pytest -q -p no:cacheprovider \
             tests/targets/test_sglang_target.py "$@" ;;
  *) exec "$venv/bin/python" -m kvpocket.verify.cli fuzz --target sglang "$@" ;;
esac
