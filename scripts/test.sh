#!/usr/bin/env bash
# The test command: sets up (once per machine), builds, and runs the whole suite with ctest,
# then the sanitizer build's tests and the fuzz targets (scripts/fuzz_and_sanitize.sh).
#   scripts/test.sh [ctest args...]       e.g. scripts/test.sh -R Config
#   QLORA_SKIP_FUZZ_AND_SANITIZE=1 scripts/test.sh -R Config   # quick local run: the suite only
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
eval "$("$root/scripts/setup.sh" | grep -E '^(LIBTORCH|PYENV|RAYENV|MLFLOWENV|LLAMACPP)=')"
build=${BUILD_DIR:-$root/build}
# What the tests need to find: the sources, the built binaries, the reference Python, and the
# environments with Ray for the multi-host tests and with MLflow for the tracking tests.
export QLORA_SOURCE_DIR=$root QLORA_BINARY_DIR=$build QLORA_PYTHON=$PYENV/bin/python QLORA_RAYENV=$RAYENV
export QLORA_MLFLOW_PYTHON=$MLFLOWENV/bin/python QLORA_LLAMACPP_CONVERTER=$LLAMACPP
# --timeout: the ceiling for any test without its own TIMEOUT property.
ctest --test-dir "$build" --output-on-failure --timeout 900 -j "${QLORA_TEST_JOBS:-2}" "$@"
[ "${QLORA_SKIP_FUZZ_AND_SANITIZE:-0}" = 1 ] || "$root/scripts/fuzz_and_sanitize.sh"
