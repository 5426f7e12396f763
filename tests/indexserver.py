"""A Python package index on 127.0.0.1 (PEP 503's "simple" repository API, the part ``pip
download`` uses), so that the real pip can be tested against it through ``PIP_INDEX_URL``.

What it serves, as PyPI does:

- ``GET /simple/``: the project list; ``GET /simple/{name}/``: a project's files, each an
  ``<a href="/files/{wheel}#sha256=…">`` (the hash of the bytes actually served, as a
  compromised or corrupting mirror would advertise them); unknown project → ``404``.
- ``GET /files/{wheel}``: the wheel's bytes.

:func:`build_wheel` writes a small valid wheel (METADATA, WHEEL, RECORD) holding given files.

Faults a test can switch on, per wheel: ``tamper`` (serve it with one byte flipped: same size,
a different sha256), ``fail`` (answer ``404`` for the file), and ``stall_on`` (stop sending
that wheel's body after ``stall_after`` bytes until :meth:`FakeIndex.release`; ``stalled`` is
set once it waits). Every request is recorded.
"""

from __future__ import annotations

import base64
import hashlib
import html
import os
import re
import shutil
import threading
import time
import zipfile
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional
from urllib.parse import unquote, urlsplit

from hubserver import LoopbackServer

CHUNK = 1 << 14


def normalize(name: str) -> str:
    """PEP 503's normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(folder: Path, project: str, version: str, files: dict[str, bytes]) -> Path:
    """A pure-Python wheel of ``project`` ``version`` in ``folder`` holding ``files`` (paths
    inside the wheel → bytes), with the metadata pip reads."""
    dist = re.sub(r"[-_.]+", "_", project)
    info = f"{dist}-{version}.dist-info"
    members = {**files,
               f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: {project}\n"
                                    f"Version: {version}\n").encode(),
               f"{info}/WHEEL": (b"Wheel-Version: 1.0\nGenerator: edgespec-tests\n"
                                 b"Root-Is-Purelib: true\nTag: py3-none-any\n")}
    record = "".join(_record_line(n, d) + "\n" for n, d in members.items())
    record += f"{info}/RECORD,,\n"
    path = Path(folder) / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr(f"{info}/RECORD", record)
    return path


@dataclass
class IndexFile:
    path: Path                      # the real wheel
    served: Optional[Path] = None   # the bytes actually sent, when a test tampers with them
    fail: bool = False              # answer 404 for it

    @property
    def sent(self) -> Path:
        return self.served or self.path


class FakeIndex(LoopbackServer):
    """Start with ``with FakeIndex(tmp_dir) as index:``; ``index.url`` is the PIP_INDEX_URL."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.projects: dict[str, dict[str, IndexFile]] = {}   # normalised name → wheel name → file
        self.requests: list[str] = []
        self.stall_on: Optional[str] = None
        self.stall_after = 0
        self.pace = 0.0         # seconds between the chunks of a file sent (0: at once)
        self.stalled = threading.Event()
        self._resume = threading.Event()
        self._lock = threading.Lock()
        self._server: Optional[ThreadingHTTPServer] = None

    # -- content ----------------------------------------------------------------------------

    def add_wheel(self, wheel: Path) -> None:
        project = normalize(wheel.name.split("-", 1)[0])
        self.projects.setdefault(project, {})[wheel.name] = IndexFile(Path(wheel))

    def _file(self, wheel: str) -> IndexFile:
        for files in self.projects.values():
            if wheel in files:
                return files[wheel]
        raise KeyError(wheel)

    def tamper(self, wheel: str) -> Path:
        """Serve ``wheel`` with one byte flipped in the middle (and advertise that file's
        sha256)."""
        f = self._file(wheel)
        bad = self.root / f"tampered-{wheel}"
        shutil.copyfile(f.path, bad)
        size = bad.stat().st_size
        with open(bad, "r+b") as out:
            out.seek(size // 2)
            b = out.read(1)
            out.seek(size // 2)
            out.write(bytes([b[0] ^ 0xFF]))
        f.served = bad
        return bad

    def fail(self, wheel: str, on: bool = True) -> None:
        self._file(wheel).fail = on

    def repair(self, wheel: str) -> None:
        f = self._file(wheel)
        f.served, f.fail = None, False

    def release(self) -> None:
        self.stall_on = None
        self._resume.set()

    # -- counters -----------------------------------------------------------------------------

    def gets(self, wheel: str) -> int:
        """How many times ``wheel``'s bytes were asked for."""
        with self._lock:
            return sum(1 for p in self.requests if p == f"/files/{wheel}")

    def file_gets(self) -> list[str]:
        with self._lock:
            return [p.rsplit("/", 1)[-1] for p in self.requests if p.startswith("/files/")]

    def handler(self) -> type:
        return _make_handler(self)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/simple/"

    def env(self, **extra: str) -> dict:
        """A process environment whose pip uses this index only: the machine's pip
        configuration (extra indexes, find-links, constraints) is set aside."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=self.url, PIP_EXTRA_INDEX_URL="",
                   PIP_FIND_LINKS="", PIP_CONSTRAINT="", PIP_RETRIES="0", PIP_TIMEOUT="30",
                   PIP_DISABLE_PIP_VERSION_CHECK="1", NO_PROXY="*", no_proxy="*")
        env.update(extra)
        return env


def _make_handler(index: FakeIndex):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep pytest output clean
            pass

        def _send(self, status: int, body: bytes, ctype: str = "text/html") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            path = unquote(urlsplit(self.path).path)
            with index._lock:
                index.requests.append(path)
            parts = [p for p in path.split("/") if p]
            if parts == ["simple"]:
                links = "".join(f'<a href="/simple/{p}/">{p}</a>\n' for p in index.projects)
                return self._send(200, f"<!DOCTYPE html><html><body>{links}</body></html>"
                                  .encode())
            if len(parts) == 2 and parts[0] == "simple":
                files = index.projects.get(normalize(parts[1]))
                if files is None:
                    return self._send(404, b"not found", "text/plain")
                links = "".join(
                    f'<a href="/files/{html.escape(n)}#sha256={_sha256(f.sent)}">'
                    f"{html.escape(n)}</a>\n" for n, f in files.items())
                return self._send(200, f"<!DOCTYPE html><html><body>{links}</body></html>"
                                  .encode())
            if len(parts) == 2 and parts[0] == "files":
                try:
                    f = index._file(parts[1])
                except KeyError:
                    f = None
                if f is None or f.fail:
                    return self._send(404, b"not found", "text/plain")
                return self._stream(parts[1], f.sent)
            self._send(404, b"not found", "text/plain")

        def _stream(self, name: str, path: Path) -> None:
            size = path.stat().st_size
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            sent = 0
            try:
                with open(path, "rb") as f:
                    while chunk := f.read(CHUNK):
                        if index.stall_on == name and sent >= index.stall_after:
                            self.wfile.flush()
                            index.stalled.set()
                            index._resume.wait()
                        self.wfile.write(chunk)
                        sent += len(chunk)
                        if index.pace:      # a download slow enough to be seen going
                            self.wfile.flush()
                            time.sleep(index.pace)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True   # the client went away (killed, or gave up)

    return Handler


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
