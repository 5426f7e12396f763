#!/usr/bin/env python3
"""Drive a running ``edgespec serve`` with real third-party client libraries and print a table
client × feature: which of the clients people use against Ollama, OpenAI and Anthropic servers
work against edgespec, each through its own API.

    scripts/client_matrix.sh [URL] [options]       # makes .cache/clients-venv, then runs this
    python scripts/client_matrix.py [URL] [--chat-model smollm2-135m] [--embed-model all-minilm]
        [--clients openai,ollama,...] [--timeout 60] [--json .cache/client_matrix.json]
        [--server-log /tmp/serve.log] [--open-webui [http://127.0.0.1:8080]]

URL is the server's root (default http://127.0.0.1:11434). Rows (each client's imports sit in a
try block, so a client that is missing shows "not installed" in its row):

- ``openai``: the OpenAI SDK on /v1 (models.list, chat.completions create/stream, tools with a
  named tool_choice and the tool's result sent back, ``chat.completions.parse`` with a Pydantic
  response_format, embeddings.create);
- ``ollama``: the ollama library on /api (list, chat, stream, tools= a Python function and the
  result sent back, format= a JSON schema, embed);
- ``anthropic``: the Anthropic SDK on /v1/messages (models.list, create, stream, a forced tool
  and its tool_result, ``messages.parse(output_format=...)``);
- ``llm``: Simon Willison's llm with llm-ollama (llm.get_models, prompt, streamed prompt,
  ``conversation().chain(tools=[...])``, ``prompt(schema=...)``, and ``llm embed -m MODEL -c
  TEXT`` run as a command);
- ``llama-index``: llama-index-llms-ollama and -embeddings-ollama (chat, stream_chat,
  FunctionCallingLLM.predict_and_call, structured_predict, OllamaEmbedding);
- ``instructor``: ``instructor.from_openai(OpenAI(base_url=.../v1))``: stream is
  ``create_partial``, structured is ``create``, both in ``--instructor-mode`` (JSON_SCHEMA; JSON
  puts the schema in the prompt only), tools is ``create`` in Mode.TOOLS;
- ``pydantic-ai``: OpenAIChatModel with OllamaProvider on /v1 (Agent.run_sync, run_stream, a
  tool, output_type=a Pydantic model, Embedder with OpenAIEmbeddingModel);
- ``open-webui`` (only with ``--open-webui``): Open WebUI's own API in front of the server, see
  :func:`openwebui_cells`.

Each cell is "ok: <short proof>", "FAIL: <one-line error>" or "n/a" (the client has no such
feature). Every client talks to the server through a small logging proxy started here (turn it
off with ``--no-proxy``), so each cell's JSON record holds the requests the client really sent
and what came back: a failed cell carries the request body, the status and the answer's start,
and with ``--server-log`` the server's log lines written while the cell ran. Each client's own
timeout is ``--timeout``, retries are off where the client has them, and a cell still running
after 3 × ``--timeout`` is abandoned. Output: a Markdown table on stdout, the raw cells as JSON
in ``--json``.

The model is small (SmolLM2-135M by default): its answers are poor, but the protocol must work;
tool calls and structured answers are grammar-constrained by the server, and where a client can
force the tool (tool_choice) it does, so a cell fails on the protocol rather than on the model
choosing to answer in prose.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional

FEATURES = ("models", "chat", "stream", "tools", "structured", "embeddings")
CLIENTS = ("openai", "ollama", "anthropic", "llm", "llama-index", "instructor", "pydantic-ai")
DISTS = {  # the row's distributions, for the versions shown in its first column
    "openai": ("openai",), "ollama": ("ollama",), "anthropic": ("anthropic",),
    "llm": ("llm", "llm-ollama"),
    "llama-index": ("llama-index-llms-ollama", "llama-index-embeddings-ollama"),
    "instructor": ("instructor",), "pydantic-ai": ("pydantic-ai-slim",),
    "open-webui": ("open-webui",),
}

CHAT_PROMPT = "Say hello in one short sentence."
TOOL_PROMPT = "What is the weather in Paris right now? Use the get_weather tool."
STRUCT_PROMPT = ("Give the capital of France as JSON with its name, its country and its "
                 "population.")
EMBED_TEXT = "The quick brown fox jumps over the lazy dog."
TOOL_SCHEMA = {"type": "object", "properties": {"city": {"type": "string",
                                                         "description": "The city's name"}},
               "required": ["city"]}
TOOL_DESCRIPTION = "Get the current weather in a city."

CALLS: list[dict] = []  # get_weather's calls in the cell that runs
LOOP_LIMIT = 3  # model requests in a client's own tool loop (llm, pydantic-ai)


def _looped(calls: int) -> str:
    return f"called it again ×{calls - 1} (loop stopped at {LOOP_LIMIT} requests)"


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: The city's name
    """
    CALLS.append({"city": city})
    return f"Sunny and 21 C in {city}."


try:
    from pydantic import BaseModel

    class City(BaseModel):
        """A city: its name, its country and its population."""

        name: str
        country: str
        population: int
