#!/usr/bin/env bash
# Configures and builds the project into ${BUILD_DIR:-build} against the cached LibTorch and
# Arrow/Parquet C++ (QLORA_ARROW_ROOT, read by cmake/Dependencies.cmake at every configure).
# Runs scripts/setup.sh first (quick when everything is already installed).
#   scripts/build.sh [ninja targets...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
eval "$("$root/scripts/setup.sh" | grep -E '^(LIBTORCH|PYENV|ARROW)=')"
export QLORA_ARROW_ROOT=${QLORA_ARROW_ROOT:-$ARROW}
build=${BUILD_DIR:-$root/build}
jobs=${QLORA_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-${QLORA_CACHE:-$HOME/.cache/qlora}/ccache}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-20G}
# Hits across clones (CI builds in a fresh clone of the same machine).
export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=true
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE="${QLORA_BUILD_TYPE:-Release}" \
    -DCMAKE_PREFIX_PATH="$LIBTORCH/share/cmake" \
    -DQLORA_PYTHON="$PYENV/bin/python" ${QLORA_CMAKE_ARGS:-}
fi
cmake --build "$build" -j "$jobs" ${1:+--target "$@"}
