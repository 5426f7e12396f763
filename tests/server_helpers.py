"""Helpers for the server tests: a real `edgespec serve` process and plain HTTP on loopback."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time


class ServerProcess:
    """`python -m edgespec serve ARGS --port 0`, waited for until it listens."""

    def __init__(self, *args: str, timeout: float = 180, env: dict | None = None):
        """``env``: variables set for the server process, over this process's."""
        self.proc = subprocess.Popen([sys.executable, "-m", "edgespec", "serve", "--port", "0",
                                      *map(str, args)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **env} if env else None)
        self.lines: list[str] = []
        listening = threading.Event()
        self.host = self.port = None

        def read(stream):
            for line in stream:
                self.lines.append(line.rstrip("\n"))
                m = re.search(r"listening on http://\[?([^\]\s]+?)\]?:(\d+)/v1", line)
                if m:
                    self.host, self.port = m.group(1), int(m.group(2))
                    listening.set()

        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=read, args=(stream,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not listening.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("server did not start:\n" + "\n".join(self.lines))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def log(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def request(port: int, method: str, path: str, body: bytes | None = None,
            headers: dict | None = None, timeout: float = 120):
    """(status, headers, body bytes) of one plain HTTP request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def headers_for(key: str | None, content_type: str = "application/json") -> dict:
    h = {"Content-Type": content_type}
    if key:
        h["Authorization"] = f"Bearer {key}"
    return h


def post(port: int, path: str, payload, key: str | None = None, **kw):
    """POST JSON (or raw bytes); returns (status, parsed JSON body)."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    status, _, data = request(port, "POST", path, body, headers_for(key), **kw)
    return status, json.loads(data)


def sse(port: int, path: str, payload: dict, key: str | None = None) -> list[str]:
    """The `data:` payloads of a streamed response, in order (framing checked)."""
    status, headers, data = request(port, "POST", path, json.dumps(payload).encode(),
                                    headers_for(key))
    assert status == 200, data
    assert headers["content-type"].startswith("text/event-stream")
    text = data.decode()
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), text
    return [e[len("data: "):] for e in events]


def health(port: int) -> dict:
    status, _, data = request(port, "GET", "/health", timeout=10)
    assert status == 200
    return json.loads(data)


def wait_until(predicate, timeout: float) -> float:
    """Seconds until predicate() held; raises AssertionError after ``timeout``."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - t0


def check_log(s: ServerProcess) -> None:
    """No request answered 5xx, no traceback."""
    log = s.log()
    assert "Traceback" not in log and "Exception" not in log, log
    assert not re.search(r'HTTP/1\.1" 5\d\d', log), log


def stop_checked(s: ServerProcess) -> None:
    """Stop ``s`` as Ctrl-C does; it exits cleanly, and its log has no 5xx or traceback."""
    rc = s.stop()
    assert rc in (0, 130), s.log()
    check_log(s)


def assert_openai_error(status: int, body: dict, expect_status: int, param=None, code=None):
    assert status == expect_status, body
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"] and "\n" not in err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
