#!/usr/bin/env bash
# Build llama.cpp's own `llama-speculative-simple` example from the llama.cpp that the installed
# llama-cpp-python carries (same revision as the bindings edgespec uses), for side-by-side
# benchmarks (scripts/bench_vs_llamacpp.py). ~6 minutes on 2 cores.
#   bash scripts/build_llama_speculative.sh [BUILD_DIR]     (default: .cache/llama.cpp-build)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.cache/llama.cpp-build}"
ver="$(python -c 'import llama_cpp; print(llama_cpp.__version__)')"
src=".cache/llama-cpp-python-$ver"
if [ ! -d "$src" ]; then
  mkdir -p .cache
  python -m pip download --quiet --no-deps --no-binary :all: -d .cache "llama-cpp-python==$ver"
  tar -xzf ".cache/llama_cpp_python-$ver.tar.gz" -C .cache
  mv ".cache/llama_cpp_python-$ver" "$src"
fi
cmake -S "$src/vendor/llama.cpp" -B "$out" -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_BUILD_TESTS=OFF > /dev/null
cmake --build "$out" --target llama-speculative-simple -j "$(nproc)" > /dev/null
echo "$out/bin/llama-speculative-simple"
