#!/usr/bin/env bash
# Runs the benchmark job through the real service (coordinator + qloractl) on GPUs and prints
# the figures (tokens/s per GPU, step time, peak memory, MFU) as JSON and a table.
#   bench/run_service_bench.sh MODEL_DIR DATA.txt GPUS(e.g. 0 or 0,1) MICRO_BATCH STAGE STEPS
# Binaries from $QLORA_BINARY_DIR (default build/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${QLORA_BINARY_DIR:-$root/build}
model=$1 data=$2 gpus=$3 mb=$4 stage=$5 steps=$6
work=$(mktemp -d /tmp/qlora-bench-XXXXXX)
sed -e "s|MODEL_DIR|$model|; s|STAGE|$stage|; s|MICRO_BATCH|$mb|; s|STEPS|$steps|" "$root/bench/bench_job.yaml" > "$work/job.yaml"
"$bin/coordinator/qlora-coordinator" --address 127.0.0.1:0 --state-dir "$work/state" --gpus "$gpus" \
  --port-file "$work/port" > "$work/coordinator.log" 2>&1 &
coordinator=$!
trap 'kill $coordinator 2>/dev/null; wait $coordinator 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
export QLORA_ADDRESS=127.0.0.1:$(cat "$work/port")
"$bin/cli/qloractl" submit "$work/job.yaml" --dataset "$data" --name bench > /dev/null
"$bin/cli/qloractl" watch job-000001 -o json > "$work/events.jsonl" || {
  "$bin/cli/qloractl" logs job-000001 | tail -30; exit 1; }
python3 "$root/bench/summarize.py" "$work/events.jsonl" --gpus "$gpus" --micro-batch "$mb" --stage "$stage"
