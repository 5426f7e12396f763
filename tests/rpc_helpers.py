"""Real `edgespec worker` processes and latency relays on 127.0.0.1 for the RPC tests and the
RPC benchmark: started on free ports, ended by their process ids."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.pid} exited with {proc.returncode} before "
                               f"listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port} after {timeout:g} s")


def end(proc: subprocess.Popen) -> None:
    """End a process by its pid: SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


class Worker:
    """One `edgespec worker` on 127.0.0.1; ``stop()`` ends it by its pid (SIGTERM, then
    SIGKILL), ``kill()`` kills it as a crash would, ``start()`` starts it again on its port."""

    def __init__(self, port: int | None = None, threads: int = 1):
        self.port = port or free_port()
        self.threads = threads
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "Worker":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgespec", "worker", "--port", str(self.port),
             "--threads", str(self.threads)],
            stdout=self.log, stderr=self.log)
        # A probe connection would occupy the worker (it serves one client at a time) only
        # for its own lifetime: connecting and closing is harmless.
        _wait_listening(self.port, self.proc)
        return self

    def output(self) -> str:
        """What the worker wrote (stdout and stderr) so far."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            end(self.proc)


class Relay:
    """``tests/relay.py``: a loopback TCP relay adding ``delay_ms`` each way."""

    def __init__(self, target: str, delay_ms: float):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, str(HERE / "relay.py"), str(self.port),
                                      target, str(delay_ms)], stdout=subprocess.PIPE)
        assert self.proc.stdout.readline().strip() == b"ready"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        end(self.proc)
