#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian machine, once per machine:
#   - Debian packages (compilers, gRPC, protobuf, Abseil, yaml-cpp, SQLite, GoogleTest, Gloo, ...)
#   - LibTorch, unpacked from the pinned torch==2.11.0 wheel into a versioned cache outside the
#     checkout ($QLORA_CACHE, default ~/.cache/qlora), reused by every later clone.
#   - Apache Arrow/Parquet C++ (headers and libarrow/libparquet), unpacked from the pinned
#     pyarrow==26.0.1 wheel into the same kind of versioned cache: Debian has no Arrow package.
#   - A Python virtual environment for the reference tests only (transformers, peft, ...):
#     never used by the product; and two more for servers the tests start (Ray, MLflow).
# A second run does nothing but checks. Prints the cache paths it set up.
set -euo pipefail
TORCH_VERSION=2.11.0
CACHE=${QLORA_CACHE:-$HOME/.cache/qlora}
LIBTORCH=$CACHE/libtorch-$TORCH_VERSION-v2
PYENV=$CACHE/pyenv-$TORCH_VERSION-v1
ARROW_VERSION=26.0.1
ARROW=$CACHE/arrow-$ARROW_VERSION-v1
RAY_VERSION=2.60.0
RAYENV=$CACHE/rayenv-$RAY_VERSION-v1
# llama.cpp's own Hugging Face -> GGUF converter (convert_hf_to_gguf.py with its conversion/ and
# gguf-py/ packages), from the llama-cpp-python source release that vendors it: the GGUF export's
# parity test runs it beside ours. Only those files are kept; nothing is built.
LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMACPP=$CACHE/llamacpp-convert-$LLAMA_CPP_PYTHON_VERSION-v1
MLFLOW_VERSION=3.17.2
MLFLOWENV=$CACHE/mlflowenv-$MLFLOW_VERSION-v1
mkdir -p "$CACHE"

debian_packages=(build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libyaml-cpp-dev libsqlite3-dev sqlite3 libgtest-dev libgmock-dev libgloo-dev
  libsentencepiece-dev nlohmann-json3-dev libpcre2-dev libicu-dev libssl-dev openssl libcurl4-openssl-dev
  prometheus-cpp-dev libcivetweb-dev chromium
  iproute2 curl unzip python3-venv python3-pip
  clang libclang-rt-14-dev llvm)
# prometheus-cpp-dev: the metric types and Prometheus text format of the --metrics-address port
# (libcivetweb-dev only because prometheus-cpp's CMake package requires it);
# chromium: the status page's browser test (large, installed once per machine).
# libicu-dev: Unicode normalization for tokenizer.json normalizers (Qwen2 NFC).
# libcurl4-openssl-dev: the coordinator's Ray launcher (HTTP to Ray's dashboard); iproute2 and
# curl: the multi-host test's network namespaces and its wait for the Ray cluster.
# clang, libclang-rt-14-dev (the ASan/UBSan/libFuzzer runtimes; only a recommendation of clang,
# so named here) and llvm (llvm-symbolizer, for readable sanitizer stacks): the sanitizer build
# and the fuzz targets of scripts/fuzz_and_sanitize.sh.
missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=python3
extra_cuda_wheels=(nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5 nvidia-cufile==1.15.1.6)
if [ ! -f "$LIBTORCH/.complete" ]; then
  echo "setup: fetching torch==$TORCH_VERSION wheel for LibTorch (once per machine)"
  tmp=$(mktemp -d "$CACHE/dl.XXXXXX")
  $PY -m pip download -q --no-deps --only-binary=:all: "torch==$TORCH_VERSION" -d "$tmp"
  rm -rf "$LIBTORCH"; mkdir -p "$LIBTORCH"
  whl=$(ls "$tmp"/torch-*.whl)
  ( cd "$LIBTORCH" && unzip -q "$whl" 'torch/lib/*' 'torch/include/*' 'torch/share/*' )
  # The CUDA libraries that libtorch_cuda needs and the system toolkit lacks; unpacked where
  # the torch libraries' RPATH ($ORIGIN/../../nvidia/*/lib) looks for them.
  $PY -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "${extra_cuda_wheels[@]}"
  for w in "$tmp"/nvidia_*.whl; do ( cd "$LIBTORCH" && unzip -q -o "$w" 'nvidia/*' ); cp "$w" "$LIBTORCH/"; done
  cp "$whl" "$LIBTORCH/"                 # kept for the Python reference environment
  rm -rf "$tmp"
  touch "$LIBTORCH/.complete"
fi

