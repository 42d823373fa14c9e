#!/usr/bin/env bash
# On the GPU machine (called by run_on_gpu.sh with the bundle's environment): trains through the
# real service on GPUs and benchmarks, writing figures to $OUT.
#   1. the example job (tiny LLaMA, NF4, bf16) on 1 GPU and on 2 GPUs (ZeRO-2, NCCL): loss goes down
#   2. the 7B-shaped benchmark job: ours at micro-batch 1 and 4 (1 GPU) and 4 (2 GPUs), ZeRO-2
#   3. the anchors at micro-batch 4 and 1 (transformers + peft + bitsandbytes) and bf16-base LoRA
# BENCH_PARTS selects: "tiny", "confined", "preference", "ours", "anchors", "deepspeed", "dpo"
# (default: tiny ours anchors).
#   4. deepspeed: the DeepSpeed ZeRO-2 anchor on every GPU (wheels carried in .device-wheels/ds)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
parts=${BENCH_PARTS:-tiny ours anchors}
ngpu=$(nvidia-smi -L | wc -l)
bin=$QLORA_BINARY_DIR
# A work folder with the tiny model (examples/tokenizer) in $w/tiny, and a fresh local
# coordinator ($c) on GPUs $1 with more coordinator flags after it (TINY_DIR: the model's
# folder), QLORA_ADDRESS pointing at it.
tiny_coordinator() {
  local gpus=$1
  shift
  w=$(mktemp -d)
  "$bin/worker/engine/qlora-make-tiny-model" "$w/tiny" --vocab 512 --layers 2 --hidden 128 --intermediate 256 >/dev/null
  cp "$root/examples/tokenizer/"* "$w/tiny/"
  "$bin/coordinator/qlora-coordinator" --address 127.0.0.1:0 --state-dir "$w/state" --gpus "$gpus" \
    --port-file "$w/port" "${@//TINY_DIR/$w/tiny}" > "$w/c.log" 2>&1 &
  c=$!
  for _ in $(seq 100); do [ -s "$w/port" ] && break; sleep 0.1; done
  export QLORA_ADDRESS=127.0.0.1:$(cat "$w/port")
}
# The example job (tiny model, examples/qlora-tiny.yaml) through a fresh local coordinator on
# GPUs $1, with more coordinator flags after it; prints its steps and rank 0's matching log lines.
tiny_job() {
  local gpus=$1 log_lines=$2
  shift 2
  tiny_coordinator "$gpus" "$@"
  sed -e "s|BASE_MODEL_DIR|$w/tiny|" -e "s|VALIDATION_DATASET|$root/examples/data/validation.jsonl|" \
    "$root/examples/qlora-tiny.yaml" > "$w/job.yaml"
  "$bin/cli/qloractl" submit "$w/job.yaml" --dataset "$root/examples/data/train.jsonl" --follow | grep -E "step (1|20|40|60)/|SUCCEEDED|FAILED" | sort -u
  "$bin/cli/qloractl" logs job-000001 --rank 0 | grep -E "$log_lines" | tail -8
  # Generation with the trained adapter on the same GPU (a worker of its own, confined alike).
  "$bin/cli/qloractl" generate job-000001 --prompt "Name three colours." --max-new-tokens 24 -o json
  cat "$w/state/jobs/job-000001/logs/generate-1.log" 2>/dev/null | grep -E "confined|failed|denied|done" | tail -4
  kill $c; wait $c 2>/dev/null
}
if [[ $parts == *tiny* ]]; then
  for gpus in 0 $( ((ngpu > 1)) && echo 0,1 ); do
    echo "== tiny job on GPUs $gpus"
    tiny_job "$gpus" "evaluation|sample|step 60/|error|failed"
  done
fi
# confined: the example job on GPU 0 under --read-roots, its workers confined by Landlock (CUDA's
# device files, libraries and caches must stay reachable under the rules of file_confinement.h).
if [[ $parts == *confined* ]]; then
  echo "== tiny job on GPU 0, workers confined to the read roots"
  tiny_job 0 "file accesses confined|evaluation loss|error|failed|denied" --read-roots "$root/examples,TINY_DIR"
