"""The server app in this process (uvicorn in a thread, real HTTP on loopback, a real Engine):
failures in the middle of a stream, shutdown under load, and the rules for servers without a
key (Host names, CORS)."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager

import openai
import pytest
import uvicorn

from edgespec import Engine
from edgespec.errors import BackendError
from edgespec.server.app import create_app
from server_helpers import assert_openai_error, post, request, wait_until

LONG = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 200, "temperature": 0}


@contextmanager
def serving(app):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=30)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture
def engine(smollm2_q4_path):
    with Engine.load(target=smollm2_q4_path, n_ctx=512) as e:
        yield e


class FailingEngine:
    """The real Engine, except that each stream fails after ``n`` events, as a llama.cpp
    decode failure would."""

    def __init__(self, engine, n: int):
        self.engine, self.n = engine, n

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def asubmit(self, req):
        return _FailAfter(self.engine.asubmit(req), self.n)


class _FailAfter:
    def __init__(self, inner, n):
        self.inner, self.left = inner, n

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.left == 0:
            self.inner.cancel()
            raise BackendError("llama_decode failed with code -1 (invalid batch)")
        self.left -= 1
        return await self.inner.__anext__()

    def cancel(self):
        self.inner.cancel()

    @property
    def result(self):
        return self.inner.result


def raw_events(port, payload, path="/v1/completions"):
    status, _, data = request(port, "POST", path, json.dumps(payload).encode(),
                              {"Content-Type": "application/json"})
    assert status == 200
    return [e[len("data: "):] for e in data.decode().strip().split("\n\n")]


def test_a_failure_mid_stream_ends_with_an_error_event(engine):
    with serving(create_app(FailingEngine(engine, 5), model_id="m")) as port:
        events = raw_events(port, {**LONG, "stream": True})
        assert "[DONE]" not in events
        *chunks, last = map(json.loads, events)
        assert len(chunks) >= 5 and all("choices" in c for c in chunks)
        assert last["error"]["type"] == "server_error"
        assert "llama_decode failed" in last["error"]["message"]
        wait_until(lambda: not engine.busy, timeout=10)

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                               max_retries=0)
        seen = []
        with pytest.raises(openai.APIError, match="llama_decode failed"):
            for chunk in client.completions.create(model="m", stream=True, **LONG):
                seen.append(chunk)
        assert len(seen) >= 4


def test_shutdown_mid_stream_ends_streams_with_an_error_and_refuses_new_work(engine):
    with serving(create_app(engine, model_id="m")) as port:
        got = {}
        t = threading.Thread(target=lambda: got.setdefault(
            "events", raw_events(port, {**LONG, "stream": True})))
        t.start()
        wait_until(lambda: engine.busy, timeout=30)
        time.sleep(0.2)
        engine.close()
        t.join(30)
        events = got["events"]
        assert "[DONE]" not in events
        assert json.loads(events[-1])["error"]["code"] == "cancelled"
        status, out = post(port, "/v1/completions", {"prompt": "hi"})
        assert_openai_error(status, out, 503, code="shutting_down")


def test_without_a_key_only_loopback_host_names_are_served(engine):
    with serving(create_app(engine, model_id="m")) as port:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
            status, _, _ = request(port, "GET", "/v1/models", headers={"Host": host})
            assert status == 200, host
        for host in (f"evil.example:{port}", "attacker.test", f"192.168.1.5:{port}"):
            status, _, data = request(port, "GET", "/v1/models", headers={"Host": host})
            assert_openai_error(status, json.loads(data), 400, code="invalid_host")


def test_no_cors_headers_by_default(engine):
    with serving(create_app(engine, model_id="m")) as port:
        status, headers, _ = request(port, "GET", "/v1/models",
                                     headers={"Origin": "http://evil.example"})
        assert status == 200
        assert not any(h.startswith("access-control-") for h in headers)
        status, headers, _ = request(port, "OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
        assert not any(h.startswith("access-control-") for h in headers)
        # a page's form post (a "simple" request, no preflight) cannot start a generation:
        # refused for its origin, and for its type when no Origin says where it came from
        status, _, data = request(port, "POST", "/v1/completions", b'{"prompt": "hi"}',
                                  {"Content-Type": "text/plain",
                                   "Origin": "http://evil.example"})
        assert_openai_error(status, json.loads(data), 403, code="origin_not_allowed")
        status, _, data = request(port, "POST", "/v1/completions", b'{"prompt": "hi"}',
                                  {"Content-Type": "text/plain"})
        assert_openai_error(status, json.loads(data), 400, code="invalid_content_type")
        assert not engine.busy


def test_named_cors_origins_without_credentials(engine):
    app = create_app(engine, model_id="m", cors_origins=["http://localhost:3000"])
    with serving(app) as port:
        pre = {"Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization, content-type"}
        status, headers, _ = request(port, "OPTIONS", "/v1/chat/completions",
                                     headers={"Origin": "http://localhost:3000", **pre})
        assert status == 200
        assert headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "access-control-allow-credentials" not in headers
        status, headers, _ = request(port, "OPTIONS", "/v1/chat/completions",
                                     headers={"Origin": "http://evil.example", **pre})
        assert "access-control-allow-origin" not in headers
    app = create_app(engine, model_id="m", api_key="k", cors_origins=["*"])
    with serving(app) as port:
        status, headers, _ = request(port, "GET", "/health", headers={"Origin": "http://a.b"})
        assert headers["access-control-allow-origin"] == "*"
        assert "access-control-allow-credentials" not in headers


def test_hostile_json(engine):
    with serving(create_app(engine, model_id="m")) as port:
        deep = b"[" * 100_000 + b"]" * 100_000
        status, out = post(port, "/v1/chat/completions", deep)
        assert_openai_error(status, out, 400, code="invalid_json")
        status, out = post(port, "/v1/chat/completions", b"\xff\xfe{")
        assert_openai_error(status, out, 400, code="invalid_json")


def test_only_the_server_package_imports_the_http_stack():
    import ast
    import subprocess
    import sys
    from pathlib import Path

    pkg = Path(__file__).resolve().parent.parent / "edgespec"
    stack = {"starlette", "uvicorn", "fastapi", "anyio", "httpx", "h11"}
    users = set()
    for path in pkg.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     and node.level == 0 else [])
            if any(n.split(".")[0] in stack for n in names):
                users.add(path.relative_to(pkg).as_posix())
    assert users and all(u.startswith("server/") for u in users), users
    # building the whole command line (serve included) loads none of it
    code = ("import sys; from edgespec.cli import build_parser; build_parser(); "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(stack)!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
