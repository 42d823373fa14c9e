#!/usr/bin/env bash
# Runs the benchmark job through the real service (coordinator + qloractl) on GPUs and prints
# the figures (tokens/s per GPU over windows of steps, step time, peak memory, MFU) as JSON and a
# table (bench/summarize.py says how they are measured).
#   bench/run_service_bench.sh MODEL_DIR DATA.txt GPUS(e.g. 0 or 0,1) MICRO_BATCH STAGE STEPS
# STEPS is the job's length; the knobs below default to the older figure (2 warm-up steps, one
# window of the rest):
#   BENCH_WARMUP=3 BENCH_WINDOWS=3 BENCH_WINDOW_STEPS=5   the measurement (STEPS must cover it)
#   BENCH_CHECKPOINTING=false                             activation checkpointing off (or auto)
#   BENCH_MAX_MEMORY_GIB=24                               auto's budget (trainer.max_memory_gib)
#   BENCH_OFFLOAD_LAYERS=8                                trainer.offload_activation_layers
#   BENCH_MAX_HOST_MEMORY_GIB=100                         trainer.max_host_memory_gib (with
#                                                         BENCH_OFFLOAD_LAYERS=auto)
#   BENCH_DEQUANTIZED_LAYERS=auto                         trainer.dequantized_weight_layers
#   BENCH_OFFLOAD_PARAM=cpu                               zero_optimization.offload_param: base
#                                                         weights in host memory
#   BENCH_OFFLOAD_OPTIMIZER=cpu                           zero_optimization.offload_optimizer: the
#                                                         AdamW moments in host memory (the label
#                                                         gains "-offopt")
#   BENCH_FLOAT8=1                                        quantization.float8_base_forward: true
#                                                         (the label gains "-fp8")
#   BENCH_EVAL_STEPS=25                                   evaluate every 25 steps on 5 % held out
#   BENCH_SEQ=2048                                        the sequence length
#   BENCH_PACKING=true                                    packed rows (data.packing; the rate then
#                                                         counts non-padding tokens, summarize.py)
#   BENCH_PREFERENCE=dpo                                  preference tuning (dpo or orpo) on the
#                                                         pairs of DATA.jsonl (make_text_data.py
#                                                         --pairs); MICRO_BATCH counts pairs
#   BENCH_PROFILE_STEPS=FIRST:COUNT BENCH_PROFILE_OUT=F   a trace of rank 0 (worker/run/step_profiler.h)
#   BENCH_PROFILE_MEMORY=1             with the allocator's [memory] events (bench/memory_peak.py)
#   BENCH_KEEP=DIR                                        keep the job's logs, events and job file there
#   BENCH_LABEL=ours                                      the name in the JSON and the table
#   BENCH_RAY_ADDRESS=http://HOST:8265                    the workers through the Ray launcher
#   BENCH_RAY_LAUNCHER=PATH                               its driver (deploy/ray/qlora_ray_launcher.py)
# Binaries from $QLORA_BINARY_DIR (default build/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${QLORA_BINARY_DIR:-$root/build}
model=$1 data=$2 gpus=$3 mb=$4 stage=$5 steps=$6
warmup=${BENCH_WARMUP:-2} windows=${BENCH_WINDOWS:-1} window_steps=${BENCH_WINDOW_STEPS:-$((steps - ${BENCH_WARMUP:-2}))}
checkpointing=${BENCH_CHECKPOINTING:-true} seq_len=${BENCH_SEQ:-2048} packing=${BENCH_PACKING:-false}
work=$(mktemp -d /tmp/qlora-bench-XXXXXX)
sed -e "s|MODEL_DIR|$model|; s|STAGE|$stage|; s|MICRO_BATCH|$mb|; s|STEPS|$steps|; s|CHECKPOINTING|$checkpointing|; s|SEQ|$seq_len|; s|PACKING|$packing|" \
  "$root/bench/bench_job.yaml" > "$work/job.yaml"
if [ -n "${BENCH_PREFERENCE:-}" ]; then  # TRL's prompt/chosen/rejected columns, JSON Lines
  sed -i -e "s|^  type: finetune|  type: $BENCH_PREFERENCE|" -e '/^input_features:/d' -e '/^output_features:/d' \
    -e "s|data: {format: text, |data: {|" "$work/job.yaml"
fi
if [ -n "${BENCH_FLOAT8:-}" ]; then
  sed -i "s|bnb_4bit_compute_dtype: bfloat16}|bnb_4bit_compute_dtype: bfloat16, float8_base_forward: true}|" "$work/job.yaml"
fi
if [ -n "${BENCH_EVAL_STEPS:-}" ]; then
  sed -i -e "s|^  enable_gradient_checkpointing: .*|&\n  eval_steps: $BENCH_EVAL_STEPS|" \
    -e "s|^data: {format: text,|data: {format: text, validation_fraction: 0.05,|" "$work/job.yaml"
fi
if [ -n "${BENCH_MAX_MEMORY_GIB:-}" ]; then
  sed -i "s|^  enable_gradient_checkpointing: .*|&\n  max_memory_gib: $BENCH_MAX_MEMORY_GIB|" "$work/job.yaml"
