#!/usr/bin/env bash
# On the GPU machine (run_on_gpu.sh restart): a 2-GPU job (tiny LLaMA, NF4, ZeRO-2 over NCCL)
# whose rank 1 is SIGKILLed mid-run must restart by itself from its last checkpoint and finish.
# Prints the time from the kill to the first optimizer step after the restart (what a user
# loses to a failure besides the steps since the checkpoint), and the job's restart record.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$QLORA_BINARY_DIR
w=$(mktemp -d)
"$bin/worker/engine/qlora-make-tiny-model" "$w/tiny" --vocab 512 --layers 2 --hidden 128 --intermediate 256 >/dev/null
cp "$root/examples/tokenizer/"* "$w/tiny/"
sed -e "s|BASE_MODEL_DIR|$w/tiny|" -e "s|VALIDATION_DATASET|$root/examples/data/validation.jsonl|" \
    -e "s|train_steps: 60|train_steps: 400\n  steps_per_checkpoint: 50|" -e "s|eval_steps: 20|eval_steps: 0|" \
    "$root/examples/qlora-tiny.yaml" > "$w/job.yaml"
"$bin/coordinator/qlora-coordinator" --address 127.0.0.1:0 --state-dir "$w/state" --gpus 0,1 \
    --restart-backoff-s 1 --port-file "$w/port" > "$w/c.log" 2>&1 &
c=$!
for _ in $(seq 100); do [ -s "$w/port" ] && break; sleep 0.1; done
export QLORA_ADDRESS=127.0.0.1:$(cat "$w/port")
ctl="$bin/cli/qloractl"
id=$("$ctl" submit "$w/job.yaml" --dataset "$root/examples/data/train.jsonl")
field() { "$ctl" get "$id" -o json | python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }
echo "== restart on 2 GPUs: $id"
for _ in $(seq 600); do
  [ "$(field "(j.get('progress') or [{}])[0].get('step', 0)")" -ge 60 ] 2>/dev/null && break; sleep 0.2
done
victim=$(pgrep -f -- "--job $id --rank 1 " | head -1)
killed_at=$(date +%s.%N)
kill -9 "$victim" && echo "killed rank 1 (pid $victim) at step $(field "j['progress'][0]['step']")"
first_step_at=""
for _ in $(seq 1200); do
  state=$(field "j.get('state','')")
  if [ "$(field "j.get('restarts', 0)")" = 1 ] && [ "$state" = JOB_STATE_RUNNING ] &&
     [ "$(field "(j.get('progress') or [{}])[0].get('step', 0)")" -gt 0 ] 2>/dev/null; then
    first_step_at=$(date +%s.%N); break
  fi
  case $state in JOB_STATE_FAILED|JOB_STATE_SUCCEEDED|JOB_STATE_CANCELLED) break ;; esac
  sleep 0.1
done
[ -n "$first_step_at" ] && python3 -c "print(f'failure to first step after restart: {$first_step_at - $killed_at:.1f} s (backoff 1 s included)')"
"$ctl" watch "$id" > /dev/null
"$ctl" get "$id" | grep -E "state|restarts|adapter"
"$ctl" logs "$id" --rank 0 | grep -E "resumed from|checkpoint .*step-|done" | tail -4
kill $c; wait $c 2>/dev/null
