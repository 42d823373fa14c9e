#!/usr/bin/env bash
# On the GPU machine (through the device tool): unpacks .device-bundle, points the loader at the
# image's torch and NVIDIA libraries, and runs what it is asked to:
#   scripts/device/run_on_gpu.sh tests            every test binary (CUDA tests included)
#   scripts/device/run_on_gpu.sh fixtures         bitsandbytes NF4/FP4 fixtures -> $OUT/bnb
#   scripts/device/run_on_gpu.sh train [gpus]     the example job through the real service on GPUs
#   scripts/device/run_on_gpu.sh restart          a 2-GPU job restarting after its rank 1 is killed
#   scripts/device/run_on_gpu.sh ray-stash1 ray-stash2   keeps those parts of the Ray wheels
#   scripts/device/run_on_gpu.sh ray              the 7B job on 2 GPUs: local workers, then through
#                                                 the Ray launcher (scripts/device/gpu_ray_run.sh)
#   scripts/device/run_on_gpu.sh bench-fair       ours against the anchors at their best, with a
#                                                 profile and its attribution (bench/fair_bench.sh;
#                                                 needs .device-wheels from scripts/device/wheels.sh)
#   scripts/device/run_on_gpu.sh trl-install      installs the carried .device-trl wheels into
#                                                 /tmp/trlsite (scripts/device/trl_wheels.sh)
#   scripts/device/run_on_gpu.sh unsloth-install  copies the carried .device-unsloth/site to
#                                                 /tmp/unslothsite (scripts/device/unsloth_wheels.sh),
#                                                 where the bench-fair `unsloth*` parts of a later
#                                                 call on the same warm machine find it, and checks
#                                                 that unsloth imports there
#   scripts/device/run_on_gpu.sh trl-dpo          TRL's DPOTrainer + Liger on the 7B shape
#                                                 (bench/anchor_trl_dpo.py) -> $OUT/trl_dpo.txt
#   scripts/device/run_on_gpu.sh gemm             kernels/tuned_gemm_bench $GEMM_ARGS -> $OUT/gemm.txt
#   scripts/device/run_on_gpu.sh dequant          kernels/dequantize_bench -> $OUT/dequant.txt
#   scripts/device/run_on_gpu.sh lora-grads       kernels/lora_gradients_bench -> $OUT/lora_grads.txt
#   scripts/device/run_on_gpu.sh ncu              Nsight Compute over one of the bundle's programs:
#                                                 ncu --clock-control none $NCU_ARGS /tmp/qb/$NCU_RUN
#                                                 -> $OUT/ncu.txt
# Results and logs go to $OUT. With SMI_LOG=1 the GPUs' SM clock, power draw, temperature and
# clock-event (throttle) reasons are sampled every 200 ms meanwhile -> $OUT/smi.csv.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/qb
[ -f "$root/.device-bundle/bundle.tar.xz" ] && tar -C /tmp/qb -xJf "$root/.device-bundle/bundle.tar.xz"
torch_lib=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__) + "/lib")')
nv=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)/nvidia
extra=$(ls -d "$nv"/*/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH=/tmp/qb/lib:$torch_lib:$extra${LD_LIBRARY_PATH:-}
export QLORA_BINARY_DIR=/tmp/qb QLORA_SOURCE_DIR=$root QLORA_PYTHON=python3 NCCL_NVLS_ENABLE=0
export PYTHONPATH=$root/.device-wheels/site:${PYTHONPATH:-} QLORA_SPM_MODULE=/tmp/qb/lib/libqlora_spm.so
nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv,noheader | tee "$OUT/gpus.txt"
if [ "${SMI_LOG:-0}" = 1 ]; then
  nvidia-smi --query-gpu=index,timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
    --format=csv -lms 200 > "$OUT/smi.csv" &
  smi_pid=$!
  trap 'kill "$smi_pid" 2>/dev/null' EXIT
fi
for what in "$@"; do
  case "$what" in
    tests)
      # TESTS: globs of test names without "_test", space-separated (default: every test).
      read -r -a patterns <<< "${TESTS:-*}"
      for t in $(for p in "${patterns[@]}"; do find /tmp/qb/tests -type f -name "${p}_test"; done | sort -u); do
        echo "== $t"; timeout "${TEST_TIMEOUT_S:-600}" "$t" --gtest_brief=1 2>&1 | tail -25
      done 2>&1 | tee "$OUT/tests.txt" ;;
    fixtures)
      python3 "$root/tests/kernels/make_bnb_fixtures.py" --out "$OUT/bnb" 2>&1 | tail -20 | tee "$OUT/fixtures.txt" ;;
    train*)
      "$root/scripts/device/gpu_training_run.sh" 2>&1 | tee "$OUT/train.txt" ;;
    restart)
      "$root/scripts/device/gpu_restart_run.sh" 2>&1 | tee "$OUT/restart.txt" ;;
    ray-stash1|ray-stash2)
      "$root/scripts/device/gpu_ray_run.sh" stash "${what#ray-stash}" ;;
    ray)
      "$root/scripts/device/gpu_ray_run.sh" run ;;
    trl-install)
      for w in "$root"/.device-trl/*/*.whl; do
        [ -f "$w" ] && python3 -m pip install -q --no-index --no-deps --target /tmp/trlsite "$w"
      done
      [ -d "$root/.device-trl/site" ] && mkdir -p /tmp/trlsite && cp -r "$root"/.device-trl/site/* /tmp/trlsite/
      PYTHONPATH=/tmp/trlsite:$PYTHONPATH python3 -c \
        "import trl, datasets, bitsandbytes, liger_kernel; print('trl', trl.__version__, 'datasets', datasets.__version__)" ;;
    unsloth-install)
      # Its own call: the site folder (~37 MB) and the bundle (~38 MB) overrun 64 MiB together.
      if [ -d "$root/.device-unsloth/site/unsloth" ]; then
        rm -rf /tmp/unslothsite && cp -r "$root/.device-unsloth/site" /tmp/unslothsite
        # The import pulls in what the image must provide (transformers, peft, datasets' pyarrow
        # and pandas, ...): a gap shows here, before a bench call is spent on it.
        env PYTHONPATH="/tmp/unslothsite:$PYTHONPATH" UNSLOTH_DISABLE_STATISTICS=1 HF_HUB_OFFLINE=1 \
          TRANSFORMERS_OFFLINE=1 UNSLOTH_COMPILE_LOCATION=/tmp/unsloth_compiled_cache timeout 300 python3 -c '
import importlib.metadata as m
import unsloth  # noqa: F401  (before transformers, as the anchor imports it)
print("unsloth-install: imports;", ", ".join(n + " " + m.version(n) for n in
      ["unsloth", "unsloth_zoo", "bitsandbytes", "trl", "transformers", "peft", "torch", "triton"]))' 2>&1 |
          tail -15 | tee "$OUT/unsloth_install.txt"
      else
        echo "unsloth-install: no .device-unsloth/site here: make it with scripts/device/unsloth_wheels.sh and carry it" |
          tee "$OUT/unsloth_install.txt"
      fi ;;
    trl-dpo)
      [ -f /tmp/llama7b/config.json ] || python3 "$root/bench/make_llama_folder.py" /tmp/llama7b
      [ -f /tmp/pairs.jsonl ] || python3 "$root/bench/make_text_data.py" /tmp/pairs.jsonl --lines 200 --pairs 170,170
      PYTHONPATH=/tmp/trlsite:$PYTHONPATH python3 "$root/bench/anchor_trl_dpo.py" /tmp/llama7b /tmp/pairs.jsonl \
        --micro-batch 4 --seq 1024 \
        2>&1 | grep -vE "Loading|it/s\]|^\s*$" | tail -20 | tee "$OUT/trl_dpo.txt" ;;
    bench-fair)
      "$root/bench/fair_bench.sh" 2>&1 | tee "$OUT/bench.log" ;;
    gemm)
      # shellcheck disable=SC2086  # GEMM_ARGS is a list of arguments
      /tmp/qb/kernels/tuned_gemm_bench ${GEMM_ARGS:-} 2>&1 | tee "$OUT/gemm.txt" ;;
    dequant)
      /tmp/qb/kernels/dequantize_bench 2>&1 | tee "$OUT/dequant.txt" ;;
    lora-grads)
      /tmp/qb/kernels/lora_gradients_bench 2>&1 | tee "$OUT/lora_grads.txt" ;;
    ncu)
      # shellcheck disable=SC2086  # NCU_ARGS and NCU_RUN are lists of arguments
      ncu --clock-control none ${NCU_ARGS:-} /tmp/qb/${NCU_RUN:?} > "$OUT/ncu.txt" 2>&1 ;;
  esac
done
