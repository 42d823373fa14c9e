#!/usr/bin/env bash
# On the GPU machine (run_on_gpu.sh ray-stash N | ray): the 7B benchmark job on both GPUs through
# local workers and through the Ray launcher (a Ray head on this machine holding both GPUs), one
# after the other with the same binaries, model and data; prints both figures.
#   gpu_ray_run.sh stash N   keeps .device-ray-N/part in /tmp (scripts/device/ray_wheels.sh)
#   gpu_ray_run.sh run       installs Ray from the parts, starts the head, runs both jobs
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
case "$1" in
  stash)
    mkdir -p /tmp/ray-parts && cp "$root/.device-ray-$2/part" "/tmp/ray-parts/part-$2" && ls -la /tmp/ray-parts
    exit 0 ;;
esac
site=/tmp/raysite
if [ ! -d "$site/ray" ]; then
  cat /tmp/ray-parts/part-1 /tmp/ray-parts/part-2 "$root/.device-ray-3/part" | tar -x -C /tmp
  python3 -m pip install -q --no-index --no-deps --target "$site" /tmp/raywhl/*.whl 2>&1 | tail -3
fi
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PATH=$site/bin:$PATH RAY_USAGE_STATS_ENABLED=0
ray start --head --num-gpus 2 --num-cpus 16 --dashboard-host 127.0.0.1 --dashboard-port 8265 \
  --disable-usage-stats > /tmp/ray-start.log 2>&1 || { tail -20 /tmp/ray-start.log; exit 1; }
model=/dev/shm/llama7b work=$(mktemp -d)
[ -f "$model/config.json" ] || timeout 240 python3 "$root/bench/make_llama_folder.py" "$model" 2>&1 | tail -2
python3 "$root/bench/make_text_data.py" "$work/bench.txt" --lines 200
export BENCH_WARMUP=3 BENCH_WINDOWS=3 BENCH_WINDOW_STEPS=5
for backend in local ray; do
  echo "== 2 GPUs, micro-batch 4, ZeRO-2, workers: $backend"
  if [ "$backend" = ray ]; then
    BENCH_RAY_ADDRESS=http://127.0.0.1:8265 BENCH_RAY_LAUNCHER="$root/deploy/ray/qlora_ray_launcher.py" \
      BENCH_LABEL=ours-ray BENCH_KEEP="$OUT/ray-job" "$root/bench/run_service_bench.sh" "$model" "$work/bench.txt" 0,1 4 2 18
  else
    BENCH_LABEL=ours-local "$root/bench/run_service_bench.sh" "$model" "$work/bench.txt" 0,1 4 2 18
  fi
done 2>&1 | tee "$OUT/ray-bench.txt"
ray stop --force > /dev/null 2>&1
