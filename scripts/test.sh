#!/usr/bin/env bash
# The test command: sets up (once per machine), builds, and runs the whole suite with ctest.
#   scripts/test.sh [ctest args...]       e.g. scripts/test.sh -R Config
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
ctest --test-dir "${BUILD_DIR:-$root/build}" --output-on-failure -j "${QLORA_TEST_JOBS:-2}" "$@"
