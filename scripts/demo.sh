#!/usr/bin/env bash
# The demo: sets up (once per machine), builds, makes a tiny LLaMA model (DEMO_MODEL_TYPE=mistral
# or qwen2: a tiny Mistral with a 64-token attention window, or a tiny Qwen2) with the example
# tokenizer, starts a local coordinator on a free port (CPU workers when there is no GPU), and
# runs the example job (examples/qlora-tiny.yaml on examples/data) to the end with
# `qloractl submit --follow`. Prints where the PEFT adapter, the TensorBoard logs and the metrics are.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
"$root/scripts/build.sh" qlora-coordinator qlora-worker qloractl qlora-make-tiny-model
out=${DEMO_DIR:-$root/out/demo}
rm -rf "$out" && mkdir -p "$out"
model_type=${DEMO_MODEL_TYPE:-llama}
family=()
case "$model_type" in
  mistral) family=(--sliding_window 64) ;;
  qwen2) family=(--tie_embeddings --rope_theta 1000000) ;;
esac
model="$out/tiny-$model_type"
"$build/worker/engine/qlora-make-tiny-model" "$model" --model_type "$model_type" "${family[@]}" \
  --flagfile="$root/examples/tiny-model.flags" >/dev/null
cp "$root/examples/tokenizer/"* "$model/"
sed -e "s|BASE_MODEL_DIR|$model|" -e "s|VALIDATION_DATASET|$root/examples/data/validation.jsonl|" \
  "$root/examples/qlora-tiny.yaml" > "$out/job.yaml"

workers=(--cpu-workers 2)
if [ -d /proc/driver/nvidia/gpus ] && [ -n "$(ls /proc/driver/nvidia/gpus 2>/dev/null)" ]; then workers=(--gpus auto); fi
"$build/coordinator/qlora-coordinator" --address 127.0.0.1:0 --state-dir "$out/state" \
  --port-file "$out/port" --metrics-address 127.0.0.1:0 --metrics-port-file "$out/metrics-port" \
  "${workers[@]}" > "$out/coordinator.log" 2>&1 &
coordinator=$!
trap 'kill $coordinator 2>/dev/null; wait $coordinator 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$out/port" ] && break; sleep 0.1; done
export QLORA_ADDRESS=127.0.0.1:$(cat "$out/port")
for _ in $(seq 100); do [ -s "$out/metrics-port" ] && break; sleep 0.1; done
echo "coordinator on $QLORA_ADDRESS (state in $out/state)"
echo "status page: http://127.0.0.1:$(cat "$out/metrics-port")/   (Prometheus: /metrics)"
"$build/cli/qloractl" submit "$out/job.yaml" --dataset "$root/examples/data/train.jsonl" --name demo --follow
"$build/cli/qloractl" get job-000001   # a fresh state folder: the demo's job is the first
output="$out/state/jobs/job-000001/output"
echo "TensorBoard logs: $output/runs   (tensorboard --logdir $out/state/jobs)"
echo "per-step metrics: $output/metrics.jsonl"
