#!/usr/bin/env bash
# The test command: sets up (once per machine), builds, and runs the whole suite with ctest.
#   scripts/test.sh [ctest args...]       e.g. scripts/test.sh -R Config
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
eval "$("$root/scripts/setup.sh" | grep -E '^(LIBTORCH|PYENV)=')"
build=${BUILD_DIR:-$root/build}
# What the tests need to find: the sources, the built binaries, the reference Python.
export QLORA_SOURCE_DIR=$root QLORA_BINARY_DIR=$build QLORA_PYTHON=$PYENV/bin/python
# --timeout: the ceiling for any test without its own TIMEOUT property.
ctest --test-dir "$build" --output-on-failure --timeout 900 -j "${QLORA_TEST_JOBS:-2}" "$@"