fi
if [ -n "${BENCH_OFFLOAD_LAYERS:-}" ]; then
  sed -i "s|^  enable_gradient_checkpointing: .*|&\n  offload_activation_layers: $BENCH_OFFLOAD_LAYERS|" "$work/job.yaml"
fi
if [ -n "${BENCH_MAX_HOST_MEMORY_GIB:-}" ]; then
  sed -i "s|^  enable_gradient_checkpointing: .*|&\n  max_host_memory_gib: $BENCH_MAX_HOST_MEMORY_GIB|" "$work/job.yaml"
fi
if [ -n "${BENCH_DEQUANTIZED_LAYERS:-}" ]; then
  sed -i "s|^  enable_gradient_checkpointing: .*|&\n  dequantized_weight_layers: $BENCH_DEQUANTIZED_LAYERS|" "$work/job.yaml"
fi
if [ -n "${BENCH_OFFLOAD_PARAM:-}" ]; then
  sed -i "s|zero_optimization: {stage: $stage}|zero_optimization: {stage: $stage, offload_param: {device: $BENCH_OFFLOAD_PARAM}}|" "$work/job.yaml"
fi
if [ -n "${BENCH_OFFLOAD_OPTIMIZER:-}" ]; then
  sed -i "s|zero_optimization: {stage: $stage|&, offload_optimizer: {device: $BENCH_OFFLOAD_OPTIMIZER}|" "$work/job.yaml"
fi
ray_flags=()
if [ -n "${BENCH_RAY_ADDRESS:-}" ]; then
  workers=$(echo "$gpus" | tr ',' '\n' | wc -l)
  sed -i -e "s|  type: local.*|  type: ray|" -e "s|    use_gpu: true|    use_gpu: true\n    num_workers: $workers|" "$work/job.yaml"
  ray_flags=(--ray-address "$BENCH_RAY_ADDRESS" --advertise-address 127.0.0.1:0 --ray-launcher-script "$BENCH_RAY_LAUNCHER")
fi
profile_env=()
if [ -n "${BENCH_PROFILE_STEPS:-}" ]; then
  profile_env=(QLORA_PROFILE_STEPS="$BENCH_PROFILE_STEPS" QLORA_PROFILE_OUT="$BENCH_PROFILE_OUT"
               QLORA_PROFILE_MEMORY="${BENCH_PROFILE_MEMORY:-}")
fi
# The workers inherit the coordinator's environment (the profiler's settings with it).
env "${profile_env[@]}" "$bin/coordinator/qlora-coordinator" --address 127.0.0.1:0 --state-dir "$work/state" \
  --gpus "$gpus" --port-file "$work/port" "${ray_flags[@]}" > "$work/coordinator.log" 2>&1 &
coordinator=$!
keep() {
  [ -n "${BENCH_KEEP:-}" ] || return 0
  mkdir -p "$BENCH_KEEP"
  cp "$work/job.yaml" "$work/coordinator.log" "$BENCH_KEEP/" 2>/dev/null || true
  [ -f "$work/events.jsonl" ] && cp "$work/events.jsonl" "$BENCH_KEEP/"
  find "$work/state" -path '*/logs/*.log' -exec cp {} "$BENCH_KEEP/" \; 2>/dev/null || true
}
trap 'kill $coordinator 2>/dev/null; wait $coordinator 2>/dev/null || true; keep; rm -rf "$work"' EXIT
trap 'exit 143' TERM INT  # so that a stopped run still keeps its logs
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
export QLORA_ADDRESS=127.0.0.1:$(cat "$work/port")
"$bin/cli/qloractl" submit "$work/job.yaml" --dataset "$data" --name bench > /dev/null
"$bin/cli/qloractl" watch job-000001 -o json > "$work/events.jsonl" || {
  "$bin/cli/qloractl" logs job-000001 | tail -30; exit 1; }
if ! grep -q JOB_STATE_SUCCEEDED "$work/events.jsonl"; then
  echo "the job did not succeed:" >&2
  "$bin/cli/qloractl" logs job-000001 | tail -30 >&2
fi
python3 "$root/bench/summarize.py" "$work/events.jsonl" --gpus "$gpus" --micro-batch "$mb" --stage "$stage" \
  --model "$model" --seq "$seq_len" --checkpointing "$checkpointing" --max-memory-gib "${BENCH_MAX_MEMORY_GIB:-}" \
  --offloaded-layers "${BENCH_OFFLOAD_LAYERS:-0}" --dequantized-layers "${BENCH_DEQUANTIZED_LAYERS:-}" \
  --warmup "$warmup" --windows "$windows" \
  --window-steps "$window_steps" --packing "$packing" --label "${BENCH_LABEL:-ours}${BENCH_OFFLOAD_OPTIMIZER:+-offopt}${BENCH_FLOAT8:+-fp8}" \
  --float8 "${BENCH_FLOAT8:-0}" \
  --rows-per-example "$([ -n "${BENCH_PREFERENCE:-}" ] && echo 2 || echo 1)"
