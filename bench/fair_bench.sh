#!/usr/bin/env bash
# The fair benchmark (issue 13, "Fair anchors first" and "Profile, then attribute") in one run on
# the 2-GPU machine: `scripts/device/run_on_gpu.sh bench-fair` calls this with the bundle's
# environment (binaries in $QLORA_BINARY_DIR, .device-wheels/site on PYTHONPATH). Parts, in order
# of importance (BENCH_FAIR_PARTS picks and orders them):
#   ours-mb4         ours, 1 GPU, micro-batch 4, then a profile of 2 more steps (Kineto trace)
#   attr-ours        the attribution of that trace (bench/attribute_profile.py)
#   liger            HF + peft + bnb + autocast + Liger: mb 4 (then profiled), mb 1, mb 4 without
#                    checkpointing, in one process
#   hf               HF + peft + bnb + autocast: mb 4, mb 1, in one process
#   ours-mb1         ours, 1 GPU, micro-batch 1
#   ours-2gpu        ours, 2 GPUs, ZeRO-2, micro-batch 4
#   deepspeed        DeepSpeed ZeRO-2 + HF + peft + bnb + autocast + Liger, 2 GPUs, micro-batch 4
#   ours-mb4-nockpt  ours, 1 GPU, micro-batch 4, no activation checkpointing, then a profile
#   attr-ours-nockpt the attribution of that trace
#   attr-liger       the attribution of the Liger anchor's trace
#   mem-ours         (optional) ours at micro-batch 4 profiled with the allocator's events, and
#                    where its memory peaks: memory-peak-ours-mb4.md (bench/memory_peak.py);
#                    mem-ours-mbN at micro-batch N (memory-peak-ours-mbN.md), mem-ours-seq16k at
#                    micro-batch 1 over rows of 16384 (memory-peak-ours-mb1-seq16384.md)
# Optional (not in the default list: BENCH_FAIR_PARTS="ours-auto24 liger" runs it with the anchor
# it is compared with; or concatenate this run's results.jsonl with an earlier run's and give that
# to bench/fair_summary.py):
#   ours-mb4-offN, ours-mb1-offN, ours-70b-mb4-offN, ours-70b-mb1-offN
#                    ours with checkpointing and trainer.offload_activation_layers: N (ours-mb4-offN
#                    is profiled: attr-ours-mb4-offN attributes it)
#   ours-mb4-stage3  ours-mb4 under ZeRO stage 3 (at world 1: the base weights through the
#                    partitioned store, no gather), against ours-mb4
#   ours-mb4-offparam, ours-mb1-offparam, ours-70b-mb1-offparam
#                    ours with zero_optimization.offload_param: {device: cpu} (the 4-bit base
#                    weights in pinned host memory, copied a layer ahead)
#   ours-70bnf4-mbN-offparam  the whole LLaMA-2-70B shape, pre-quantized (random NF4 codes),
#                    micro-batch N, checkpointing auto under max_memory_gib: 24, offload_param: cpu
#   ours-70bnf4-mbN-planned  the same with the stage and offload_param left to the workers
#                    (stage: auto): what the memory planner chooses under the 24 GiB budget
#   ours-auto24      ours, 1 GPU, micro-batch 4, enable_gradient_checkpointing: auto with
#                    max_memory_gib: 24 (the split the worker chose is in results.jsonl); the
#                    summary compares it with the best anchor whose peak allocation fits 24 GiB
#   ours-auto24-offN the same with trainer.offload_activation_layers: N (or offauto: auto)
#   ours-mb4-nockpt-heldGIB  ours-mb4-nockpt with trainer.dequantized_weight_layers: auto and
#                    max_memory_gib: GIB (heldall: no budget, the GPU's free memory), profiled
#                    (attr-ours-mb4-nockpt-heldGIB attributes it)
#   ours-mb4-nockpt-offN-heldGIB  the same with trainer.offload_activation_layers: N (plain layers
#                    offloaded to make room for held ones), profiled (attr-ours-mb4-nockpt-offN-heldGIB)
# (offN parts take N = auto too: ours-mb4-offauto is checkpointing with the count left to the
# worker, which reports its choice.)
# The 70B-width slice (issue 13: bench/make_llama_folder.py --layers 6 --hidden 8192
# --intermediate 28672 --heads 64, 12 GB of random bf16 weights, made by the first part that
# needs it, in the 7B folder's parent), also optional (BENCH_FAIR_PARTS="ours-70b-mb4 ..."):
#   ours-70b-mb4     ours, 1 GPU, micro-batch 4, checkpointing
#   ours-70b-mb1     ours, 1 GPU, micro-batch 1, checkpointing, then a profile of 2 more steps
#   attr-ours-70b-mb1  the attribution of that trace (the weakest line against issue 13's targets)
#   liger-70b        HF + peft + bnb + autocast + Liger: mb 4, mb 1 (one process)
#   hf-70b           HF + peft + bnb + autocast: mb 4, mb 1 (one process)
# Unsloth at its best (bench/anchor_unsloth.py: its 4-bit load, its Triton LoRA kernels, its
# offloaded checkpointing), also optional: it runs from /tmp/unslothsite, which
# `run_on_gpu.sh unsloth-install` leaves there in a call of its own on the same warm machine
# (carry .device-unsloth/site, made by scripts/device/unsloth_wheels.sh: with the bundle it would
# overrun 64 MiB). Each process compiles on its first steps, in the warm-up. E.g.
# BENCH_FAIR_PARTS="ours-mb4 ours-mb1 unsloth" in one call, "ours-mb4-nockpt ours-70b-mb4
# ours-70b-mb1 unsloth-70b" and "ours-seq16k unsloth-seq16k" in others:
#   unsloth          mb 4 and mb 1 with its checkpointing (one process), then mb 4 without
#                    checkpointing (a second process: Unsloth fixes checkpointing at load)
#   unsloth-70b      the 70B-width slice: mb 4, mb 1, with its checkpointing (one process)
#   unsloth-seq16k   unpacked rows of 16384 tokens (as ours-seq16k), mb 1, its checkpointing
#   fp8-loss         FP8 against bf16 over 300 steps each (float8_loss below; float8-loss.md)
# The longest row (issue 52): one row of N tokens at micro-batch 1, one timed step (its time counts
# the first step's one-off costs, seconds against minutes), each part alone in a call (a step of
# 342,733 tokens of the 8B shape is about six minutes of attention on an H100):
#   ours-rowN        ours with checkpointing, activation offloading and the stage left to the
#                    plan (auto, under the GPU's free memory), the offloaded activations given
#                    BENCH_ROW_HOST_GIB (default 100) of the host's memory to pin
#                    (trainer.max_host_memory_gib): every checkpointed layer's input waits there
#   unsloth-rowN     Unsloth at the same row, its checkpointing; BENCH_MAX_MEMORY_GIB caps both
#                    sides' allocators (76 for an 80 GB card's room on an H200)
# with "-llama3" appended: on the LLaMA-3.1-8B shape (vocabulary 128256, 8 KV heads), whose
# random folder is made on first use on disk (16 GB; BENCH_MODEL_LLAMA3_DIR; BENCH_LLAMA3_NF4=1:
# about 5.7 GB pre-quantized instead: the layers in 4 bits), not in /dev/shm, which the pinned
# copies of the rows' checkpoints need as host memory.
# Any ours part with "-fp8" appended (ours-mb4-offauto-fp8, ours-mb4-nockpt-held34-fp8, ...) runs
# it with quantization.float8_base_forward: true; its results carry the label with "-fp8". Before
# it, "-offopt" (ours-seq16k-offauto-offopt, ...-offopt-fp8) puts the AdamW moments in host memory
# (zero_optimization.offload_optimizer: {device: cpu}); the label gains "-offopt".
#
# Long rows (issue 13, "Packing at long sequences"; not in the default list, ask for them by name,
# e.g. BENCH_FAIR_PARTS="ours-pack8k ours-seq8k ours-pack16k ours-seq16k" in one call and
# "liger-pack8k liger-pack16k" in another, as together they overrun the budget). All on 1 GPU,
# micro-batch 1, checkpointing; estimates in seconds after the setup:
#   ours-pack8k      60   ours, packed rows of 8192 tokens (data.packing: true; documents of
#                         BENCH_DOC_TOKENS "500 4000" tokens, so a row holds several), the rate in
#                         non-padding tokens
#   ours-pack16k     90   the same with rows of 16384 tokens
#   ours-seq8k       60   ours unpacked at 8192 (one document longer than the row per row), the
#                         reference for "packed within 5% of unpacked"
#   ours-seq16k     100   the same at 16384
#   ours-seq16k-offN 100  the same with trainer.offload_activation_layers: N (or auto)
#   liger-pack8k    110   HF + peft + bnb + autocast + Liger packed as HF users pack: rows of 8192
#                         from DataCollatorWithFlattening (position ids restart at 0, no attention
#                         mask), attn_implementation sdpa (bench/anchor_hf.py --packed says what
#                         transformers does with them)
#   liger-pack16k   160   the same with rows of 16384
# Every measurement: BENCH_WARMUP (3) warm-up steps, then BENCH_WINDOWS (3) windows of
# BENCH_WINDOW_STEPS (5) steps, tokens / wall time per window (bench/summarize.py and
# bench/anchor_common.py say how). The whole run keeps within BENCH_BUDGET_S (560) seconds: a part
# starts only if its estimate fits in what is left, and is stopped at what is left or at 2.5 times
# its estimate + 30 s; a part that fails is logged and the next one runs. Any of ours' parts
# takes BENCH_MAX_MEMORY_GIB=GIB (trainer.max_memory_gib, e.g. a peer's peak as the budget) and
# BENCH_STAGE=auto (the stage and offload_param left to the workers' plan). After every part, $OUT
# holds everything so far:
#   summary.md                 the table (ours against the best anchor per setting), the parts'
#                              times and the attributions
#   results.jsonl              one JSON line per measurement
#   bench.log                  (written by run_on_gpu.sh) this script's console
#   logs.tar.gz                every part's full output, ours' job files, events and worker logs
#   trace-ours-mb4.json.gz     ours' profile (slimmed: no flow arrows, strides or dtypes)
#   trace-liger-mb4.json.gz    the Liger anchor's profile
#   trace-ours-70b-mb1.json.gz ours' profile at the 70B-width slice, micro-batch 1 (attr-ours-70b-mb1)
#   trace-ours-mb4-nockpt.json.gz  ours' profile without checkpointing (attr-ours-nockpt)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
budget=${BENCH_BUDGET_S:-560}
warmup=${BENCH_WARMUP:-3} windows=${BENCH_WINDOWS:-3} window_steps=${BENCH_WINDOW_STEPS:-5}
parts=${BENCH_FAIR_PARTS:-"ours-mb4 attr-ours liger hf ours-mb1 ours-2gpu deepspeed ours-mb4-nockpt attr-liger"}
# For a dry run on a machine without GPUs: BENCH_GPUS_1=none BENCH_MODEL_DIR=a-tiny-folder
# BENCH_SEQ=128 BENCH_ANCHOR_ARGS="--device cpu --bf16-base --seq 128", and for the long rows
# BENCH_SEQ_8K=256 BENCH_SEQ_16K=512 BENCH_DOC_TOKENS="20 100" (the real run sets none of these).
gpus_1=${BENCH_GPUS_1:-0} gpus_2=${BENCH_GPUS_2:-0,1}
seq_8k=${BENCH_SEQ_8K:-8192} seq_16k=${BENCH_SEQ_16K:-16384}
read -r doc_min doc_max <<< "${BENCH_DOC_TOKENS:-500 4000}"
read -r -a anchor_args <<< "${BENCH_ANCHOR_ARGS:-}"
work=/tmp/fair
logs=$work/logs
rm -rf "$work" && mkdir -p "$logs"
results=$OUT/results.jsonl
parts_file=$work/parts.jsonl
: > "$results"
: > "$parts_file"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ngpu=$(nvidia-smi -L | wc -l)
t0=$SECONDS
measure=(--warmup "$warmup" --windows "$windows" --window-steps "$window_steps")

