#!/usr/bin/env bash
# Makes .device-wheels/ here: the Python packages the anchors need that the GPU machine's image
# lacks (it is offline; its python3 is 3.12 with torch 2.11.0+cu130, transformers, peft,
# accelerate, triton 3.6.0, ninja, psutil, py-cpuinfo, msgpack, einops, tqdm, nvidia-ml-py).
# Carried with `carry: [".device-wheels", ...]`; ignored by git (.gitignore), never
# committed. Pinned:
#   site/  unpacked, put on PYTHONPATH by run_on_gpu.sh:
#          bitsandbytes 0.50.2 with only its CPU, CUDA 13.0 and 13.2 libraries (the wheel's other
#          CUDA builds are 130 MB, over the 64 MiB a run carries), and liger-kernel 0.8.5 (pure
#          Python + Triton; needs torch >= 2.1.2 and triton >= 2.3.1, both in the image)
#   ds/    wheels that bench/fair_bench.sh installs there into /tmp/dssite for the DeepSpeed anchor:
#          deepspeed 0.19.8 (built here from its source archive with DS_BUILD_OPS=0, so its ops
#          compile on first use; the anchor uses none) and what it needs that the image lacks:
#          hjson, pydantic with its exact pydantic-core, annotated-types, typing-inspection,
#          typing-extensions
#   scripts/device/wheels.sh          (a second run re-makes the folder)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/.device-wheels
# A Python with torch is needed to build DeepSpeed's wheel: the project's reference environment.
eval "$("$root/scripts/setup.sh" | grep -E '^PYENV=')"
py=$PYENV/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
download() {
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$1" "${@:2}"
}
rm -rf "$out" && mkdir -p "$out/site" "$out/ds"

download "$tmp/site" bitsandbytes==0.50.2 liger-kernel==0.8.5
for w in "$tmp"/site/*.whl; do unzip -q -o "$w" -d "$out/site"; done
find "$out/site/bitsandbytes" -name 'libbitsandbytes_*.so' \
  ! -name 'libbitsandbytes_cpu.so' ! -name 'libbitsandbytes_cuda130.so' ! -name 'libbitsandbytes_cuda132.so' -delete

download "$out/ds" hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing-extensions==4.16.0
# Without build isolation (its setup.py imports torch), with the `wheel` package beside it.
"$py" -m pip install -q --no-deps --target "$tmp/build" wheel==0.48.0
DS_BUILD_OPS=0 PYTHONPATH="$tmp/build" "$py" -m pip wheel -q --no-deps --no-build-isolation --no-binary=:all: \
  -w "$out/ds" deepspeed==0.19.8

# Every wheel's own needs are in the image or here (a check, not a resolver).
for w in "$out"/ds/*.whl "$tmp"/site/*.whl; do
  { unzip -p "$w" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' || true; } | sed "s|^|$(basename "$w"): |"
done
du -sh "$out" "$out/site" "$out/ds"