fi
# preference: a DPO job on the tiny model (NF4, bf16) through the service on GPU 0, with its
# reference forwards on the 4-bit base, then one generation from it.
if [[ $parts == *preference* ]]; then
  echo "== tiny DPO job on GPU 0"
  tiny_coordinator 0
  sed -e "s|BASE_MODEL_DIR|$w/tiny|" -e "s|epochs: 1|epochs: 8|" -e "s|learning_rate: 5.0e-6|learning_rate: 0.002|" \
    -e "s|gradient_accumulation_steps: 4|gradient_accumulation_steps: 1|" "$root/examples/preference-dpo.yaml" > "$w/job.yaml"
  "$bin/cli/qloractl" submit "$w/job.yaml" --dataset "$root/examples/data/preference_sample.jsonl" --follow | grep -E "step (1|8|16|24|32)/|SUCCEEDED|FAILED" | sort -u
  "$bin/cli/qloractl" logs job-000001 --rank 0 | grep -E "ZeRO|step 32/|error|failed" | tail -4
  "$bin/cli/qloractl" generate job-000001 --prompt "What is 12 times 12?" --max-new-tokens 8 -o json
  kill $c; wait $c 2>/dev/null
fi
if [[ $parts == *ours* || $parts == *anchors* || $parts == *deepspeed* || $parts == *dpo* ]]; then
  model=/tmp/llama7b
  [ -f $model/config.json ] || python3 "$root/bench/make_llama_folder.py" $model
  python3 "$root/bench/make_text_data.py" /tmp/bench.txt --lines 200
fi
if [[ $parts == *ours* && $parts != *ours2gpu* && $parts != *ours1gpu* ]]; then
  echo "== ours"
  "$root/bench/run_service_bench.sh" /tmp/llama7b /tmp/bench.txt 0 4 2 10
  "$root/bench/run_service_bench.sh" /tmp/llama7b /tmp/bench.txt 0 1 2 10
  ((ngpu > 1)) && "$root/bench/run_service_bench.sh" /tmp/llama7b /tmp/bench.txt 0,1 4 2 10
fi
if [[ $parts == *anchors* ]]; then
  echo "== anchors"
  python3 "$root/bench/anchor_hf.py" /tmp/llama7b --micro-batch 4
  python3 "$root/bench/anchor_hf.py" /tmp/llama7b --micro-batch 1
  python3 "$root/bench/anchor_hf.py" /tmp/llama7b --micro-batch 4 --bf16-base
fi
# dpo: a DPO step against an SFT step on the same tokens (7B shape, 8 rows of 1,024 tokens: 4
# pairs of 1,024 + 1,024, or 8 text rows), checkpointing on.
if [[ $parts == *dpo* ]]; then
  python3 "$root/bench/make_text_data.py" /tmp/pairs.jsonl --lines 200 --pairs 170,170
  echo "== ours: sft, 8 rows of 1024"
  # 15 steps: 2 warm-up, 3 windows of 4, the last step outside every window.
  dpo_bench() { BENCH_SEQ=1024 BENCH_WARMUP=2 BENCH_WINDOWS=3 BENCH_WINDOW_STEPS=4 "$root/bench/run_service_bench.sh" "$@"; }
  BENCH_LABEL=sft dpo_bench /tmp/llama7b /tmp/bench.txt 0 8 2 15
  echo "== ours: dpo, 4 pairs of 1024 + 1024"
  BENCH_LABEL=dpo BENCH_PREFERENCE=dpo dpo_bench /tmp/llama7b /tmp/pairs.jsonl 0 4 2 15
  echo "== ours: orpo, 4 pairs of 1024 + 1024"
  BENCH_LABEL=orpo BENCH_PREFERENCE=orpo dpo_bench /tmp/llama7b /tmp/pairs.jsonl 0 4 2 15
fi
if [[ $parts == *ours1gpu* ]]; then
  "$root/bench/run_service_bench.sh" /tmp/llama7b /tmp/bench.txt 0 1 2 10
  "$root/bench/run_service_bench.sh" /tmp/llama7b /tmp/bench.txt 0 4 2 10
fi
if [[ $parts == *ours2gpu* ]] && ((ngpu > 1)); then
  "$root/bench/run_service_bench.sh" /tmp/llama7b /tmp/bench.txt 0,1 4 2 10
fi
if [[ $parts == *deepspeed* ]] && ((ngpu > 1)); then
  echo "== deepspeed anchor"
  python3 -m pip install -q --no-index --no-deps --target /tmp/dssite "$root"/.device-wheels/ds/*.whl
  PYTHONPATH=/tmp/dssite:$PYTHONPATH PATH=/tmp/dssite/bin:$PATH DS_BUILD_OPS=0 \
    torchrun --nproc_per_node "$ngpu" "$root/bench/anchor_deepspeed.py" /tmp/llama7b --micro-batch 4 2>&1 \
    | grep -vE "Loading|^\s*$" | tail -15
fi