finish() {  # the summary and the logs as they are now
  local attributions=()
  for f in "$work"/attribution-*.md; do [ -f "$f" ] && attributions+=("$f"); done
  local smi=()
  [ -f "$OUT/smi.csv" ] && smi=(--smi "$OUT/smi.csv")
  python3 "$root/bench/fair_summary.py" "$results" --parts "$parts_file" "${smi[@]}" \
    --attribution "${attributions[@]}" --header "$(date -u +%Y-%m-%d), $(head -1 "$OUT/gpus.txt" 2>/dev/null) x$ngpu, binaries of $(cat "$root/.device-bundle/commit" 2>/dev/null || echo '?')" \
    > "$OUT/summary.md" 2> "$logs/fair_summary.err"
  local files=(logs parts.jsonl)
  for f in "$work"/attribution-*.md; do [ -f "$f" ] && files+=("$(basename "$f")"); done
  tar -C "$work" -czf "$OUT/logs.tar.gz" "${files[@]}" 2>/dev/null
}

# Ends what a part left on the GPUs (its own processes, by id: nothing else runs on this machine).
reap() {
  local pids
  pids=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ')
  for pid in $pids; do
    [ "$pid" != "$$" ] && kill "$pid" 2>/dev/null && echo "   (ended leftover GPU process $pid)"
  done
  [ -n "$pids" ] && sleep 3
  return 0
}

