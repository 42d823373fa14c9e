#!/usr/bin/env bash
# Here: downloads ray[default]==2.60.0 and its dependencies as wheels for the GPU machine's Python
# 3.12 and packs them into three carry folders of ~36 MB (.device-ray-1..3; a single carry is
# limited to 64 MiB and the wheels are ~108 MB). Carry one per `run` call; on the machine,
# scripts/device/gpu_ray_run.sh stash N keeps each part in /tmp until the last one arrives.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any -r "$root/scripts/requirements-ray.txt" -d "$tmp/raywhl"
tar -C "$tmp" -cf "$tmp/ray.tar" raywhl
rm -rf "$root"/.device-ray-*
size=$(stat -c %s "$tmp/ray.tar")
split -n 3 -d "$tmp/ray.tar" "$tmp/part-"
for i in 1 2 3; do mkdir -p "$root/.device-ray-$i" && mv "$tmp/part-0$((i - 1))" "$root/.device-ray-$i/part"; done
rm -rf "$tmp"
echo "ray wheels: $size bytes in .device-ray-1..3"
