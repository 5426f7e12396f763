#!/usr/bin/env bash
# Build llama.cpp's own `llama-speculative-simple` example and `llama-server` from the llama.cpp
# that the installed llama-cpp-python carries (same revision as the bindings edgespec uses), for
# side-by-side benchmarks (scripts/bench_vs_llamacpp.py, scripts/bench_vs_llama_server.py).
# ~6 minutes on 2 cores (each target).
#   bash scripts/build_llama_speculative.sh [BUILD_DIR [TARGET …]]
#   (default: .cache/llama.cpp-build, llama-speculative-simple)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.cache/llama.cpp-build}"
shift || true
targets=("${@:-llama-speculative-simple}")
ver="$(python -c 'import llama_cpp; print(llama_cpp.__version__)')"
src=".cache/llama-cpp-python-$ver"
if [ ! -d "$src" ]; then
  mkdir -p .cache
  python -m pip download --quiet --no-deps --no-binary :all: -d .cache "llama-cpp-python==$ver"
  tar -xzf ".cache/llama_cpp_python-$ver.tar.gz" -C .cache
  mv ".cache/llama_cpp_python-$ver" "$src"
fi
# CMAKE_ARGS as for llama-cpp-python's own build (e.g. the flags without AMX that an AMX
# machine needs: docs/decisions.md).
# shellcheck disable=SC2086
cmake -S "$src/vendor/llama.cpp" -B "$out" -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_BUILD_TESTS=OFF ${CMAKE_ARGS:-} > /dev/null
cmake --build "$out" --target "${targets[@]}" -j "$(nproc)" > /dev/null
for t in "${targets[@]}"; do echo "$out/bin/$t"; done
