"""Benchmarks through a running server: start one on 127.0.0.1, ask it streamed completions
as a client would, one at a time or several at once (scripts/bench_server_clients.py,
scripts/bench_vs_llama_server.py). Standard library only: what is measured is the server,
not a client library's threads."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process (``cmd``) listening on ``port``, up once its ``/health`` answers 200."""

    def __init__(self, name: str, cmd: list[str], port: int, timeout: float = 300.0):
        self.name, self.port = name, port
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.log: list[str] = []
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{name} exited:\n" + "".join(self.log[-30:]))
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.proc.kill()
        sys.exit(f"{name} did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class Answer:
    tokens: int
    first: float        # seconds to the first token's text
    seconds: float      # in all
    text: str


def ask(port: int, prompt, n: int) -> Answer:
    """One streamed answer, greedy, at most ``n`` tokens: a text ``prompt`` on OpenAI's
    completions route, a list of messages on its chat route (the model's chat template)."""
    chat = not isinstance(prompt, str)
    body = {"messages" if chat else "prompt": prompt, "max_tokens": n, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions" if chat else "/v1/completions",
                 body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"port {port}: {resp.status} {resp.read()[:300]!r}")
    first, tokens, text = None, 0, []
    for line in resp:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        choice = (event.get("choices") or [{}])[0]
        piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
        if piece:
            if first is None:
                first = time.perf_counter() - t0
            text.append(piece)
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    conn.close()
    return Answer(tokens, first or 0.0, time.perf_counter() - t0, "".join(text))


@dataclass
class Batch:
    rate: float             # all answers' tokens over the wall time
    slowest_first: float    # the latest first token, from the start of the batch
    answers: list


def at_once(port: int, prompts: list, n: int) -> Batch:
    """Every prompt sent at the same moment, each by its own client."""
    out: list = [None] * len(prompts)
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, ask(port, prompts[i], n)))
               for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return Batch(sum(a.tokens for a in out) / wall, max(a.first for a in out), out)


def one_after_another(port: int, prompts: list, n: int) -> Batch:
    """The same prompts asked in turn by one client (a first token counted from the start
    of its own request)."""
    t0 = time.perf_counter()
    out = [ask(port, p, n) for p in prompts]
    wall = time.perf_counter() - t0
    return Batch(sum(a.tokens for a in out) / wall, max(a.first for a in out), out)