# Arrow C++ for the Parquet reader (common/dataset/parquet_reader.cc): the pyarrow wheel ships
# its headers and its shared libraries (built with the C++11 ABI, as LibTorch and Debian's
# libraries are; linking checks it). Only libarrow and libparquet are kept, with the
# unversioned names the linker looks for; the wheel stays for the Python environment.
if [ ! -f "$ARROW/.complete" ]; then
  echo "setup: fetching pyarrow==$ARROW_VERSION wheel for Arrow/Parquet C++ (once per machine)"
  tmp=$(mktemp -d "$CACHE/dl.XXXXXX")
  $PY -m pip download -q --no-deps --only-binary=:all: "pyarrow==$ARROW_VERSION" -d "$tmp"
  rm -rf "$ARROW"; mkdir -p "$ARROW/lib"
  whl=$(ls "$tmp"/pyarrow-*.whl)
  ( cd "$tmp" && unzip -q "$whl" 'pyarrow/include/arrow/*' 'pyarrow/include/parquet/*' \
      'pyarrow/libarrow.so.*' 'pyarrow/libparquet.so.*' )
  mv "$tmp/pyarrow/include" "$ARROW/include"
  for lib in arrow parquet; do
    so=$(cd "$tmp/pyarrow" && ls lib$lib.so.*)
    mv "$tmp/pyarrow/$so" "$ARROW/lib/"
    ln -s "$so" "$ARROW/lib/lib$lib.so"
  done
  cp "$whl" "$ARROW/"
  rm -rf "$tmp"
  touch "$ARROW/.complete"
fi

# The environment records the hash of the pinned list it was synced to (.complete); a changed
# list re-syncs the packages in place (pip installs only what differs).
requirements="$(cd "$(dirname "$0")" && pwd)/requirements-test.txt"
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ "${QLORA_SKIP_PYENV:-0}" != 1 ] && [ ! -x "$PYENV/bin/python" ]; then
  echo "setup: creating the Python reference environment (tests only)"
  rm -rf "$PYENV"
  $PY -m venv "$PYENV"
  "$PYENV/bin/pip" install -q --upgrade pip
  # torch without its nvidia-* wheels: the CUDA libraries come from the system toolkit.
  "$PYENV/bin/pip" install -q --no-deps "$LIBTORCH"/torch-*.whl "$LIBTORCH"/nvidia_*.whl
fi
if [ "${QLORA_SKIP_PYENV:-0}" != 1 ] && [ "$(cat "$PYENV/.complete" 2>/dev/null)" != "$want" ]; then
  echo "setup: syncing the Python reference environment to $(basename "$requirements")"
  # --find-links: pyarrow comes from the wheel kept in the Arrow cache, not a second download.
  "$PYENV/bin/pip" install -q --find-links "$ARROW" -r "$requirements"
  echo "$want" > "$PYENV/.complete"
fi
if [ "${QLORA_SKIP_PYENV:-0}" != 1 ] && [ ! -f "$LLAMACPP/.complete" ]; then
  echo "setup: fetching llama.cpp's GGUF converter (llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION source, once per machine)"
  tmp=$(mktemp -d "$CACHE/dl.XXXXXX")
  "$PYENV/bin/pip" download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$tmp"
  tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp" --wildcards '*/vendor/llama.cpp/convert_hf_to_gguf.py' \
    '*/vendor/llama.cpp/conversion/*' '*/vendor/llama.cpp/gguf-py/*'
  rm -rf "$LLAMACPP" && mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$LLAMACPP"
  rm -rf "$tmp"
  touch "$LLAMACPP/.complete"
fi
# A server the tests start, in an environment of its own synced to its pinned list (the hash of
# the list it was synced to is in .complete): sync_server_env WHAT FOLDER REQUIREMENTS.
sync_server_env() {
  local what=$1 env=$2 list
  list="$(cd "$(dirname "$0")" && pwd)/$3"
  local wanted
  wanted=$(sha256sum "$list" | cut -d' ' -f1)
  [ "${QLORA_SKIP_PYENV:-0}" != 1 ] || return 0
  [ "$(cat "$env/.complete" 2>/dev/null)" != "$wanted" ] || return 0
  echo "setup: syncing the $what environment to $3"
  [ -x "$env/bin/python" ] || $PY -m venv "$env"
  "$env/bin/pip" install -q -r "$list"
  echo "$wanted" > "$env/.complete"
}
sync_server_env "Ray test cluster's" "$RAYENV" requirements-ray.txt          # the multi-host tests
sync_server_env "MLflow test server's" "$MLFLOWENV" requirements-mlflow.txt  # report_to: mlflow
echo "LIBTORCH=$LIBTORCH/torch"
echo "PYENV=$PYENV"
echo "ARROW=$ARROW"
echo "RAYENV=$RAYENV"
echo "MLFLOWENV=$MLFLOWENV"
echo "LLAMACPP=$LLAMACPP"
