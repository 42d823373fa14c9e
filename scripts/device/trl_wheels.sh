#!/usr/bin/env bash
# Makes .device-trl/ here: what bench/anchor_trl_dpo.py (TRL's DPOTrainer, the DPO anchor) needs
# that the GPU machine's image lacks (its image has pyarrow, pandas, python-dateutil and xxhash),
# as Python 3.12 manylinux wheels; `run_on_gpu.sh trl-install` installs what it was given into
# /tmp/trlsite, which later calls on the same warm machine find there:
#   rest/   trl 1.16.0, datasets 5.2.0 and their small needs (the versions the reference
#           environment pins), liger-kernel 0.8.5
#   site/   bitsandbytes 0.50.2 unpacked, with only its CUDA 13 libraries (the wheel is 43 MB)
# Both (11 MB) travel in one call with the bundle (37 MB) and the tree.
# Ignored by git (.gitignore), never committed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/.device-trl
eval "$("$root/scripts/setup.sh" | grep -E '^PYENV=')"
download() {
  "$PYENV/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$1" "${@:2}"
}
rm -rf "$out" && mkdir -p "$out/rest" "$out/site"
download "$out/rest" trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 liger-kernel==0.8.5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
download "$tmp" bitsandbytes==0.50.2
unzip -q "$tmp"/bitsandbytes-*.whl -d "$out/site"
find "$out/site/bitsandbytes" -name 'libbitsandbytes_*.so' \
  ! -name 'libbitsandbytes_cpu.so' ! -name 'libbitsandbytes_cuda130.so' ! -name 'libbitsandbytes_cuda132.so' -delete
du -sh "$out"/*
