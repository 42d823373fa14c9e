#!/usr/bin/env bash
# Makes .device-unsloth/site/ here: Unsloth and what it needs that the GPU machine's image lacks,
# unpacked for its Python 3.12, for the Unsloth anchor (bench/anchor_unsloth.py, the `unsloth*`
# parts of bench/fair_bench.sh). The list is the one the shared device README ("Unsloth as an
# anchor") saw run offline there:
#   unsloth 2026.10.9 and unsloth_zoo 2026.10.9 (the release beside it; unsloth wants >= that),
#   bitsandbytes 0.50.2, trl 1.15.0 (unsloth wants <= 1.15.0), datasets 4.8.5, torchao 0.18.0,
#   cut-cross-entropy 25.1.1, tyro, typeguard, docstring-parser, msgspec, multiprocess, dill,
#   json5, structlog, nest-asyncio, certifi >= 2026.10.19
# Every version named there exists. Those it leaves open are pinned to the newest release as of
# 2026-12-07 that fits the others (dill 0.4.1: datasets wants < 0.4.2, multiprocess >= 0.4.1;
# certifi 2026.10.19.post1 is the only release >= 2026.10.19). xformers, diffusers, pydantic and
# hf-transfer are left out: the anchor's path never imports them.
# Trimmed to about 37 MB, well under the 64 MiB a run carries (the bundle, ~38 MB, travels in a
# call of its own on the same warm machine; `run_on_gpu.sh unsloth-install` copies this folder to
# /tmp/unslothsite, where the later call finds it):
#   - unsloth's studio/ (its web app, ~82 MB) and unsloth_cli/, and the wheels' bin/ scripts
#   - bitsandbytes' libraries but the CUDA 13.0 one (the image's torch is cu130; the others are
#     ~120 MB)
#   - torchao's compiled _C*.so (~13.5 MB; bnb QLoRA uses none of its kernels) and its top-level
#     test/ package
# Ignored by git (.gitignore), never committed.
#   scripts/device/unsloth_wheels.sh          (a second run re-makes the folder)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/.device-unsloth
eval "$("$root/scripts/setup.sh" | grep -E '^PYENV=')"
py=$PYENV/bin/python
# The GPU machine's interpreter, not this one's: wheels for CPython 3.12 on manylinux x86-64.
target=(--only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download -q --no-deps "${target[@]}" -d "$tmp" \
  unsloth==2026.10.9 unsloth_zoo==2026.10.9 bitsandbytes==0.50.2 trl==1.15.0 datasets==4.8.5 \
  torchao==0.18.0 cut-cross-entropy==25.1.1 tyro==1.0.17 typeguard==4.6.1 docstring-parser==0.18.0 \
  msgspec==0.23.0 multiprocess==0.70.19 dill==0.4.1 json5==0.17.3 structlog==26.1.0 \
  nest-asyncio==1.6.0 certifi==2026.10.19.post1
rm -rf "$out" && mkdir -p "$out"
# pip rather than unzip: it lays out the wheels' .data folders and writes the dist-info that
# unsloth's version checks read; --no-compile: the .pyc files would be for this Python, not 3.12.
"$py" -m pip install -q --no-index --no-deps --no-compile "${target[@]}" --target "$out/site" "$tmp"/*.whl
site=$out/site
rm -rf "${site:?}/studio" "${site:?}/unsloth_cli" "${site:?}/bin" "${site:?}/test" "${site:?}"/torchao/_C*.so
find "$site/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name 'libbitsandbytes_cuda130.so' -delete
du -sh "$site"