run_part() {  # NAME ESTIMATE_S COMMAND...   (output to $logs/NAME.log; JSON lines to results.jsonl)
  local name=$1 estimate=$2
  shift 2
  local left=$((budget - (SECONDS - t0)))
  if ((left < estimate)); then
    echo "== $name: skipped (estimate ${estimate}s, ${left}s left of ${budget}s)"
    echo "{\"part\": \"$name\", \"rc\": \"skipped\", \"note\": \"estimate ${estimate}s, ${left}s left\"}" >> "$parts_file"
    return 0
  fi
  # A part that hangs may not take the others' time: at most 2.5 times its estimate + 30 s.
  local limit=$((estimate * 5 / 2 + 30))
  ((limit > left)) && limit=$left
  echo "== $name: start at $((SECONDS - t0))s (estimate ${estimate}s, limit ${limit}s)"
  local start=$SECONDS started ended
  # In nvidia-smi's own timestamp format (fair_summary.py finds each part's samples by them).
  started=$(date '+%Y/%m/%d %H:%M:%S.%3N')
  # timeout signals its whole process group (the part's children too); functions run through bash.
  timeout -k 20 "$limit" bash -c '"$@"' part "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - start))
  ended=$(date '+%Y/%m/%d %H:%M:%S.%3N')
  grep -E '^\{' "$logs/$name.log" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        r = json.loads(line)
    except json.JSONDecodeError:
        continue
    r["part"] = sys.argv[1]
    print(json.dumps(r))' "$name" >> "$results"
  grep -E '^\{|^# |^\| |profiler:|loaded .* in|Traceback|Error|error:|failed|skipped' "$logs/$name.log" | cut -c1-400 | tail -25
  ((rc != 0)) && { echo "   (exit status $rc; last lines:)"; tail -8 "$logs/$name.log" | cut -c1-300; }
  echo "== $name: exit status $rc in ${took}s (total $((SECONDS - t0))s)"
  local note=""
  # 124: the part's time limit; 137 (SIGKILL) before it: most often the kernel's out-of-memory killer.
  ((rc == 124 || (rc == 137 && took >= limit))) && note="stopped at the time limit"
  ((rc == 137 && took < limit)) && note="killed before its time limit (out of host memory?)"
  echo "{\"part\": \"$name\", \"rc\": $rc, \"seconds\": $took, \"note\": \"$note\", \"started\": \"$started\", \"ended\": \"$ended\"}" >> "$parts_file"
  reap
  finish
}

