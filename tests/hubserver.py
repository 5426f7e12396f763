"""A Hugging Face hub on 127.0.0.1, speaking the part of the protocol ``huggingface_hub`` uses to
fetch one file, so that the real client can be tested against it through ``HF_ENDPOINT``.

What it serves, as the hub does:

- ``HEAD|GET /{repo}/resolve/{revision}/{path}``: an LFS file answers ``302`` to a "CDN" URL on
  a different host name (``localhost`` instead of ``127.0.0.1``, so the client treats it as off
  the hub) with ``X-Repo-Commit``, ``X-Linked-Etag`` (the sha256), ``X-Linked-Size`` and the
  pointer's ``ETag``; a plain (non-LFS) file answers ``200`` with its git blob sha1 as ETag.
  Unknown repository → ``401 RepoNotFound``; unknown revision → ``404 RevisionNotFound``;
  unknown file → ``404 EntryNotFound`` (with ``X-Repo-Commit``, as the hub sends).
- ``GET /cdn/{sha256}``: the bytes, with ``Range`` support (``206`` + ``Content-Range``).
- ``POST /api/models/{repo}/paths-info/{revision}``: size, git oid and ``lfs.oid`` (sha256).
- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{revision}``: ``sha`` + siblings.

Faults a test can switch on: ``drop_after`` (close the socket after N body bytes, for the next
``drop_times`` CDN responses), ``stall`` (stop sending mid-body until released), and per-file
``served`` bytes that differ from the advertised ones (tampering). Every request is recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional, Union
from urllib.parse import parse_qs, unquote, urlsplit

CHUNK = 1 << 16


def git_blob_sha1(data_path: Path) -> str:
    h = hashlib.sha1(b"blob %d\0" % data_path.stat().st_size)
    with open(data_path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def default_sigint() -> None:
    """For a child process that a test interrupts (``preexec_fn``): a test run started in the
    background (`cmd &` in a script, as CI may be) ignores SIGINT, and its children would
    inherit that: the child would never see the Ctrl-C the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class LoopbackServer:
    """A threaded HTTP server on 127.0.0.1 at a free port, serving from ``__enter__`` to
    ``__exit__``; a subclass gives its request handler (:meth:`handler`) and the event
    ``_resume`` that stalled requests wait on (set on exit, so that none hangs)."""

    _server: Optional[ThreadingHTTPServer] = None
    _resume: threading.Event

    def handler(self) -> type:
        raise NotImplementedError

    def __enter__(self):
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._resume.set()
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]


@dataclass
class HubFileSpec:
    path: Path             # the real content (what paths-info and the headers describe)
    lfs: bool = True
    served: Optional[Path] = None  # bytes actually sent, when a test tampers with them
    sha256: str = ""
    size: int = 0
    oid: str = ""

    def __post_init__(self):
        self.sha256 = sha256_of(self.path)
        self.size = self.path.stat().st_size
        self.oid = git_blob_sha1(self.path)


@dataclass
class Repo:
    commit: str
    files: dict[str, HubFileSpec] = field(default_factory=dict)


@dataclass
class Request:
    method: str
    path: str
    headers: dict  # lower-case names


class FakeHub(LoopbackServer):
    """Start with ``with FakeHub(tmp_dir) as hub:``; ``hub.url`` is the HF_ENDPOINT."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.drop_after: Optional[int] = None
        self.drop_times = 0
        self.stall_after: Optional[int] = None  # stop sending after N body bytes until release()
        self._resume = threading.Event()
        self._lock = threading.Lock()
        self._server: Optional[ThreadingHTTPServer] = None

    # -- content ----------------------------------------------------------------------------

    def add_file(self, repo: str, name: str, content: Union[bytes, Path], *, lfs: bool = True,
                 commit: Optional[str] = None) -> HubFileSpec:
        """Publish ``content`` as ``repo``/``name``; a Path is served from disk, not copied."""
        r = self.repos.setdefault(repo, Repo(commit or hashlib.sha1(repo.encode()).hexdigest()))
        if isinstance(content, bytes):
            path = self.root / hashlib.sha256(content).hexdigest()
            path.write_bytes(content)
        else:
            path = Path(content)
        spec = HubFileSpec(path, lfs=lfs)
        r.files[name] = spec
        return spec

    def tamper(self, repo: str, name: str) -> Path:
        """Serve ``name`` with one byte flipped in the middle: same size, advertised hashes kept."""
        spec = self.repos[repo].files[name]
        bad = self.root / f"tampered-{spec.sha256}"
        shutil.copyfile(spec.path, bad)
        with open(bad, "r+b") as f:
            f.seek(spec.size // 2)
            b = f.read(1)
            f.seek(spec.size // 2)
            f.write(bytes([b[0] ^ 0xFF]))
        spec.served = bad
        return bad

    # -- counters -----------------------------------------------------------------------------

    def count(self, method: Optional[str] = None, prefix: str = "") -> int:
        with self._lock:
            return sum(1 for r in self.requests
                       if (method is None or r.method == method) and r.path.startswith(prefix))

    def cdn_gets(self) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == "GET" and r.path.startswith("/cdn/")]

    def release(self) -> None:
        self.stall_after = None
        self._resume.set()

    def handler(self) -> type:
        return _make_handler(self)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, hf_home: Path, **extra: str) -> dict:
        """A process environment pointing the hub client at this server and ``hf_home``."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("HF_", "HUGGINGFACE_")) and k != "TRANSFORMERS_OFFLINE"}
        env.update(HF_ENDPOINT=self.url, HF_HOME=str(hf_home), HF_HUB_DISABLE_TELEMETRY="1",
                   HF_HUB_DISABLE_XET="1", NO_PROXY="*", no_proxy="*")
        env.update(extra)
        return env


