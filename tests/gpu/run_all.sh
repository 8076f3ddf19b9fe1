#!/usr/bin/env bash
# Every GPU check of hasten in one command (tests/gpu/README.md):
#
#   bash tests/gpu/run_all.sh [--wheels DIR] [OUT_DIR] [gpu_checks.py options]   # on one CUDA GPU, <= 8 minutes
#   bash tests/gpu/run_all.sh --dry-run [OUT_DIR]                                # anywhere, on the CPU
#   bash tests/gpu/run_all.sh --fetch-wheels [DIR]      # here, with network: the optional packages as wheels
#                                                       # for the GPU machine (python 3.12, x86-64), into .whl
#
# hasten runs from this checkout (PYTHONPATH=src), never from an installed copy: nothing is built or installed
# for it. --wheels DIR installs DIR/*.whl (no index, no dependencies) into a scratch folder put first on
# PYTHONPATH, for a machine without network. The summaries go to OUT_DIR, else $OUT, else ./gpu-checks-out.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# The optional packages the checks use, pinned to versions that work with the GPU machine's torch 2.11:
# torchao 0.18 needs torch >= 2.11; deepspeed publishes a source archive only, so its wheel is built here.
WHEELS="torchao==0.18.0 bitsandbytes==0.50.2 crc32c==2.9.post0 hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5
annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0"
DEEPSPEED="deepspeed==0.19.8"

pick_python() {
  if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"
  elif [[ -x "$ROOT/.venv/bin/python" ]]; then echo "$ROOT/.venv/bin/python"
  else echo python3; fi
}
PY="$(pick_python)"

if [[ "${1:-}" == "--fetch-wheels" ]]; then
  DIR="${2:-$ROOT/.whl}"
  mkdir -p "$DIR"
  grep -qx '/.whl/' "$ROOT/.git/info/exclude" 2>/dev/null || { mkdir -p "$ROOT/.git/info"; echo /.whl/ >> "$ROOT/.git/info/exclude"; }
  for spec in $WHEELS; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DIR" "$spec"
  done
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" "$DEEPSPEED"  # ops JIT-built there
  du -sh "$DIR"; ls "$DIR"
  exit 0
fi

ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --wheels) WHEEL_DIR="$2"; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

EXTRA_PATH=""
if [[ -n "${WHEEL_DIR:-}" ]]; then
  SITE="$(mktemp -d /tmp/hasten-gpu-site.XXXXXX)"
  shopt -s nullglob
  wheels=("$WHEEL_DIR"/*.whl)
  if (( ${#wheels[@]} )); then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" \
      || echo "warning: the wheels in $WHEEL_DIR did not all install; checks that need them are skipped" >&2
  else
    echo "warning: no wheel in $WHEEL_DIR" >&2
  fi
  EXTRA_PATH="$SITE:"
fi

export PYTHONPATH="$ROOT/src:${EXTRA_PATH}${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
exec "$PY" "$ROOT/tests/gpu/gpu_checks.py" "${ARGS[@]+"${ARGS[@]}"}"