except ImportError:  # every client below needs pydantic; without it their rows fail anyway
    City = None  # type: ignore[assignment,misc]


class Config:
    def __init__(self, args: argparse.Namespace, base: str):
        self.base = base.rstrip("/")          # where the clients connect (the proxy or the server)
        self.v1 = self.base + "/v1"
        self.chat_model = args.chat_model
        self.embed_model = args.embed_model
        self.timeout = args.timeout
        self.max_tokens = args.max_tokens
        self.json_tokens = args.json_tokens   # tool calls and structured answers: room for JSON
        self.openwebui_url = args.open_webui
        self.instructor_mode = args.instructor_mode
        self.openwebui_version = ""  # read from its /api/version
        # greedy unless asked otherwise, so that a run can be repeated answer for answer
        self.temp = {} if args.temperature < 0 else {"temperature": args.temperature}
        self.llm_user_dir = tempfile.mkdtemp(prefix="client-matrix-llm-")


def _short(value: Any, n: int = 40) -> str:
    """A proof's few characters: a text quoted, anything else as its repr."""
    text = " ".join((value if isinstance(value, str) else repr(value)).split())
    text = text[:n] + ("…" if len(text) > n else "")
    return f"'{text}'" if isinstance(value, str) else text


def _listed(names: list[str], model: str) -> str:
    found = model in names or f"{model}:latest" in names
    return f"{len(names)} models, {model} {'listed' if found else 'NOT listed'}"


def _then(text: Optional[str], calls: Any) -> str:
    """What the model did with the tool's result sent back: answered, or called again (a
    small model often does; the round trip itself worked)."""
    if calls:
        return "called it again"
    return f"answered {_short(text or '', 25)}"


def _one_line(e: BaseException) -> str:
    text = str(e)
    if text.lstrip().startswith("<failed_attempts>"):  # instructor: the last attempt's error
        errors = re.findall(r"<exception>\s*(.*?)\s*</exception>", text, re.S)
        text = f"{errors[-1] if errors else text} (after {text.count('<generation ')} attempts)"
    text = " ".join(text.split()) or "(no message)"
    return f"{type(e).__name__}: {text[:300]}"


# ---------------------------------------------------------------------------------------------
# The logging proxy: every client connects here, and each request/answer is kept for the cells.

HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
       "upgrade", "content-length", "host"}


def _clip(data: bytes, n: int = 3000) -> str:
    text = data.decode("utf-8", "replace")
    return text if len(text) <= n else f"{text[:n // 2]} …({len(text)} chars)… {text[-n // 2:]}"


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[dict] = []

    def add(self, item: dict) -> None:
        with self.lock:
            self.items.append(item)

    def mark(self) -> int:
        with self.lock:
            return len(self.items)

    def since(self, mark: int, wait: float = 2.0) -> list[dict]:
        """The exchanges begun since ``mark``; one still being answered (the proxy finishes
        its record just after the client has its answer) is waited for a moment."""
        end = time.monotonic() + wait
        while True:
            with self.lock:
                items = list(self.items[mark:])
            if time.monotonic() > end or not any("at" in x for x in items):
                return [dict(x) for x in items]
            time.sleep(0.02)


def start_proxy(upstream: str, recorder: Recorder, port: int = 0) -> ThreadingHTTPServer:
    """A loopback HTTP proxy to ``upstream`` that records each exchange; streamed answers
    pass through as they come (HTTP/1.0, the body ends when the connection closes)."""
    up = urllib.parse.urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args: Any) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _forward(self) -> None:
            body = self._body()
            rec: dict[str, Any] = {"method": self.command, "path": self.path,
                                   "request": _clip(body, 6000), "at": time.time()}
            recorder.add(rec)  # in the order the requests came; completed below
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            headers["Host"] = up.netloc
            headers["Connection"] = "close"
            conn = http.client.HTTPConnection(up.hostname, up.port or 80, timeout=3600)
            try:
                conn.request(self.command, up.path.rstrip("/") + self.path,
                             body=body if self.command not in ("GET", "HEAD") else None,
                             headers=headers)
                resp = conn.getresponse()
            except OSError as e:
                rec["status"], rec["response"] = 502, f"proxy: {_one_line(e)}"
                rec.pop("at")
                self.send_error(502, rec["response"])
                return
            rec["status"] = resp.status
            self.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in HOP and k.lower() not in ("server", "date"):
                    self.send_header(k, v)
            length = resp.getheader("Content-Length")
            try:
                if length is not None:
                    data = resp.read()
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:
                    self.end_headers()
                    data = b""
                    while chunk := resp.read1(65536):
                        data += chunk
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    rec["streamed"] = True
            except OSError as e:  # the client went away, or the server did
                rec["broken"] = _one_line(e)
                data = b""
            finally:
                conn.close()
            rec["response"] = _clip(data)
            rec["seconds"] = round(time.time() - rec.pop("at"), 2)
            self.close_connection = True

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _forward

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class ServerLog:
    """The server's log lines written while a cell ran (``--server-log``), less the access
    lines of answers that went well."""

    OK_ACCESS = re.compile(r'INFO:\s+\S+ - ".*" [23]\d\d ')

    def __init__(self, path: Optional[str]):
        self.path = Path(path) if path else None

    def mark(self) -> int:
        return self.path.stat().st_size if self.path and self.path.exists() else 0

    def since(self, mark: int) -> list[str]:
        if not self.path or not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(mark)
            lines = f.read().decode("utf-8", "replace").splitlines()
        return [line for line in lines if line.strip() and not self.OK_ACCESS.search(line)][-40:]


