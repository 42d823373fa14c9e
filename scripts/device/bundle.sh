#!/usr/bin/env bash
# Builds everything here (CUDA kernels for sm_90 included) and packs the binaries, the test
# binaries and the non-system libraries they need into .device-bundle/, to be carried to the GPU
# machine (whose torch 2.11.0+cu130 is the same build as ours) and run there by run_on_gpu.sh.
# The whole bundle is ~40 MB: with .device-wheels/site (13 MB) and the tree it overruns the 64 MiB
# carry, so name the test binaries a run needs in BUNDLE_TESTS (below).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
out=$root/.device-bundle
if [ -n "${BUNDLE_TESTS:-}" ] && [ -f "$build/build.ninja" ]; then
  # Only what the bundle packs (the names the find below picks, tests by BUNDLE_TESTS): on a fresh
  # 2-core machine these took about 6 minutes and the rest of the tree as long again.
  mapfile -t wanted < <(ninja -C "$build" -t targets all | sed -n 's/^\([A-Za-z0-9_-]*\): phony$/\1/p' |
    while read -r name; do
      case "$name" in
        cmake_*) continue ;;  # CMake's order-only helpers
        qlora-*|qloractl|*_bench) echo "$name"; continue ;;
        *_test) ;;
        *) continue ;;
      esac
      for pattern in $BUNDLE_TESTS; do
        # shellcheck disable=SC2053  # the pattern is a glob on purpose
        if [[ $name == $pattern ]]; then echo "$name"; break; fi
      done
    done)
  "$root/scripts/build.sh" "${wanted[@]}"
else
  "$root/scripts/build.sh"
fi
rm -rf "$out" && mkdir -p "$out/tree/lib"
cd "$build"
mapfile -t bins < <(find . -type f -executable \( -name 'qlora-*' -o -name qloractl -o -name '*_test' -o -name '*_bench' \) -not -path '*/CMakeFiles/*')
# BUNDLE_TESTS="kernels_* engine_model_test": only the test binaries whose names match one of
# these globs (the service binaries always), so that the bundle and .device-wheels fit one carry.
if [ -n "${BUNDLE_TESTS:-}" ]; then
  kept=()
  for b in "${bins[@]}"; do
    name=$(basename "$b")
    case "$name" in *_test) ;; *) kept+=("$b"); continue ;; esac
    for pattern in $BUNDLE_TESTS; do
      # shellcheck disable=SC2053  # the pattern is a glob on purpose
      if [[ $name == $pattern ]]; then kept+=("$b"); break; fi
    done
  done
  bins=("${kept[@]}")
fi
for b in "${bins[@]}"; do
  mkdir -p "$out/tree/$(dirname "$b")"
  cp "$b" "$out/tree/$b"
  strip --strip-unneeded "$out/tree/$b" 2>/dev/null || true
done
# Libraries that the GPU machine's image lacks: everything outside torch, CUDA and glibc.
for b in "${bins[@]}"; do ldd "$b" | awk '/=> \//{print $3}'; done | sort -u | while read -r lib; do
  case "$lib" in
    */libtorch*|*/libc10*|*/libcaffe2*|*/libgomp*|*/libshm*|*/nvidia/*|/usr/local/cuda*) continue ;;
    */libc.so*|*/libm.so*|*/libdl.so*|*/librt.so*|*/libpthread.so*|*/ld-linux*|*/libstdc++*|*/libgcc_s*) continue ;;
  esac
  cp -L "$lib" "$out/tree/lib/"
done
cp /usr/lib/x86_64-linux-gnu/libsentencepiece.so.0 "$out/tree/lib/" 2>/dev/null || true
find . -name 'libqlora_spm*.so*' -exec cp -L {} "$out/tree/lib/" \;
tar -C "$out/tree" -cJf "$out/bundle.tar.xz" .
# The commit the binaries were built from, for the reports made there.
echo "$(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- . 2>/dev/null || echo ' + local changes')" > "$out/commit"
rm -rf "$out/tree"
du -sh "$out/bundle.tar.xz"
