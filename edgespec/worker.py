"""``edgespec worker``: serve this machine's devices to other edgespec processes over
llama.cpp's RPC protocol (ggml-rpc), so that a target too large for one machine is spread over
several (``--rpc HOST:PORT,…`` on ``run``, ``chat``, ``serve``, ``bench``).

The protocol has no authentication and no encryption: a worker binds 127.0.0.1 unless told
otherwise, and says so when it starts.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from .config import RPC_PORT
from .shell import UsageError, status

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def cmd_worker(args) -> int:
    from .backend import rpc
    from .config import default_threads
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: must be in 1-65535")
    threads = args.threads or default_threads()
    if threads < 1:
        raise UsageError(f"--threads {threads}: must be >= 1")
    rpc._lib()                                   # the rebuild hint, before anything else
    status("warning: llama.cpp's RPC protocol has no authentication and no encryption: anyone "
           f"who can reach {args.host}:{args.port} can use this machine's memory and compute. "
           "Use it on a trusted LAN only" + ("" if args.host in LOOPBACK else
                                             " (this worker is open to the network)") + ".")
    status(f"edgespec worker on {args.host}:{args.port}, {threads} threads, serving "
           + ", ".join(rpc.worker_devices()) + "; clients: --rpc "
           f"{args.host}:{args.port}. Ctrl-C stops it.")
    failure: list = []

    def run() -> None:
        try:
            rpc.serve(args.host, args.port, threads, args.cache_dir)
        except BaseException as e:   # noqa: BLE001 - handed to the main thread
            failure.append(e)

    # ggml_backend_rpc_start_server never returns while it serves, and Python runs signal
    # handlers only in the main thread: serve from a daemon thread, wait here.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    server = threading.Thread(target=run, name="rpc-worker", daemon=True)
    server.start()
    code = 0
    try:
        while server.is_alive() and not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        code = 130
    if failure:
        raise failure[0]
    status("worker stopped")
    sys.stdout.flush()
    sys.stderr.flush()
    # The serving thread is inside a blocking accept() in C: end the process without running
    # C++ teardown under it.
    os._exit(code)


def build_worker_parser(sub) -> None:
    p = sub.add_parser("worker", help="serve this machine's devices to other edgespec "
                                      "processes (llama.cpp RPC; trusted LAN only)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 opens it to the "
                        "network: the protocol has no authentication or encryption)")
    p.add_argument("--port", type=int, default=RPC_PORT,
                   help=f"TCP port (default {RPC_PORT})")
    p.add_argument("--threads", "-t", type=int, metavar="N",
                   help="CPU threads for the layers computed here")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="keep large tensors here by hash, so that a client loading the same "
                        "model again sends only their hashes")
    p.set_defaults(func=cmd_worker)
