#!/usr/bin/env bash
# The client matrix (scripts/client_matrix.py) with the real third-party clients, installed from
# PyPI into a virtualenv of their own, .cache/clients-venv (git-ignored; the project's .venv is
# left alone). Start a server first, e.g.
#
#   edgespec serve --port 11434 --target SmolLM2-135M-Instruct.F16.gguf \
#       --draft SmolLM2-135M-Instruct.Q4_1.gguf --ctx-size 4096 > /tmp/serve.log 2>&1 &
#
# then
#
#   scripts/client_matrix.sh [URL] [client_matrix.py options]
#   scripts/client_matrix.sh http://127.0.0.1:11434 --server-log /tmp/serve.log
#
# URL defaults to http://127.0.0.1:11434; every other argument goes to client_matrix.py
# (--chat-model, --embed-model, --clients, --temperature, --json, --open-webui, ...). The
# Markdown table goes to stdout, the raw cells to .cache/client_matrix.json.
#
# The venv is made once (about 40 s and 500 MB here) and reused; CLIENT_MATRIX_REINSTALL=1
# makes it anew, CLIENT_MATRIX_UPGRADE=1 upgrades the clients to PyPI's newest. All nine
# resolve together in one venv (checked with llm 0.32, llama-index-core 0.14, pydantic-ai 2.31,
# instructor 1.17, openai 2.54, anthropic 2.17, ollama 0.6); should they ever conflict, the
# resolver's error names the pair, and CLIENT_MATRIX_SPLIT=1 puts llm and llama-index in a
# second venv, .cache/clients-venv2, whose rows run there.
#
# Open WebUI (--open-webui) is a server of its own, far heavier (torch with its CUDA wheels:
# about 7.4 GB and 2.5 minutes here), so it is never installed by default:
# CLIENT_MATRIX_OPENWEBUI=1 installs it into .cache/openwebui-venv, starts it (offline, its data
# in .cache/openwebui-data, its log in .cache/openwebui.log) with its Ollama connection on the
# matrix's logging proxy (port CLIENT_MATRIX_PROXY_PORT, 11500), so that its row's cells record
# what Open WebUI sent the server, runs the matrix with its row, and stops it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE="$ROOT/.cache"
URL=${1:-http://127.0.0.1:11434}
[ $# -gt 0 ] && shift
PYTHON=${PYTHON:-python3}
ALL=(llm llm-ollama llama-index-llms-ollama llama-index-embeddings-ollama instructor pydantic-ai
     openai ollama anthropic)
FIRST=(instructor pydantic-ai openai ollama anthropic)
SECOND=(llm llm-ollama llama-index-llms-ollama llama-index-embeddings-ollama)

make_venv() {  # make_venv DIR PACKAGE...
    local dir=$1
    shift
    if [ "${CLIENT_MATRIX_REINSTALL:-0}" = 1 ]; then
        rm -rf "$dir"
    fi
    if [ ! -x "$dir/bin/python" ] || [ "${CLIENT_MATRIX_UPGRADE:-0}" = 1 ] \
            || ! "$dir/bin/python" -m pip show "$@" > /dev/null 2>&1; then
        local start=$SECONDS
        mkdir -p "$CACHE"
        [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
        "$dir/bin/python" -m pip install -q --upgrade pip >&2
        "$dir/bin/python" -m pip install -q --upgrade "$@" >&2
        echo "client_matrix: $(basename "$dir"): installed in $((SECONDS - start)) s," \
             "$(du -sh "$dir" | cut -f1)" >&2
    fi
}

CLIENTS_VENV="$CACHE/clients-venv"
if [ "${CLIENT_MATRIX_SPLIT:-0}" = 1 ]; then
    make_venv "$CLIENTS_VENV" "${FIRST[@]}"
    make_venv "$CACHE/clients-venv2" "${SECOND[@]}"
else
    make_venv "$CLIENTS_VENV" "${ALL[@]}"
fi

WEBUI_PID=
cleanup() {
    if [ -n "$WEBUI_PID" ]; then
        kill "$WEBUI_PID" 2> /dev/null || true
        wait "$WEBUI_PID" 2> /dev/null || true
    fi
}
trap cleanup EXIT

EXTRA=()
if [ "${CLIENT_MATRIX_OPENWEBUI:-0}" = 1 ]; then
    WEBUI_VENV="$CACHE/openwebui-venv"
    make_venv "$WEBUI_VENV" open-webui
    WEBUI_PORT=${CLIENT_MATRIX_OPENWEBUI_PORT:-8080}
    PROXY_PORT=${CLIENT_MATRIX_PROXY_PORT:-11500}
    mkdir -p "$CACHE/openwebui-data"
    # Offline: no Hugging Face (its RAG embedding model is not fetched), no telemetry; the
    # Ollama connection is the matrix's proxy to the server (up while the matrix runs, which
    # is when Open WebUI asks it anything), the OpenAI one off.
    # ENABLE_PERSISTENT_CONFIG=False: the settings below hold, not those its database kept.
    OLLAMA_BASE_URL="http://127.0.0.1:$PROXY_PORT" ENABLE_OPENAI_API=False \
        ENABLE_PERSISTENT_CONFIG=False DATA_DIR="$CACHE/openwebui-data" OFFLINE_MODE=true \
        HF_HUB_OFFLINE=1 RAG_EMBEDDING_MODEL_AUTO_UPDATE=False \
        ANONYMIZED_TELEMETRY=False WEBUI_SECRET_KEY=client-matrix \
        "$WEBUI_VENV/bin/open-webui" serve --host 127.0.0.1 --port "$WEBUI_PORT" \
        > "$CACHE/openwebui.log" 2>&1 &
    WEBUI_PID=$!
    for _ in $(seq 1 120); do
        if "$CLIENTS_VENV/bin/python" -c "import urllib.request as u; \
u.urlopen('http://127.0.0.1:$WEBUI_PORT/health', timeout=2)" 2> /dev/null; then
            break
        fi
        if ! kill -0 "$WEBUI_PID" 2> /dev/null; then
            echo "open-webui died: see $CACHE/openwebui.log" >&2
            exit 1
        fi
        sleep 2
    done
    EXTRA=(--open-webui "http://127.0.0.1:$WEBUI_PORT" --proxy-port "$PROXY_PORT")
fi

SCRIPT="$ROOT/scripts/client_matrix.py"
if [ "${CLIENT_MATRIX_SPLIT:-0}" = 1 ]; then
    # Two runs, one per venv, each with its own rows; two tables and two JSON files.
    "$CLIENTS_VENV/bin/python" "$SCRIPT" "$URL" \
        --clients openai,ollama,anthropic,instructor,pydantic-ai \
        --json "$CACHE/client_matrix.json" "${EXTRA[@]}" "$@"
    "$CACHE/clients-venv2/bin/python" "$SCRIPT" "$URL" --clients llm,llama-index \
        --json "$CACHE/client_matrix2.json" "$@"
else
    "$CLIENTS_VENV/bin/python" "$SCRIPT" "$URL" --json "$CACHE/client_matrix.json" \
        "${EXTRA[@]}" "$@"
fi
