#!/usr/bin/env bash
# The sanitizer and fuzzing check; CI runs it after the main suite (scripts/test.sh).
#  1. Builds the torch-free part (proto, common/, the data path, coordinator, qloractl, their
#     tests, the fuzz targets) with clang, AddressSanitizer + UndefinedBehaviorSanitizer and
#     libFuzzer coverage, in its own folder ($QLORA_SANITIZE_BUILD_DIR, default
#     build-sanitize; ccache as scripts/build.sh), and runs those tests with ctest.
#  2. Runs every fuzz target of tests/fuzz for QLORA_FUZZ_SECONDS (60) seconds or
#     QLORA_FUZZ_RUNS (1,000,000) inputs, whichever comes first, QLORA_FUZZ_JOBS (nproc) at a
#     time, each over a COPY of its seed corpus tests/fuzz/corpus/<target> (new inputs never
#     land in the committed folder). A crash, leak, sanitizer report, timeout or out-of-memory
#     fails the script; the input is left in <build>/fuzz/<target>/ (crash-*, leak-*, ...).
#
#   scripts/fuzz_and_sanitize.sh                         # what CI runs
#   QLORA_FUZZ_SECONDS=3600 scripts/fuzz_and_sanitize.sh # longer: an hour per target
#   QLORA_FUZZ_TARGETS="job_config_fuzzer" QLORA_FUZZ_RUNS=0 QLORA_SKIP_SANITIZER_TESTS=1 \
#     scripts/fuzz_and_sanitize.sh                       # one target, runs unbounded, no tests
# QLORA_FUZZ_SEED (default 1) fixes libFuzzer's random seed, so that CI replays the same
# mutations each time and a finding is reproducible; QLORA_FUZZ_SEED=0 lets libFuzzer pick one
# (longer exploratory runs). QLORA_FUZZ_RUNS=0 means no run limit. QLORA_SKIP_FUZZ=1 skips step 2,
# QLORA_SKIP_SANITIZER_TESTS=1 skips the tests of step 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${QLORA_SANITIZE_BUILD_DIR:-$root/build-sanitize}
seconds=${QLORA_FUZZ_SECONDS:-60}
seed=${QLORA_FUZZ_SEED:-1}
runs=${QLORA_FUZZ_RUNS:-1000000}
jobs=${QLORA_FUZZ_JOBS:-$(nproc)}
targets=${QLORA_FUZZ_TARGETS:-"job_config_fuzzer safetensors_header_fuzzer record_reader_fuzzer
  tokenizer_json_fuzzer tokenizer_encode_fuzzer chat_template_fuzzer rpc_handlers_fuzzer
  http_request_fuzzer"}

# Sanitizer settings for the tests and the fuzz targets (and every process they start):
#  - abort_on_error: a report kills the process with SIGABRT, so a report in a child process
#    (qloractl, the coordinator under tests/cli) is an abnormal end, never an exit status
#    that a test could mistake for one of the program's own;
#  - LeakSanitizer suppressions for the uninstrumented Debian libraries' process-lifetime
#    allocations (tests/sanitizers/lsan.supp says which and why).
symbolizer=$(command -v llvm-symbolizer || true)
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:strict_string_checks=1\
${symbolizer:+:external_symbolizer_path=$symbolizer}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0"

echo "fuzz_and_sanitize: building the sanitizer build in $build"
start=$SECONDS
CC=clang CXX=clang++ BUILD_DIR=$build QLORA_BUILD_TYPE=Release QLORA_CMAKE_ARGS="\
-DQLORA_TORCH_FREE_ONLY=ON -DQLORA_SANITIZE=address,undefined -DQLORA_FUZZ=ON" \
  "$root/scripts/build.sh"
echo "fuzz_and_sanitize: built in $((SECONDS - start)) s"

if [ "${QLORA_SKIP_SANITIZER_TESTS:-0}" != 1 ]; then
  start=$SECONDS
  eval "$("$root/scripts/setup.sh" | grep -E '^PYENV=')"
  export QLORA_SOURCE_DIR=$root QLORA_BINARY_DIR=$build QLORA_PYTHON=$PYENV/bin/python
  # Left to the main suite: DataSpmIsolationTest links libprotobuf beside SentencePiece on
  # purpose, which needs RTLD_DEEPBIND, which ASan refuses (worker/data/spm_model.cc);
  # DataLoaderTest.StreamingMemory... bounds the peak RSS, which ASan's shadow memory and
  # quarantine inflate; LayeringTest reads sources only.
  ctest --test-dir "$build" --output-on-failure --timeout 900 -j "${QLORA_TEST_JOBS:-2}" \
    -E '^(DataSpmIsolationTest\.|DataLoaderTest\.StreamingMemoryStaysFlat|LayeringTest\.)'
  echo "fuzz_and_sanitize: sanitizer tests passed in $((SECONDS - start)) s"
fi

[ "${QLORA_SKIP_FUZZ:-0}" = 1 ] && exit 0
# One target: a fresh copy of its corpus, then libFuzzer; its output goes to <build>/fuzz/<t>.log
# and its exit status to <build>/fuzz/<t>.rc.
fuzz_one() {
  local t=$1 out=$build/fuzz/$1 rc=0
  rm -rf "$out" && mkdir -p "$out/corpus"
  cp -R "$root/tests/fuzz/corpus/$t/." "$out/corpus/"
  local dict=()
  [ -f "$root/tests/fuzz/dict/$t.dict" ] && dict=(-dict="$root/tests/fuzz/dict/$t.dict")
  "$build/tests/fuzz/$t" "$out/corpus" "${dict[@]}" -max_total_time="$seconds" -runs="$runs" \
    -seed="$seed" -timeout=30 -rss_limit_mb=2560 -malloc_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$out/" > "$build/fuzz/$t.log" 2>&1 || rc=$?
  echo "$rc" > "$build/fuzz/$t.rc"
}
mkdir -p "$build/fuzz"
[ "$runs" = 0 ] && runs=-1
start=$SECONDS
for t in $targets; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  rm -f "$build/fuzz/$t.rc"
  fuzz_one "$t" &
done
wait
failed=()
for t in $targets; do
  if [ "$(cat "$build/fuzz/$t.rc" 2>/dev/null)" = 0 ]; then
    stats=$(grep -E '^stat::(number_of_executed_units|new_units_added)' "$build/fuzz/$t.log")
    echo "fuzz_and_sanitize: $t: $(echo "$stats" | tr -s ' \n' ' ')"
  else
    failed+=("$t")
    echo "fuzz_and_sanitize: $t FAILED; the last lines of $build/fuzz/$t.log:"
    tail -n 60 "$build/fuzz/$t.log"
    ls "$build/fuzz/$t" | grep -vx corpus | sed 's/^/  input kept: /' || true
  fi
done
echo "fuzz_and_sanitize: fuzzing took $((SECONDS - start)) s"
if ((${#failed[@]})); then
  echo "fuzz_and_sanitize: failed: ${failed[*]}" >&2
  exit 1
fi