def _make_handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep pytest output clean
            pass

        def _record(self):
            with hub._lock:
                hub.requests.append(Request(self.command, self.path,
                                            {k.lower(): v for k, v in self.headers.items()}))

        def _send(self, status: int, headers: dict, body: bytes = b""):
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, code: str, extra: Optional[dict] = None):
            body = json.dumps({"error": code}).encode()
            self._send(status, {"X-Error-Code": code, "X-Error-Message": code,
                                "Content-Type": "application/json", **(extra or {})}, body)

        # ---- routing

        def do_HEAD(self):
            self._record()
            self._route()

        def do_GET(self):
            self._record()
            self._route()

        def do_POST(self):
            self._record()
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path).path.strip("/").split("/")
            # api/models/{owner}/{name}/paths-info/{revision}
            if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "paths-info":
                return self._paths_info(f"{parts[2]}/{parts[3]}", unquote("/".join(parts[5:])),
                                        body)
            self._error(404, "NotFound")

        def _route(self):
            path = urlsplit(self.path).path
            parts = [unquote(p) for p in path.strip("/").split("/")]
            if parts[0] == "cdn" and len(parts) == 2:
                return self._cdn(parts[1])
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                rev = parts[5] if len(parts) >= 6 and parts[4] == "revision" else "main"
                return self._model_info(f"{parts[2]}/{parts[3]}", rev)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
            self._error(404, "NotFound")

        def _repo(self, repo: str, revision: str) -> Optional[Repo]:
            r = hub.repos.get(repo)
            if r is None:
                self._error(401, "RepoNotFound")
                return None
            if revision not in ("main", r.commit):
                self._error(404, "RevisionNotFound")
                return None
            return r

        def _resolve(self, repo: str, revision: str, name: str):
            r = self._repo(repo, revision)
            if r is None:
                return
            spec = r.files.get(name)
            if spec is None:
                return self._error(404, "EntryNotFound", {"X-Repo-Commit": r.commit})
            common = {"X-Repo-Commit": r.commit, "Accept-Ranges": "bytes"}
            if spec.lfs:
                cdn = f"http://localhost:{hub.port}/cdn/{spec.sha256}"
                return self._send(302, {**common, "Location": cdn,
                                        "ETag": f'"{spec.oid}"',
                                        "X-Linked-Etag": f'"{spec.sha256}"',
                                        "X-Linked-Size": spec.size})
            if self.command == "HEAD":
                self.send_response(200)
                for k, v in {**common, "ETag": f'"{spec.oid}"',
                             "Content-Length": spec.size}.items():
                    self.send_header(k, str(v))
                self.end_headers()
                return
            self._stream(spec, {**common, "ETag": f'"{spec.oid}"'})

        def _cdn(self, sha: str):
            for r in hub.repos.values():
                for name, spec in r.files.items():
                    if spec.sha256 == sha:
                        base = name.rsplit("/", 1)[-1]
                        return self._stream(spec, {
                            "ETag": f'"{sha}"', "Accept-Ranges": "bytes",
                            "Content-Disposition": f'inline; filename="{base}";'})
            self._error(404, "NotFound")

        def _stream(self, spec: HubFileSpec, headers: dict):
            start = 0
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes=") and rng[6:].split("-")[0].isdigit():
                start = int(rng[6:].split("-")[0])
            status = 206 if start else 200
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(spec.size - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{spec.size - 1}/{spec.size}")
            self.end_headers()
            if self.command == "HEAD":
                return
            with hub._lock:
                drop = hub.drop_after if hub.drop_times > 0 else None
                if drop is not None:
                    hub.drop_times -= 1
            try:
                self._body(spec, start, drop)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away (killed, or gave up)

        def _body(self, spec: HubFileSpec, start: int, drop: Optional[int]):
            sent = 0
            with open(spec.served or spec.path, "rb") as f:
                f.seek(start)
                while chunk := f.read(CHUNK):
                    if drop is not None and sent + len(chunk) > drop:
                        self.wfile.write(chunk[:max(0, drop - sent)])
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    if hub.stall_after is not None and sent >= hub.stall_after:
                        self.wfile.flush()
                        hub._resume.wait()
                    self.wfile.write(chunk)
                    sent += len(chunk)

        def _paths_info(self, repo: str, revision: str, body: bytes):
            r = self._repo(repo, revision)
            if r is None:
                return
            if self.headers.get("Content-Type", "").startswith("application/json"):
                paths = json.loads(body or b"{}").get("paths", [])
            else:
                paths = parse_qs(body.decode()).get("paths", [])
            out = []
            for p in paths:
                spec = r.files.get(p)
                if spec is None:
                    continue
                entry = {"type": "file", "path": p, "size": spec.size, "oid": spec.oid}
                if spec.lfs:
                    entry["lfs"] = {"oid": spec.sha256, "size": spec.size, "pointerSize": 134}
                out.append(entry)
            self._send(200, {"Content-Type": "application/json"}, json.dumps(out).encode())

        def _model_info(self, repo: str, revision: str):
            r = self._repo(repo, revision)
            if r is None:
                return
            info = {"id": repo, "modelId": repo, "sha": r.commit, "private": False,
                    "siblings": [{"rfilename": n} for n in r.files]}
            self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode())

    return Handler