# ---------------------------------------------------------------------------------------------
# The clients: each returns {feature: a function returning the cell's proof, or None for n/a}.
# An ImportError while building the row marks the row "not installed".

Cells = dict[str, Optional[Callable[[], str]]]


def openai_cells(cfg: Config) -> Cells:
    from openai import OpenAI

    client = OpenAI(base_url=cfg.v1, api_key="edgespec", timeout=cfg.timeout, max_retries=0)
    user = [{"role": "user", "content": CHAT_PROMPT}]
    tool = {"type": "function", "function": {"name": "get_weather",
                                             "description": TOOL_DESCRIPTION,
                                             "parameters": TOOL_SCHEMA}}

    def models() -> str:
        ids = [m.id for m in client.models.list()]
        return _listed(ids, cfg.chat_model)

    def chat() -> str:
        r = client.chat.completions.create(model=cfg.chat_model, messages=user,
                                           max_tokens=cfg.max_tokens, **cfg.temp)
        return _short(r.choices[0].message.content)

    def stream() -> str:
        parts = []
        for chunk in client.chat.completions.create(model=cfg.chat_model, messages=user,
                                                    max_tokens=cfg.max_tokens, **cfg.temp,
                                                    stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        if not parts:
            raise RuntimeError("no content in the stream")
        return f"{len(parts)} deltas: {_short(''.join(parts), 30)}"

    def tools() -> str:
        messages: list[dict] = [{"role": "user", "content": TOOL_PROMPT}]
        r = client.chat.completions.create(
            model=cfg.chat_model, messages=messages, tools=[tool],
            max_tokens=cfg.json_tokens, **cfg.temp,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        msg = r.choices[0].message
        if not msg.tool_calls:
            raise RuntimeError(f"no tool call; content {_short(msg.content)}")
        call = msg.tool_calls[0]
        result = get_weather(**json.loads(call.function.arguments))
        messages += [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": result}]
        r2 = client.chat.completions.create(model=cfg.chat_model, messages=messages,
                                            tools=[tool], max_tokens=cfg.max_tokens, **cfg.temp)
        then = _then(r2.choices[0].message.content, r2.choices[0].message.tool_calls)
        return f"{call.function.name}({call.function.arguments}), then {then}"

    def structured() -> str:
        r = client.chat.completions.parse(model=cfg.chat_model, response_format=City,
                                          messages=[{"role": "user", "content": STRUCT_PROMPT}],
                                          max_tokens=cfg.json_tokens, **cfg.temp)
        return _short(r.choices[0].message.parsed, 60)

    def embeddings() -> str:
        r = client.embeddings.create(model=cfg.embed_model, input=[EMBED_TEXT, "hello"])
        return f"{len(r.data)} vectors, dim {len(r.data[0].embedding)}"

    return {"models": models, "chat": chat, "stream": stream, "tools": tools,
            "structured": structured, "embeddings": embeddings}


def ollama_cells(cfg: Config) -> Cells:
    import ollama

    client = ollama.Client(host=cfg.base, timeout=cfg.timeout)
    user = [{"role": "user", "content": CHAT_PROMPT}]

    def models() -> str:
        names = [m.model for m in client.list().models]
        listed = cfg.chat_model in names or f"{cfg.chat_model}:latest" in names
        return f"{len(names)} models, {cfg.chat_model} {'listed' if listed else 'NOT listed'}"

    def chat() -> str:
        r = client.chat(model=cfg.chat_model, messages=user,
                        options={"num_predict": cfg.max_tokens, **cfg.temp})
        return _short(r.message.content)

    def stream() -> str:
        parts = [c.message.content for c in client.chat(
            model=cfg.chat_model, messages=user, stream=True,
            options={"num_predict": cfg.max_tokens, **cfg.temp}) if c.message.content]
        if not parts:
            raise RuntimeError("no content in the stream")
        return f"{len(parts)} chunks: {_short(''.join(parts), 30)}"

    def tools() -> str:
        messages: list[Any] = [{"role": "user", "content": TOOL_PROMPT}]
        r = client.chat(model=cfg.chat_model, messages=messages, tools=[get_weather],
                        options={"num_predict": cfg.json_tokens, **cfg.temp})
        if not r.message.tool_calls:
            raise RuntimeError(f"no tool call (ollama has no tool_choice); content "
                               f"{_short(r.message.content)}")
        call = r.message.tool_calls[0]
        result = get_weather(**call.function.arguments)
        messages += [r.message, {"role": "tool", "tool_name": call.function.name,
                                 "content": result}]
        r2 = client.chat(model=cfg.chat_model, messages=messages, tools=[get_weather],
                         options={"num_predict": cfg.max_tokens, **cfg.temp})
        then = _then(r2.message.content, r2.message.tool_calls)
        return f"{call.function.name}({json.dumps(dict(call.function.arguments))}), then {then}"

    def structured() -> str:
        r = client.chat(model=cfg.chat_model, format=City.model_json_schema(),
                        messages=[{"role": "user", "content": STRUCT_PROMPT}],
                        options={"num_predict": cfg.json_tokens, **cfg.temp})
        return _short(City.model_validate_json(r.message.content), 60)

    def embeddings() -> str:
        r = client.embed(model=cfg.embed_model, input=[EMBED_TEXT, "hello"])
        return f"{len(r.embeddings)} vectors, dim {len(r.embeddings[0])}"

    return {"models": models, "chat": chat, "stream": stream, "tools": tools,
            "structured": structured, "embeddings": embeddings}


def anthropic_cells(cfg: Config) -> Cells:
    import anthropic

    client = anthropic.Anthropic(base_url=cfg.base, api_key="edgespec", timeout=cfg.timeout,
                                 max_retries=0)
    user = [{"role": "user", "content": CHAT_PROMPT}]
    # the SDK (2.x) has no temperature argument any more: it goes in the body as it is
    extra = {"extra_body": cfg.temp} if cfg.temp else {}
    tool = {"name": "get_weather", "description": TOOL_DESCRIPTION, "input_schema": TOOL_SCHEMA}

    def models() -> str:
        page = client.models.list()
        ids = [m.id for m in page.data]
        # what a client shows from Anthropic's list: the SDK builds its objects without
        # checking them, so a missing field only shows when it is read
        missing = [f for f in ("type", "display_name", "created_at")
                   if page.data and getattr(page.data[0], f, None) is None]
        if missing:
            raise RuntimeError(f"{len(ids)} models, but the items lack Anthropic's "
                               f"{', '.join(missing)} (OpenAI's list shape)")
        return _listed(ids, cfg.chat_model)

    def chat() -> str:
        r = client.messages.create(model=cfg.chat_model, max_tokens=cfg.max_tokens, **extra,
                                   messages=user)
        return _short("".join(b.text for b in r.content if b.type == "text"))

    def stream() -> str:
        with client.messages.stream(model=cfg.chat_model, max_tokens=cfg.max_tokens, **extra,
                                    messages=user) as s:
            parts = list(s.text_stream)
            final = s.get_final_message()
        if not parts:
            raise RuntimeError(f"no text in the stream (stop_reason {final.stop_reason})")
        return f"{len(parts)} deltas: {_short(''.join(parts), 30)}"

    def tools() -> str:
        messages: list[dict] = [{"role": "user", "content": TOOL_PROMPT}]
        r = client.messages.create(model=cfg.chat_model, max_tokens=cfg.json_tokens, **extra,
                                   messages=messages, tools=[tool],
                                   tool_choice={"type": "tool", "name": "get_weather"})
        uses = [b for b in r.content if b.type == "tool_use"]
        if not uses:
            raise RuntimeError(f"no tool_use block (stop_reason {r.stop_reason})")
        result = get_weather(**uses[0].input)
        messages += [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
                     {"role": "user", "content": [{"type": "tool_result",
                                                   "tool_use_id": uses[0].id,
                                                   "content": result}]}]
        r2 = client.messages.create(model=cfg.chat_model, max_tokens=cfg.max_tokens, **extra,
                                    messages=messages, tools=[tool])
        text = "".join(b.text for b in r2.content if b.type == "text")
        then = _then(text, [b for b in r2.content if b.type == "tool_use"])
        return f"{uses[0].name}({json.dumps(uses[0].input)}), then {then}"

    def structured() -> str:
        r = client.messages.parse(model=cfg.chat_model, max_tokens=cfg.json_tokens, **extra,
                                  messages=[{"role": "user", "content": STRUCT_PROMPT}],
                                  output_format=City)
        return _short(r.parsed_output, 60)

    return {"models": models, "chat": chat, "stream": stream, "tools": tools,
            "structured": structured, "embeddings": None}


def llm_cells(cfg: Config) -> Cells:
    # llm-ollama reads OLLAMA_HOST, and keeps its capability cache in llm's user directory,
    # which it fixes on import: a directory of this run's own, so no user's llm setup is read.
    os.environ["OLLAMA_HOST"] = cfg.base
    os.environ["LLM_USER_PATH"] = cfg.llm_user_dir
    import llm
    import llm_ollama.auth

    llm_ollama.auth.DEFAULT_REQUEST_TIMEOUT = cfg.timeout  # its default: no timeout at all

    def model() -> Any:
        return llm.get_model(cfg.chat_model)

    def models() -> str:
        names = [m.model_id for m in llm.get_models() if str(m).startswith("Ollama")]
        return f"{len(names)} Ollama models, {cfg.chat_model} " + (
            "registered" if model() else "NOT registered")

    def chat() -> str:
        r = model().prompt(CHAT_PROMPT, stream=False, num_predict=cfg.max_tokens, **cfg.temp)
        return _short(r.text())

    def stream() -> str:
        response = model().prompt(CHAT_PROMPT, num_predict=cfg.max_tokens, **cfg.temp)
        parts = [p for p in response if p]
        if not parts:
            raise RuntimeError("no content in the stream")
        return f"{len(parts)} chunks: {_short(''.join(parts), 30)}"

    def tools() -> str:
        chain = model().conversation().chain(
            TOOL_PROMPT, tools=[get_weather], stream=False, chain_limit=LOOP_LIMIT,
            options={"num_predict": cfg.json_tokens, **cfg.temp})
        try:
            text = chain.text()
        except ValueError as e:  # the chain limit: the model called the tool each turn
            if not CALLS or "Chain limit" not in str(e):
                raise
            return f"get_weather({json.dumps(CALLS[0])}), then {_looped(len(CALLS))}"
        if not CALLS:
            raise RuntimeError(f"the tool was not called (llm has no tool_choice); answer "
                               f"{_short(text)}")
        return f"get_weather({json.dumps(CALLS[0])}), then answered {_short(text, 25)}"

    def structured() -> str:
        r = model().prompt(STRUCT_PROMPT, schema=City, stream=False,
                           num_predict=cfg.json_tokens, **cfg.temp)
        return _short(City.model_validate_json(r.text()), 60)

    def embeddings() -> str:
        exe = shutil.which("llm", path=str(Path(sys.executable).parent)) or shutil.which("llm")
        if not exe:
            raise RuntimeError("no llm command beside this Python")
        p = subprocess.run([exe, "embed", "-m", cfg.embed_model, "-c", EMBED_TEXT],
                           capture_output=True, text=True, timeout=cfg.timeout, check=False)
        if p.returncode != 0:
            raise RuntimeError(f"llm embed exited {p.returncode}: "
                               f"{' '.join(p.stderr.split())[-240:]}")
        return f"`llm embed`: dim {len(json.loads(p.stdout))}"

    return {"models": models, "chat": chat, "stream": stream, "tools": tools,
            "structured": structured, "embeddings": embeddings}


def llama_index_cells(cfg: Config) -> Cells:
    from llama_index.core.llms import ChatMessage
    from llama_index.core.prompts import PromptTemplate
    from llama_index.core.tools import FunctionTool
    from llama_index.embeddings.ollama import OllamaEmbedding
    from llama_index.llms.ollama import Ollama

    def model(tokens: int) -> Any:
        # context_window left at -1: the client asks /api/show for the model's context length
        return Ollama(model=cfg.chat_model, base_url=cfg.base, request_timeout=cfg.timeout,
                      additional_kwargs={"num_predict": tokens, **cfg.temp})

    user = [ChatMessage(role="user", content=CHAT_PROMPT)]

    def chat() -> str:
        return _short(model(cfg.max_tokens).chat(user).message.content)

    def stream() -> str:
        parts = [r.delta for r in model(cfg.max_tokens).stream_chat(user) if r.delta]
        if not parts:
            raise RuntimeError("no content in the stream")
        return f"{len(parts)} deltas: {_short(''.join(parts), 30)}"

    def tools() -> str:
        r = model(cfg.json_tokens).predict_and_call([FunctionTool.from_defaults(fn=get_weather)],
                                                    TOOL_PROMPT)
        if not CALLS:
            raise RuntimeError(f"the tool was not called; answer {_short(str(r))}")
        return f"predict_and_call: get_weather({json.dumps(CALLS[0])}) → {_short(str(r), 25)}"

    def structured() -> str:
        out = model(cfg.json_tokens).structured_predict(City, PromptTemplate(
            "Give the capital of {country} as JSON with its name, its country and its "
            "population."), country="France")
        return _short(out, 60)

    def embeddings() -> str:
        emb = OllamaEmbedding(model_name=cfg.embed_model, base_url=cfg.base,
                              client_kwargs={"timeout": cfg.timeout})
        return f"dim {len(emb.get_text_embedding(EMBED_TEXT))}"

    return {"models": None, "chat": chat, "stream": stream, "tools": tools,
            "structured": structured, "embeddings": embeddings}


def instructor_cells(cfg: Config) -> Cells:
    import instructor
    from openai import OpenAI

    def client(mode: Any) -> Any:
        return instructor.from_openai(OpenAI(base_url=cfg.v1, api_key="edgespec",
                                             timeout=cfg.timeout, max_retries=0), mode=mode)

    messages = [{"role": "user", "content": STRUCT_PROMPT}]

    mode = instructor.Mode[cfg.instructor_mode]

    def stream() -> str:
        partials = list(client(mode).chat.completions.create_partial(
            model=cfg.chat_model, response_model=City, messages=messages, max_retries=1,
            max_tokens=cfg.json_tokens, **cfg.temp))
        if not partials:
            raise RuntimeError("no partial object")
        return f"create_partial: {len(partials)} partials, last {_short(partials[-1], 40)}"

    def tools() -> str:
        out = client(instructor.Mode.TOOLS).chat.completions.create(
            model=cfg.chat_model, response_model=City, messages=messages, max_retries=1,
            max_tokens=cfg.json_tokens, **cfg.temp)
        return f"Mode.TOOLS: {_short(out, 50)}"

    def structured() -> str:
        out = client(mode).chat.completions.create(
            model=cfg.chat_model, response_model=City, messages=messages, max_retries=1,
            max_tokens=cfg.json_tokens, **cfg.temp)
        return f"Mode.{mode.name}: {_short(out, 50)}"

    return {"models": None, "chat": None, "stream": stream, "tools": tools,
            "structured": structured, "embeddings": None}


def pydantic_ai_cells(cfg: Config) -> Cells:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.usage import UsageLimits
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.ollama import OllamaProvider

    def provider() -> Any:  # a client per cell: each cell runs its own event loop
        return OllamaProvider(openai_client=AsyncOpenAI(
            base_url=cfg.v1, api_key="edgespec", timeout=cfg.timeout, max_retries=0))

    def model() -> Any:
        return OpenAIChatModel(cfg.chat_model, provider=provider())

    def settings(tokens: int) -> dict:
        return {"max_tokens": tokens, "timeout": cfg.timeout, **cfg.temp}

    def chat() -> str:
        r = Agent(model()).run_sync(CHAT_PROMPT, model_settings=settings(cfg.max_tokens))
        return _short(r.output)

    def stream() -> str:
        async def go() -> list[str]:
            agent = Agent(model())
            async with agent.run_stream(CHAT_PROMPT,
                                        model_settings=settings(cfg.max_tokens)) as result:
                return [t async for t in result.stream_text(delta=True) if t]
        parts = asyncio.run(go())
        if not parts:
            raise RuntimeError("no text in the stream")
        return f"{len(parts)} deltas: {_short(''.join(parts), 30)}"

    def tools() -> str:
        try:
            r = Agent(model(), tools=[get_weather]).run_sync(
                TOOL_PROMPT, model_settings=settings(cfg.json_tokens),
                usage_limits=UsageLimits(request_limit=LOOP_LIMIT))
        except UsageLimitExceeded:  # the model called the tool each turn
            if not CALLS:
                raise
            return f"get_weather({json.dumps(CALLS[0])}), then {_looped(len(CALLS))}"
        if not CALLS:
            raise RuntimeError(f"the tool was not called; answer {_short(r.output)}")
        return f"get_weather({json.dumps(CALLS[0])}), then answered {_short(r.output, 25)}"

    def structured() -> str:
        r = Agent(model(), output_type=City).run_sync(STRUCT_PROMPT,
                                                      model_settings=settings(cfg.json_tokens))
        return f"output_type (tool output): {_short(r.output, 45)}"

    def embeddings() -> str:
        from pydantic_ai import Embedder
        from pydantic_ai.embeddings.openai import OpenAIEmbeddingModel

        r = Embedder(OpenAIEmbeddingModel(cfg.embed_model, provider=provider())
                     ).embed_documents_sync([EMBED_TEXT, "hello"])
        return f"Embedder: {len(r.embeddings)} vectors, dim {len(r.embeddings[0])}"

    return {"models": None, "chat": chat, "stream": stream, "tools": tools,
            "structured": structured, "embeddings": embeddings}


def openwebui_cells(cfg: Config) -> Cells:
    """Open WebUI's own API in front of the server (``--open-webui [URL]``).

    Open WebUI lives in a venv of its own (it pins its own versions of half of the others'
    dependencies, and pulls torch): ``.cache/openwebui-venv/bin/pip install open-webui``. Run it
    against the server, with its Ollama connection pointed at the server (or at this script's
    proxy, ``--proxy-port``, to record what Open WebUI sends on)::

        OLLAMA_BASE_URL=http://127.0.0.1:11434 WEBUI_AUTH=True ENABLE_OPENAI_API=False \\
            DATA_DIR=.cache/openwebui-data .cache/openwebui-venv/bin/open-webui serve --port 8080

    This signs up a user (the first one becomes the admin; an existing one signs in) and drives
    ``/api/models``, ``/api/chat/completions`` (whole, streamed, with ``tools`` and with a
    ``response_format``) and ``/api/embeddings`` with its bearer token.
    """
    base = cfg.openwebui_url.rstrip("/")

    def call(method: str, path: str, body: Optional[dict] = None,
             token: Optional[str] = None, stream: bool = False) -> Any:
        req = urllib.request.Request(base + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=cfg.timeout) as resp:
                data = resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"HTTP {e.code} on {path}: "
                               f"{e.read().decode('utf-8', 'replace')[:200]}") from None
        return data if stream else json.loads(data)

    user = {"name": "client-matrix", "email": "client-matrix@example.com",
            "password": "client-matrix-password"}
    try:
        token = call("POST", "/api/v1/auths/signup", user)["token"]
    except RuntimeError:
        token = call("POST", "/api/v1/auths/signin",
                     {"email": user["email"], "password": user["password"]})["token"]
    cfg.openwebui_version = call("GET", "/api/version").get("version", "")
    listed = [m["id"] for m in call("GET", "/api/models", token=token)["data"]]
    def pick(model: str) -> str:  # Open WebUI lists Ollama's models by their tagged names
        return next((m for m in listed if m in (model, f"{model}:latest")), model)

    name, embed_name = pick(cfg.chat_model), pick(cfg.embed_model)

    def completion(extra: dict, prompt: str = CHAT_PROMPT) -> dict:
        body = {"model": name, "messages": [{"role": "user", "content": prompt}],
                "stream": False, "max_tokens": cfg.max_tokens, **cfg.temp, **extra}
        return call("POST", "/api/chat/completions", body, token)

    def models() -> str:
        return f"{len(listed)} models, {cfg.chat_model} " + (
            "listed" if name in listed else "NOT listed")

    def chat() -> str:
        return _short(completion({})["choices"][0]["message"]["content"])

    def stream() -> str:
        text = call("POST", "/api/chat/completions",
                    {"model": name, "messages": [{"role": "user", "content": CHAT_PROMPT}],
                     "stream": True, "max_tokens": cfg.max_tokens, **cfg.temp}, token,
                    stream=True)
        parts = []
        for line in text.splitlines():
            if line.startswith("data: ") and line[6:].strip() != "[DONE]":
                delta = json.loads(line[6:]).get("choices", [{}])[0].get("delta", {})
                if delta.get("content"):
                    parts.append(delta["content"])
        if not parts:
            raise RuntimeError(f"no content in the stream: {_short(text, 120)}")
        return f"{len(parts)} deltas: {_short(''.join(parts), 30)}"

    def tools() -> str:
        tool = {"type": "function", "function": {"name": "get_weather",
                                                 "description": TOOL_DESCRIPTION,
                                                 "parameters": TOOL_SCHEMA}}
        msg = completion({"tools": [tool], "max_tokens": cfg.json_tokens,
                          "params": {"function_calling": "native"}},
                         TOOL_PROMPT)["choices"][0]["message"]
        if not msg.get("tool_calls"):
            raise RuntimeError(f"no tool call; content {_short(msg.get('content'))}")
        f = msg["tool_calls"][0]["function"]
        return f"{f['name']}({f['arguments']})"

    def structured() -> str:
        fmt = {"type": "json_schema", "json_schema": {"name": "City",
                                                      "schema": City.model_json_schema()}}
        msg = completion({"response_format": fmt, "max_tokens": cfg.json_tokens},
                         STRUCT_PROMPT)["choices"][0]["message"]
        return _short(City.model_validate_json(msg["content"]), 60)

    def embeddings() -> str:
        r = call("POST", "/api/embeddings", {"model": embed_name,
                                             "input": [EMBED_TEXT, "hello"]}, token)
        return f"{len(r['data'])} vectors, dim {len(r['data'][0]['embedding'])}"

    return {"models": models, "chat": chat, "stream": stream, "tools": tools,
            "structured": structured, "embeddings": embeddings}


BUILDERS = {"openai": openai_cells, "ollama": ollama_cells, "anthropic": anthropic_cells,
            "llm": llm_cells, "llama-index": llama_index_cells,
            "instructor": instructor_cells, "pydantic-ai": pydantic_ai_cells,
            "open-webui": openwebui_cells}


# ---------------------------------------------------------------------------------------------

def run_cell(fn: Callable[[], str], limit: float, recorder: Optional[Recorder],
             log: ServerLog, full: bool = False) -> dict:
    """One cell in a thread of its own: its proof or its error, how long it took, the
    exchanges the proxy saw meanwhile and, when it failed, the server's log lines."""
    CALLS.clear()
    mark, log_mark, start = recorder.mark() if recorder else 0, log.mark(), time.monotonic()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["proof"] = fn()
        except BaseException as e:  # noqa: BLE001 - a cell's failure is its result
            box["error"] = _one_line(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    cell: dict[str, Any] = {"seconds": round(time.monotonic() - start, 2)}
    if thread.is_alive():
        cell.update(status="FAIL", error=f"cell still running after {limit:.0f} s (abandoned)")
    elif "error" in box:
        cell.update(status="FAIL", error=box["error"])
    else:
        cell.update(status="ok", proof=box["proof"])
    exchanges = recorder.since(mark) if recorder else []
    if cell["status"] == "ok" and not full:  # a summary is enough when it went well
        cell["exchanges"] = [f"{x['method']} {x['path']} {x['status']}" for x in exchanges]
    else:
        cell["exchanges"] = exchanges
        cell["server_log"] = log.since(log_mark)
    return cell


def versions(client: str) -> str:
    out = []
    for dist in DISTS[client]:
        try:
            out.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(out)


def cell_text(cell: dict, width: int) -> str:
    if cell["status"] == "ok":
        text = f"ok: {cell['proof']}"
    elif cell["status"] == "FAIL":
        text = f"FAIL: {cell['error']}"
    else:
        text = cell["status"]
    text = " ".join(text.split())
    if len(text) > width:
        text = text[:width - 1] + "…"
    return text.replace("|", "\\|")


def markdown(results: dict, width: int) -> str:
    lines = ["| client | " + " | ".join(FEATURES) + " |",
             "|---" * (len(FEATURES) + 1) + "|"]
    for client, row in results.items():
        head = f"**{client}**" + (f"<br>{row['versions']}" if row["versions"] else "")
        lines.append(f"| {head} | " + " | ".join(cell_text(row["cells"][f], width)
                                                  for f in FEATURES) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", nargs="?", default="http://127.0.0.1:11434",
                    help="the server's root (default %(default)s)")
    ap.add_argument("--chat-model", default="smollm2-135m")
    ap.add_argument("--embed-model", default="all-minilm")
    ap.add_argument("--clients", default=",".join(CLIENTS),
                    help="the rows, comma-separated (default: all but open-webui)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="each client's request timeout in seconds (default %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=32,
                    help="the answer's budget for chat and stream (default %(default)s)")
    ap.add_argument("--json-tokens", type=int, default=160,
                    help="the budget for tool calls and structured answers (default %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sent with every generation (default %(default)s: greedy, so a run "
                         "repeats; below 0: not sent, each client's and the server's default)")
    ap.add_argument("--instructor-mode", default="JSON_SCHEMA",
                    help="instructor's mode for its stream (create_partial) and structured cells "
                         "(default %(default)s: the schema goes to the server, which holds the "
                         "answer to it; JSON sends json_object and the schema in the prompt "
                         "only, so a small model's answer misses fields)")
    ap.add_argument("--json", default=".cache/client_matrix.json",
                    help="where the raw cells go (default %(default)s)")
    ap.add_argument("--server-log", help="the server's log file: its lines written while a "
                                         "failed cell ran go in that cell's JSON record")
    ap.add_argument("--no-proxy", action="store_true",
                    help="connect the clients straight to the server (no request capture)")
    ap.add_argument("--full-exchanges", action="store_true",
                    help="keep the bodies of the exchanges of cells that went well too")
    ap.add_argument("--proxy-port", type=int, default=0,
                    help="the logging proxy's port (default: any free one)")
    ap.add_argument("--open-webui", nargs="?", const="http://127.0.0.1:8080", default=None,
                    metavar="URL", help="add Open WebUI's row: its API at URL (default "
                                        "http://127.0.0.1:8080), see openwebui_cells")
    ap.add_argument("--width", type=int, default=70, help="a table cell's width in characters")
    args = ap.parse_args()

    recorder = None if args.no_proxy else Recorder()
    base = args.url
    if recorder is not None:
        proxy = start_proxy(args.url, recorder, args.proxy_port)
        base = f"http://127.0.0.1:{proxy.server_address[1]}"
        print(f"logging proxy on {base} → {args.url}", file=sys.stderr)
    cfg = Config(args, base)
    log = ServerLog(args.server_log)
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    if args.open_webui and "open-webui" not in clients:
        clients.append("open-webui")
    unknown = [c for c in clients if c not in BUILDERS]
    if unknown:
        ap.error(f"unknown clients: {', '.join(unknown)} (known: {', '.join(BUILDERS)})")
    if "open-webui" in clients and not cfg.openwebui_url:
        cfg.openwebui_url = "http://127.0.0.1:8080"

    results: dict[str, dict] = {}
    for client in clients:
        row: dict[str, Any] = {"versions": versions(client), "cells": {}}
        results[client] = row
        try:
            cells = BUILDERS[client](cfg)
            if client == "open-webui" and cfg.openwebui_version:
                row["versions"] = f"open-webui {cfg.openwebui_version} (its API)"
        except ImportError as e:
            row["cells"] = {f: {"status": "not installed", "error": _one_line(e)}
                            for f in FEATURES}
            print(f"{client}: not installed ({_one_line(e)})", file=sys.stderr)
            continue
        except Exception as e:  # noqa: BLE001 - a row that cannot start fails its cells
            row["cells"] = {f: {"status": "FAIL", "error": f"setup: {_one_line(e)}"}
                            for f in FEATURES}
            print(f"{client}: setup failed ({_one_line(e)})", file=sys.stderr)
            continue
        for feature in FEATURES:
            fn = cells.get(feature)
            if fn is None:
                row["cells"][feature] = {"status": "n/a"}
                continue
            cell = run_cell(fn, 3 * args.timeout, recorder, log, args.full_exchanges)
            row["cells"][feature] = cell
            print(f"{client:12} {feature:10} {cell['seconds']:6.1f}s  "
                  f"{cell_text(cell, 110)}", file=sys.stderr)

    table = markdown(results, args.width)
    print(table)
    out = {"server": args.url, "chat_model": args.chat_model, "embed_model": args.embed_model,
           "python": sys.version.split()[0], "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "clients": results, "markdown": table}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
        print(f"raw cells: {args.json}", file=sys.stderr)
    shutil.rmtree(cfg.llm_user_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