# ours: one job through the real service.
#   ours_job LABEL GPUS MICRO_BATCH CHECKPOINTING [TRACE] [SEQ PACKING DATA]   (TRACE "": none)
# (CHECKPOINTING: true, false, or auto:GIB for auto with that budget)
ours_job() {
  local label=$1 gpus=$2 mb=$3 ckpt=$4 trace=${5:-}
  local seq=${6:-${BENCH_SEQ:-2048}} packing=${7:-false} data=${8:-$work/bench.txt}
  # auto:GIB or false:GIB: trainer.max_memory_gib (false: with BENCH_DEQUANTIZED_LAYERS=auto);
  # else BENCH_MAX_MEMORY_GIB, for any part (a peer's peak memory as the budget, say).
  local budget_gib=${BENCH_MAX_MEMORY_GIB:-}
  if [[ $ckpt == *:* ]]; then budget_gib=${ckpt#*:}; ckpt=${ckpt%%:*}; fi
  # One step past the last window: the job's final step skips the step-ahead queue and reads
  # 10-17 % fast, so no window may end on it (tail_steps=0: one that lasts minutes may).
  local steps=$((warmup + windows * window_steps + ${tail_steps:-1}))
  local profile=()
  if [ -n "$trace" ]; then
    # one step to prepare the profiler, two profiled, one whose start stops it
    profile=(BENCH_PROFILE_STEPS="$((steps + 1)):2" BENCH_PROFILE_OUT="$trace")
    steps=$((steps + 4))
  fi
  env BENCH_WARMUP="$warmup" BENCH_WINDOWS="$windows" BENCH_WINDOW_STEPS="$window_steps" BENCH_CHECKPOINTING="$ckpt" \
    BENCH_MAX_MEMORY_GIB="$budget_gib" \
    BENCH_KEEP="$logs/$label${BENCH_OFFLOAD_OPTIMIZER:+-offopt}${BENCH_FLOAT8:+-fp8}" BENCH_LABEL="$label" BENCH_SEQ="$seq" BENCH_PACKING="$packing" "${profile[@]}" \
    "$root/bench/run_service_bench.sh" "$model" "$data" "$gpus" "$mb" "${BENCH_STAGE:-2}" "$steps"
}

attribute() {  # TRACE TITLE NAME
  local trace=$1 title=$2 name=$3
  [ -f "$trace" ] || { echo "no trace at $trace"; return 1; }
  ls -la "$trace"
  python3 "$root/bench/attribute_profile.py" "$trace" --config "$model" --title "$title" \
    --json "$logs/attribution-$name.json" --slim "$OUT/trace-$name.json.gz" > "$work/attribution-$name.md" || return 1
  cat "$work/attribution-$name.md"
  local size
  size=$(stat -c %s "$OUT/trace-$name.json.gz")
  if ((size > 15 * 1024 * 1024)); then
    echo "trace-$name.json.gz is $size bytes, over what comes back: left out"
    rm -f "$OUT/trace-$name.json.gz"
  fi
}

echo "== setup: $ngpu GPU(s); budget ${budget}s; parts: $parts"
python3 -c '
import importlib.metadata as m
def v(n):
    try:
        return m.version(n)
    except m.PackageNotFoundError:
        return "MISSING"
print("versions:", ", ".join(n + " " + v(n) for n in
      ["torch", "transformers", "peft", "accelerate", "triton", "bitsandbytes", "liger-kernel"]))'
if [ -d "$root/.device-wheels/ds" ]; then
  timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/dssite \
    "$root"/.device-wheels/ds/*.whl 2>&1 | tail -3
fi
# The 7B-shaped folder (13.5 GB of random bf16 weights) in memory when there is room.
shm_free=$(df --output=avail -k /dev/shm 2>/dev/null | tail -1)
model=/tmp/llama7b
[ "${shm_free:-0}" -gt $((40 * 1024 * 1024)) ] && model=/dev/shm/llama7b
model=${BENCH_MODEL_DIR:-$model}
start=$SECONDS
# Parts all on the LLaMA-3.1-8B shape need none (its folder is made by with_llama3).
needs_7b=0
for p in $parts; do [[ $p == *-llama3 ]] || needs_7b=1; done
[ -f "$model/config.json" ] || [ "$needs_7b" = 0 ] ||
  timeout 240 python3 "$root/bench/make_llama_folder.py" "$model" 2>&1 | tail -2
python3 "$root/bench/make_text_data.py" "$work/bench.txt" --lines 200
if [[ " $parts " == *" ours-pack"* || " $parts " == *" ours-seq"* || " $parts " == *" mem-ours-seq"* ]]; then
  # Packed rows: documents of doc_min..doc_max tokens (about 3.1 tokens a word); unpacked long
  # rows: every document longer than the longest row.
  python3 "$root/bench/make_text_data.py" "$work/packed.txt" --lines 600 \
    --min-words $((doc_min * 10 / 31)) --words $((doc_max * 10 / 31))
  python3 "$root/bench/make_text_data.py" "$work/long.txt" --lines 200 --words $((seq_16k / 2))
fi
echo "== setup: model folder $model made in $((SECONDS - start))s (total $((SECONDS - t0))s)"
echo "{\"part\": \"setup\", \"rc\": 0, \"seconds\": $((SECONDS - t0)), \"note\": \"model folder in $model\"}" >> "$parts_file"
finish

# The 70B-width slice folder, made on first use; runs COMMAND... with $model set to it.
model70=${BENCH_MODEL70_DIR:-$(dirname "$model")/llama70b-slice}
with_70b() {
  if [ ! -f "$model70/config.json" ]; then
    local start=$SECONDS
    timeout 400 python3 "$root/bench/make_llama_folder.py" "$model70" --layers 6 --hidden 8192 \
      --intermediate 28672 --heads 64 2>&1 | tail -2
    echo "70B-width slice folder $model70 made in $((SECONDS - start))s"
  fi
  model=$model70 "$@"
}

# DIR SHAPE_FLAGS...: a random folder pre-quantized as bitsandbytes saves NF4 (bf16 beside it),
# in shards, with the example tokenizer.
make_nf4_folder() {
  local dir=$1
  shift
  timeout 400 "${QLORA_BINARY_DIR:-$root/build}/worker/engine/qlora-make-tiny-model" "$dir" "$@" \
    --dtype bfloat16 --bnb_nf4 --max_shard_bytes 5000000000 2>&1 | tail -2
  cp "$root"/examples/tokenizer/* "$dir"/
}

# The LLaMA-3.1-8B-shaped folder, made on first use; runs COMMAND... with $model set to it. With
# BENCH_LLAMA3_NF4=1 pre-quantized as bitsandbytes saves NF4 (qlora-make-tiny-model --bnb_nf4:
# about 5.7 GB against 16 GB of bf16, its layers written in 4 bits; ours and Unsloth load it as
# is, as they load bitsandbytes' 4-bit folders).
llama3_nf4=${BENCH_LLAMA3_NF4:-0}
if [ "$llama3_nf4" = 1 ]; then
  model_llama3=${BENCH_MODEL_LLAMA3_DIR:-/tmp/llama3-8b-nf4}
else
  model_llama3=${BENCH_MODEL_LLAMA3_DIR:-/tmp/llama3-8b}
fi
with_llama3() {
  if [ ! -f "$model_llama3/config.json" ]; then
    local start=$SECONDS
    if [ "$llama3_nf4" = 1 ]; then
      make_nf4_folder "$model_llama3" --layers 32 --hidden 4096 --intermediate 14336 --heads 32 \
        --kv_heads 8 --vocab 128256 --rope_theta 500000 --max_positions 1048576
    else
      timeout 400 python3 "$root/bench/make_llama_folder.py" "$model_llama3" --intermediate 14336 \
        --kv-heads 8 --vocab 128256 --rope-theta 500000 --max-positions 1048576 2>&1 | tail -2
    fi
    echo "LLaMA-3.1-8B-shaped folder $model_llama3 made in $((SECONDS - start))s"
  fi
  model=$model_llama3 "$@"
}

# One row of N tokens (text whose every line is longer), one timed step: ours_row N / unsloth_row N.
row_text() {
  local text=$work/row$1.txt
  # About 3.1 tokens and 7 bytes a word: n / 2.8 words fill the row in about 2.5 bytes a token,
  # well within the readers' record bound (16 bytes a token of the row; binaries before 8268a7f
  # had 1 MiB, which this keeps up to about 400,000 tokens).
  [ -f "$text" ] || python3 "$root/bench/make_text_data.py" "$text" --lines 4 --words $(($1 * 10 / 28))
  echo "$text"
}
ours_row() {
  local n=$1 label=$2 text
  text=$(row_text "$n")
  warmup=0 windows=1 window_steps=1 tail_steps=0 BENCH_OFFLOAD_LAYERS=auto BENCH_STAGE=auto \
    BENCH_MAX_HOST_MEMORY_GIB=${BENCH_ROW_HOST_GIB:-100} \
    ours_job "$label" "$gpus_1" 1 auto "" "$n" false "$text"
}
unsloth_row() {  # under BENCH_MAX_MEMORY_GIB where set, as ours
  unsloth_anchor "$model" --micro-batches 1 --seq "$1" --warmup 0 --windows 1 --window-steps 1 \
    ${BENCH_MAX_MEMORY_GIB:+--max-memory-gib "$BENCH_MAX_MEMORY_GIB"}
}

# ours at micro-batch MB with checkpointing, profiled with the allocator's events: where the
# step's memory peaks (bench/memory_peak.py); its measurement is not a result (the JSON lines stay
# out).
memory_peak() {  # MB [SEQ DATA]
  local mb=$1 seq=${2:-} data=${3:-}
  local name=mem-ours-mb$mb${seq:+-seq$seq}
  local trace=$work/trace-$name.json
  BENCH_PROFILE_MEMORY=1 ours_job "$name" "$gpus_1" "$mb" true "$trace" "$seq" false "$data" \
    > "$work/$name.out" || return 1
  grep -v '^{' "$work/$name.out"
  python3 "$root/bench/memory_peak.py" "$trace" | tee "$OUT/memory-peak-ours-mb$mb${seq:+-seq$seq}.md"
}

# FP8 against bf16 (quantization.float8_base_forward): one 300-step job each, micro-batch 4 of
# 512 tokens of the project's own documentation and sources, evaluated every 25 steps on 5 %
# held out; bench/float8_loss.py compares the eval losses (float8-loss.md).
float8_loss() {
  local text=$work/project.txt kind
  python3 - "$root" "$text" <<'PY'
import pathlib, sys
root, out = pathlib.Path(sys.argv[1]), sys.argv[2]
parts = [p.read_text(errors="ignore") for folder in ["docs", "worker", "coordinator", "common", "kernels", "cli"]
         for p in sorted((root / folder).rglob("*")) if p.is_file() and p.suffix in (".md", ".cc", ".h", ".cu")]
words = " ".join(" ".join(parts).split())
with open(out, "w") as f:
    for i in range(0, len(words), 2000):
        f.write(words[i:i + 2000] + "\n")
PY
  for kind in bf16 fp8; do
    local float8=()
    [ "$kind" = fp8 ] && float8=(BENCH_FLOAT8=1)
    env "${float8[@]}" BENCH_EVAL_STEPS=25 BENCH_SEQ=512 BENCH_KEEP="$logs/fp8-loss-$kind" \
      BENCH_LABEL="loss" BENCH_WARMUP=3 BENCH_WINDOWS=1 BENCH_WINDOW_STEPS=296 \
      "$root/bench/run_service_bench.sh" "$model" "$text" "$gpus_1" 4 2 300 || return 1
  done
  python3 "$root/bench/float8_loss.py" "$logs/fp8-loss-bf16/events.jsonl" \
    "$logs/fp8-loss-fp8/events.jsonl" --markdown "$OUT/float8-loss.md"
}

# The whole LLaMA-2-70B shape (80 layers, GQA with 8 KV heads), pre-quantized as bitsandbytes
# saves NF4 with random codes (qlora-make-tiny-model --bnb_nf4: 36 GB, written in about a minute;
# a bf16 folder would not fit the disk), on disk unless BENCH_MODEL70F_DIR says otherwise.
model70f=${BENCH_MODEL70F_DIR:-/tmp/llama70b-nf4}
with_70b_nf4() {
  if [ ! -f "$model70f/config.json" ]; then
    local start=$SECONDS
    make_nf4_folder "$model70f" --layers 80 --hidden 8192 --intermediate 28672 --heads 64 \
      --kv_heads 8 --vocab 32000 --max_positions 4096
    echo "70B NF4 folder $model70f made in $((SECONDS - start))s"
  fi
  model=$model70f "$@"
}

# Unsloth: one process of bench/anchor_unsloth.py ARGS... with the site folder that
# `run_on_gpu.sh unsloth-install` left in /tmp/unslothsite first on the path (its bitsandbytes and
# trl before the image's and .device-wheels').
unsloth_anchor() {
  if [ ! -d /tmp/unslothsite/unsloth ]; then
    echo "no /tmp/unslothsite: carry .device-unsloth/site and run scripts/device/run_on_gpu.sh unsloth-install first"
    return 1
  fi
  PYTHONPATH="/tmp/unslothsite:${PYTHONPATH:-}" python3 "$root/bench/anchor_unsloth.py" "$@"
}

# The `unsloth` part: MODEL MEASURE_ARGS... with its checkpointing at mb 4 and 1, then mb 4
# without; both processes run even if the first fails.
unsloth_settings() {
  local rc=0
  unsloth_anchor "$@" --micro-batches 4 1 || rc=1
  unsloth_anchor "$@" --micro-batches 4 --no-gc || rc=1
  return $rc
}

export -f ours_job attribute float8_loss with_70b with_70b_nf4 make_nf4_folder with_llama3 memory_peak unsloth_anchor \
  unsloth_settings row_text ours_row unsloth_row
export model_llama3 llama3_nf4
export model70f
export gpus_1
export model70
export root work logs model warmup windows window_steps OUT
for part in $parts; do
  # PART-fp8: PART with the base's forward GEMMs in FP8 (its results' label ends in -fp8).
  # PART-offopt: PART with the AdamW moments in host memory (offload_optimizer; label -offopt).
  unset BENCH_FLOAT8 BENCH_OFFLOAD_OPTIMIZER
  if [[ $part == *-fp8 ]]; then
    export BENCH_FLOAT8=1
    part=${part%-fp8}
  fi
  if [[ $part == *-offopt ]]; then
    export BENCH_OFFLOAD_OPTIMIZER=cpu
    part=${part%-offopt}
  fi
  case $part in
    ours-mb4) run_part ours-mb4 60 ours_job ours-mb4 "$gpus_1" 4 true "$work/trace-ours-mb4.json" ;;
    mem-ours) run_part mem-ours 60 memory_peak 4 ;;
    mem-ours-mb*) run_part "$part" 60 memory_peak "${part#mem-ours-mb}" ;;
    mem-ours-seq16k) run_part "$part" 100 memory_peak 1 "$seq_16k" "$work/long.txt" ;;
    fp8-loss) run_part fp8-loss 200 float8_loss ;;
    attr-ours) run_part attr-ours 20 attribute "$work/trace-ours-mb4.json" \
      "Profile of ours: 1 GPU, micro-batch 4, checkpointing, 2 steps" ours-mb4 ;;
    liger) run_part liger 150 python3 "$root/bench/anchor_hf.py" "$model" --liger --micro-batches 4 1 \
      --no-checkpointing-too "${measure[@]}" --profile-out "$work/trace-liger-mb4.json" --profile-micro-batch 4 \
      --profile-steps 1 "${anchor_args[@]}" ;;
    hf) run_part hf 90 python3 "$root/bench/anchor_hf.py" "$model" --micro-batches 4 1 "${measure[@]}" \
      "${anchor_args[@]}" ;;
    ours-mb1) run_part ours-mb1 40 ours_job ours-mb1 "$gpus_1" 1 true ;;
    ours-2gpu) ((ngpu > 1)) && run_part ours-2gpu 55 ours_job ours-2gpu "$gpus_2" 4 true ;;
    deepspeed) ((ngpu > 1)) && run_part deepspeed 80 env PYTHONPATH="/tmp/dssite:${PYTHONPATH:-}" \
      PATH="/tmp/dssite/bin:$PATH" DS_BUILD_OPS=0 torchrun --nproc_per_node "$ngpu" \
      "$root/bench/anchor_deepspeed.py" "$model" --micro-batch 4 --liger "${measure[@]}" ;;
    ours-mb4-nockpt) run_part ours-mb4-nockpt 45 ours_job ours-mb4-nockpt "$gpus_1" 4 false \
      "$work/trace-ours-mb4-nockpt.json" ;;
    attr-ours-nockpt) run_part attr-ours-nockpt 20 attribute "$work/trace-ours-mb4-nockpt.json" \
      "Profile of ours: 1 GPU, micro-batch 4, no checkpointing, 2 steps" ours-mb4-nockpt ;;
    ours-mb4-nockpt-off*-held*) rest=${part#ours-mb4-nockpt-off} held=${part##*-held}
      run_part "$part" 60 env BENCH_DEQUANTIZED_LAYERS=auto BENCH_OFFLOAD_LAYERS="${rest%%-held*}" \
        bash -c 'ours_job "$@"' _ "$part" "$gpus_1" 4 "false$([ "$held" = all ] || echo ":$held")" \
        "$work/trace-$part.json" ;;
    attr-ours-mb4-nockpt-off*) run_part "$part" 20 attribute "$work/trace-${part#attr-}.json" \
      "Profile of ours: 1 GPU, micro-batch 4, no checkpointing, ${part#attr-ours-mb4-nockpt-}, 2 steps" "${part#attr-}" ;;
    ours-mb4-nockpt-held*) held=${part#ours-mb4-nockpt-held}
      run_part "$part" 50 env BENCH_DEQUANTIZED_LAYERS=auto bash -c 'ours_job "$@"' _ "$part" "$gpus_1" 4 \
        "false$([ "$held" = all ] || echo ":$held")" "$work/trace-$part.json" ;;
    attr-ours-mb4-nockpt-held*) run_part "$part" 20 attribute "$work/trace-${part#attr-}.json" \
      "Profile of ours: 1 GPU, micro-batch 4, no checkpointing, dequantized_weight_layers: auto (${part#attr-ours-mb4-nockpt-held}), 2 steps" "${part#attr-}" ;;
    ours-auto24) run_part ours-auto24 50 ours_job ours-auto24 "$gpus_1" 4 auto:24 ;;
    ours-auto24-off*) run_part "$part" 60 env BENCH_OFFLOAD_LAYERS="${part#ours-auto24-off}" \
      bash -c 'ours_job "$@"' _ "$part" "$gpus_1" 4 auto:24 ;;
    ours-mb4-stage3) run_part "$part" 60 env BENCH_STAGE=3 bash -c 'ours_job "$@"' _ "$part" "$gpus_1" 4 true ;;
    ours-mb4-offparam) run_part "$part" 60 env BENCH_OFFLOAD_PARAM=cpu \
      bash -c 'ours_job "$@"' _ "$part" "$gpus_1" 4 true ;;
    ours-mb1-offparam) run_part "$part" 40 env BENCH_OFFLOAD_PARAM=cpu \
      bash -c 'ours_job "$@"' _ "$part" "$gpus_1" 1 true ;;
    ours-70bnf4-mb*-offparam) mb=${part#ours-70bnf4-mb}; mb=${mb%%-*}
      run_part "$part" 300 env BENCH_OFFLOAD_PARAM=cpu bash -c 'with_70b_nf4 ours_job "$@"' _ "$part" \
        "$gpus_1" "$mb" auto:24 ;;
    ours-70bnf4-mb*-planned) mb=${part#ours-70bnf4-mb}; mb=${mb%%-*}
      run_part "$part" 300 env BENCH_STAGE=auto bash -c 'with_70b_nf4 ours_job "$@"' _ "$part" \
        "$gpus_1" "$mb" auto:24 ;;
    ours-70b-mb1-offparam) run_part "$part" 60 env BENCH_OFFLOAD_PARAM=cpu \
      bash -c 'with_70b ours_job "$@"' _ "$part" "$gpus_1" 1 true ;;
    ours-mb4-off*) run_part "$part" 60 env BENCH_OFFLOAD_LAYERS="${part#ours-mb4-off}" \
      bash -c 'ours_job "$@"' _ "$part" "$gpus_1" 4 true "$work/trace-$part.json" ;;
    attr-ours-mb4-off*) run_part "$part" 20 attribute "$work/trace-${part#attr-}.json" \
      "Profile of ours: 1 GPU, micro-batch 4, checkpointing, ${part#attr-ours-mb4-off} layers offloaded, 2 steps" "${part#attr-}" ;;
    ours-mb1-off*) run_part "$part" 40 env BENCH_OFFLOAD_LAYERS="${part#ours-mb1-off}" \
      bash -c 'ours_job "$@"' _ "$part" "$gpus_1" 1 true ;;
    ours-70b-mb4-off*) run_part "$part" 150 env BENCH_OFFLOAD_LAYERS="${part#ours-70b-mb4-off}" \
      bash -c 'with_70b ours_job "$@"' _ "$part" "$gpus_1" 4 true ;;
    ours-70b-mb1-off*) run_part "$part" 60 env BENCH_OFFLOAD_LAYERS="${part#ours-70b-mb1-off}" \
      bash -c 'with_70b ours_job "$@"' _ "$part" "$gpus_1" 1 true ;;
    ours-row*-llama3) n=${part#ours-row}; run_part "$part" 300 with_llama3 ours_row "${n%-llama3}" "$part" ;;
    ours-row*) run_part "$part" 300 ours_row "${part#ours-row}" "$part" ;;
    unsloth-row*-llama3) n=${part#unsloth-row}; run_part "$part" 300 with_llama3 unsloth_row "${n%-llama3}" ;;
    unsloth-row*) run_part "$part" 300 unsloth_row "${part#unsloth-row}" ;;
    ours-70b-mb4) run_part ours-70b-mb4 150 with_70b ours_job ours-70b-mb4 "$gpus_1" 4 true ;;
    ours-70b-mb1) run_part ours-70b-mb1 60 with_70b ours_job ours-70b-mb1 "$gpus_1" 1 true \
      "$work/trace-ours-70b-mb1.json" ;;
    attr-ours-70b-mb1) run_part attr-ours-70b-mb1 20 with_70b attribute "$work/trace-ours-70b-mb1.json" \
      "Profile of ours: 70B-width slice, 1 GPU, micro-batch 1, checkpointing, 2 steps" ours-70b-mb1 ;;
    liger-70b) run_part liger-70b 150 with_70b python3 "$root/bench/anchor_hf.py" "$model70" --liger \
      --micro-batches 4 1 "${measure[@]}" "${anchor_args[@]}" ;;
    hf-70b) run_part hf-70b 120 with_70b python3 "$root/bench/anchor_hf.py" "$model70" --micro-batches 4 1 \
      "${measure[@]}" "${anchor_args[@]}" ;;
    unsloth) run_part unsloth 200 unsloth_settings "$model" --seq "${BENCH_SEQ:-2048}" "${measure[@]}" ;;
    unsloth-70b) run_part unsloth-70b 150 with_70b unsloth_anchor "$model70" --micro-batches 4 1 \
      --seq "${BENCH_SEQ:-2048}" "${measure[@]}" ;;
    unsloth-seq16k) run_part unsloth-seq16k 120 unsloth_anchor "$model" --micro-batches 1 --seq "$seq_16k" \
      "${measure[@]}" ;;
    attr-liger) run_part attr-liger 25 attribute "$work/trace-liger-mb4.json" \
      "Profile of HF + peft + bnb + autocast + Liger: 1 GPU, micro-batch 4, checkpointing, 1 step" liger-mb4 ;;
    ours-pack8k) run_part ours-pack8k 60 ours_job ours-pack8k "$gpus_1" 1 true "" "$seq_8k" true "$work/packed.txt" ;;
    ours-pack16k) run_part ours-pack16k 90 ours_job ours-pack16k "$gpus_1" 1 true "" "$seq_16k" true "$work/packed.txt" ;;
    ours-seq8k) run_part ours-seq8k 60 ours_job ours-seq8k "$gpus_1" 1 true "" "$seq_8k" false "$work/long.txt" ;;
    ours-seq16k) run_part ours-seq16k 100 ours_job ours-seq16k "$gpus_1" 1 true "" "$seq_16k" false "$work/long.txt" ;;
    ours-seq16k-off*) run_part "$part" 100 env BENCH_OFFLOAD_LAYERS="${part#ours-seq16k-off}" \
      bash -c 'ours_job "$@"' _ "$part" "$gpus_1" 1 true "" "$seq_16k" false "$work/long.txt" ;;
    liger-pack8k) run_part liger-pack8k 110 python3 "$root/bench/anchor_hf.py" "$model" --liger --micro-batches 1 \
      "${measure[@]}" "${anchor_args[@]}" --seq "$seq_8k" --packed --doc-tokens "$doc_min" "$doc_max" ;;
    liger-pack16k) run_part liger-pack16k 160 python3 "$root/bench/anchor_hf.py" "$model" --liger --micro-batches 1 \
      "${measure[@]}" "${anchor_args[@]}" --seq "$seq_16k" --packed --doc-tokens "$doc_min" "$doc_max" ;;
    *) echo "== $part: unknown part" ;;
  esac
done
finish
echo "== all parts done in $((SECONDS - t0))s"
cat "$OUT/summary.md"
