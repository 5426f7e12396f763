"""``edgespec serve``: parse the options, check where to listen, load the pair, serve it and
every other model on disk (loaded when a request names one).

Imported whenever the command line is built, so it imports nothing of the HTTP stack at module
level; :func:`cmd_serve` does, when the command actually runs.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
from pathlib import Path

from .. import config
from ..errors import EdgespecError
from ..shell import (Progress, UsageError, add_model_args, load_engine, model_label,
                     resolve_models, status)

API_KEY_ENV = "EDGESPEC_API_KEY"
GRACEFUL_SHUTDOWN_SECONDS = 3


def build_serve_parser(sub) -> None:
    p = sub.add_parser(
        "serve", help="an OpenAI- and Ollama-compatible HTTP server for local apps",
        description="Serve the models on this machine over OpenAI's HTTP API "
                    "(/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models), "
                    "Ollama's (/api/chat, /api/generate, /api/embed, /api/embeddings, "
                    "/api/tags, /api/show, /api/ps, /api/version, /api/pull, /api/delete, "
                    "/api/copy) and Anthropic's (/v1/messages), llama-server's /infill "
                    "(editors' autocomplete), plus /health and, with --metrics, /metrics. "
                    "The pair "
                    "given is loaded at start; a request naming another model on disk loads "
                    "it. For apps that speak only Ollama's API: --port 11434.")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; any "
                        "other address needs --api-key)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free)")
    p.add_argument("--api-key", metavar="KEY", action="append",
                   help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}); "
                        "repeatable, one per app or user: each key's requests then draft "
                        "from their own index of earlier requests")
    p.add_argument("--shared-suffix-index", action="store_true",
                   help="with several --api-key: let every key's requests draft from one "
                        "index of all earlier requests (faster repeats across apps; a fast "
                        "answer can then tell one key's user that another asked the same)")
    p.add_argument("--allow-origin", "--cors-origin", dest="allow_origin", action="append",
                   default=[], metavar="ORIGIN",
                   help="let web pages and apps from ORIGIN call the server (e.g. "
                        "app://obsidian.md, http://localhost:3000); '*' wildcards as in "
                        "OLLAMA_ORIGINS (http://localhost:*, chrome-extension://*; '*' alone "
                        "only with --api-key); repeatable; none by default: other origins "
                        "are refused (the server's own chat page needs none)")
    g = p.add_argument_group("models on demand")
    g.add_argument("--max-loaded", type=int, default=1, metavar="N",
                   help="models (a pair counts as one) loaded at once; the least recently "
                        "used idle one is unloaded to load another (default 1); embedding "
                        "models are counted apart, so one stays loaded beside a chat model")
    g.add_argument("--max-ram", type=float, metavar="GiB",
                   help="memory the loaded models may take in all (files and KV caches, "
                        "estimated); default: no limit")
    g.add_argument("--keep-alive", default="5m", metavar="DURATION",
                   help="how long an idle model stays loaded, as Ollama's keep_alive: 30s, "
                        "5m, 1h, -1 (for ever), 0 (unload when idle) (default 5m); a "
                        "request's keep_alive overrides it")
    g.add_argument("--model-alias", action="append", default=[], metavar="ALIAS=MODEL",
                   help="answer requests naming ALIAS with MODEL (e.g. gpt-4o-mini=smollm2-"
                        "135m); repeatable. Without one, a name not on disk is a 404")
    g.add_argument("--parallel", type=int, default=None, metavar="N",
                   help=f"generations each model runs at once, batched into its passes, each "
                        f"with its own --ctx-size of KV cache (default {config.PARALLEL}; 1 "
                        "with --rpc); short ones may run beyond it (--streams), more wait in "
                        "a queue")
    g.add_argument("--streams", type=int, default=None, metavar="S",
                   help="generations each model runs at once in all (default twice "
                        "--parallel): those beyond --parallel share the KV cache of --parallel "
                        "contexts, each entering while its prompt and max_tokens fit beside "
                        "the others'; more wait in the queue")
    g.add_argument("--cache-ram", type=int, default=config.CACHE_RAM_MIB, metavar="MiB",
                   help="host memory per loaded model for the KV states of other "
                        "conversations than the live one (both models), so that switching "
                        f"conversations does not evaluate them again (default "
                        f"{config.CACHE_RAM_MIB}; 0: off)")
    p.add_argument("--metrics", action="store_true",
                   help="serve Prometheus metrics at /metrics (behind the API key, if any)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    add_model_args(p, auto_draft=True)
    for action in p._actions:       # no --ctx-size: each model's own (server/contexts.py)
        if action.dest == "ctx_size":
            action.default = None
            action.help = ("each model's context per lane, in tokens (default: its trained "
                           "context, as far as both models' KV caches for every lane fit in "
                           "--max-ram or a quarter of this machine's memory; at least 4096); "
                           "a request's num_ctx may ask for more, up to the trained context")
    p.set_defaults(func=cmd_serve)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_options(host: str, port: int, api_key: list[str] | str | None,
                  cors: list[str]) -> None:
    """The bind, key and CORS rules; raises :class:`UsageError` (one line) when broken."""
    keys = [api_key] if isinstance(api_key, str) else list(api_key or ())
    if any(not re.fullmatch(r"[!-~]+", k) for k in keys):
        raise UsageError("--api-key must be non-empty printable ASCII without spaces")
    if not is_loopback(host) and not api_key:
        raise UsageError(f"refusing to listen on {host or 'all addresses'} without an API key: "
                         "anyone who can reach it could use it; pass --api-key KEY (or set "
                         f"{API_KEY_ENV}), or keep the default --host 127.0.0.1")
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a port number (0-65535)")
    from .origins import Origins, check_pattern
    for pattern in cors:
        if (problem := check_pattern(pattern)) is not None:
            raise UsageError(problem)
        if Origins([pattern]).any_site() and not api_key:
            raise UsageError(f"--allow-origin {pattern!r} would let any web page use this "
                             "server: name the origins, or pass --api-key")


def listen(host: str, port: int) -> socket.socket:
    """A listening socket, so that a busy port is a one-line error before the models load."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def parse_aliases(pairs: list[str]) -> dict[str, str]:
    aliases = {}
    for item in pairs:
        alias, sep, name = item.partition("=")
        if not sep or not alias.strip() or not name.strip():
            raise UsageError(f"--model-alias {item!r}: write ALIAS=MODEL, e.g. "
                             "gpt-4o-mini=smollm2-135m")
        aliases[alias.strip()] = name.strip()
    return aliases


def manager_options(args) -> dict:
    """The ModelManager's budget and keep-alive from the options (one-line errors)."""
    from .keep_alive import parse_keep_alive
    from .wire import APIError
    if args.max_loaded < 1:
        raise UsageError(f"--max-loaded {args.max_loaded}: at least 1 model must fit")
    if args.max_ram is not None and args.max_ram <= 0:
        raise UsageError(f"--max-ram {args.max_ram:g}: give a positive number of GiB")
    if args.cache_ram < 0:
        raise UsageError(f"--cache-ram {args.cache_ram}: give MiB >= 0 (0 turns it off)")
    try:
        keep_alive = parse_keep_alive(args.keep_alive)
    except APIError as e:
        raise UsageError(f"--keep-alive: {e.message}") from None
    # the core's checks (Engine.load's too), before any model is fetched or loaded
    remote = bool(args.rpc or args.draft_rpc)
    if args.parallel is None:
        args.parallel = 1 if remote else config.PARALLEL
    args.parallel = config.check_parallel(args.parallel, remote)
    if args.streams is None:        # serve's default: twice the whole contexts
        args.streams = min(2 * args.parallel, config.MAX_STREAMS) if args.parallel > 1 else 1
    args.streams = config.check_streams(args.streams, args.parallel, remote)
    return dict(max_loaded=args.max_loaded, keep_alive=keep_alive, parallel=args.parallel,
                max_ram=int(args.max_ram * 2**30) if args.max_ram else None,
                aliases=parse_aliases(args.model_alias))


def loader(args):
    """How the server loads a model a request names: the options of the command line, with
    that model's files (a GGUF without a draft decodes with n-gram drafting, or plainly; an
    embedding model is an Embedder) and the context asked for (None: ``--ctx-size``)."""
    from ..catalogue import ModelKind
    from ..registry.auto_draft import chosen
    server_log = logging.getLogger("edgespec.server")

    def load(entry, n_ctx):
        server_log.info("loading %s …", entry.name)
        if entry.kind is ModelKind.EMBEDDING:
            from ..embedding import Embedder
            return Embedder.load(entry.target, n_ctx=args.ctx_size or config.N_CTX,
                                 n_threads=args.threads,
                                 n_gpu_layers=args.n_gpu_layers, verbose=args.verbose,
                                 cpu_extra_buffers=args.cpu_extra_buffers)
        drafter = args.drafter
        if entry.draft is None and drafter in (None, "hybrid", "model"):    # (none chosen for
            drafter = "ngram" if chosen(args, entry.target, None) else None  # it: n-grams)
        engine = load_engine(args, say=server_log.info, target=entry.target,
                             parallel=args.parallel, streams=args.streams,
                             draft=entry.draft, drafter=drafter, cache_ram=args.cache_ram,
                             n_ctx=n_ctx or args.ctx_size or config.N_CTX)
        server_log.info("loaded %s", entry.name)
        return engine
    return load


def model_id(args) -> str:
    """The model name clients see: the pair, the name another app's store gives the target
    (``qwen2.5-coder:1.5b``), or the target file's name without .gguf."""
    if not args.target:
        return model_label(args)
    from ..stores import store_model
    named = store_model(args.target)
    return named.name if named is not None else Path(args.target).name.removesuffix(".gguf")


def _log_like_uvicorn(level: str) -> None:
    """The server's own lines (one per generation) in uvicorn's format, next to its lines."""
    from uvicorn.logging import DefaultFormatter
    handler = logging.StreamHandler()
    handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s"))
    logger = logging.getLogger("edgespec.server")
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def first_context(args, name: str, budget: dict) -> tuple[int, str]:
    """The context to load the model the server starts with, and why (--ctx-size, or its
    own default: :func:`.contexts.auto_context`)."""
    from ..catalogue import entry_for
    from .contexts import auto_context
    from .slots import Budget
    if args.ctx_size is not None:
        return args.ctx_size, "--ctx-size"
    progress = Progress()           # (a draft chosen for the target is measured here, once)
    try:
        target, draft = resolve_models(args, progress)
    finally:
        progress.done()
    if args.no_spec or args.drafter in ("none", "ngram"):
        draft = None
    entry = entry_for(name, Path(target), Path(draft) if draft else None)
    return auto_context(entry, Budget(budget["max_loaded"], budget["max_ram"],
                                      budget["parallel"]))


def memory_line(entry, n_ctx: int, parallel: int, max_ram) -> str:
    """What the model the server starts with takes, said at start: its files and the KV cache
    of each of its ``parallel`` contexts (the estimate --max-ram is held to; the lanes share
    those cells)."""
    from .slots import gb
    each = entry.kv_bytes_per_token * n_ctx
    within = f", within --max-ram {gb(max_ram)}" if max_ram else ""
    return (f"memory: about {gb(entry.memory(n_ctx * parallel))} (files {gb(entry.size)}, "
            f"KV cache {gb(each)} a context x {parallel}){within}")


def cmd_serve(args) -> int:
    api_key = args.api_key if args.api_key else (
        [os.environ[API_KEY_ENV]] if os.environ.get(API_KEY_ENV) else None)
    check_options(args.host, args.port, api_key, args.allow_origin)
    budget = manager_options(args)
    try:
        import uvicorn

        from .app import create_app
        from ..catalogue import ModelKind, entry_for, scan_catalog
        from .models import ModelManager
        metrics = None
        if args.metrics:
            from .metrics import Metrics
    except ImportError as e:
        raise EdgespecError(f"the server needs the HTTP stack ({e.name} is not installed): "
                            "pip install 'edgespec[server]'") from None
    sock = listen(args.host, args.port)
    try:
        name = model_id(args)
        n_ctx, why = first_context(args, name, budget)
        with load_engine(args, cache_ram=args.cache_ram, parallel=args.parallel,
                         streams=args.streams, n_ctx=n_ctx) as engine:
            first = entry_for(name, engine.target.path,
                              engine.draft.path if engine.draft is not None else None)
            manager = ModelManager(lambda: scan_catalog(extra=[first]), loader(args),
                                   preloaded=(name, engine), n_ctx=engine.n_ctx,
                                   auto_ctx=args.ctx_size is None, **budget)
            if args.metrics:
                metrics = Metrics(lambda: [(m.name, manager.engine_for(m.name))
                                           for m in manager.loaded()
                                           if m.entry.kind is not ModelKind.EMBEDDING])
            app = create_app(manager=manager, n_ctx=engine.n_ctx, api_key=api_key,
                             cors_origins=args.allow_origin, host=args.host, metrics=metrics,
                             close_on_shutdown=True,
                             shared_index=args.shared_suffix_index)
            _log_like_uvicorn(args.log_level)
            config = uvicorn.Config(app, log_level=args.log_level, lifespan="on",
                                    timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
                                    server_header=False)
            host, port = sock.getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            status(f"edgespec serve: listening on http://{shown}:{port}/v1 (model {name!r}"
                    + (", API key required" if api_key else "") + f"); Ollama's API at "
                    f"http://{shown}:{port}/api, a chat page at http://{shown}:{port}/")
            trained = engine.target.n_ctx_train
            more = ("; a request's num_ctx may ask for more, up to " f"{trained}"
                    if trained and trained > engine.n_ctx else
                    "; a request's num_ctx beyond it is clamped")
            beyond = (f", up to {args.streams} while their prompts and max_tokens fit"
                      if args.streams > args.parallel else "")
            status(f"context: {engine.n_ctx} tokens for each of {args.parallel} "
                   f"generation(s) at once{beyond} ({why}){more}")
            status(memory_line(first, engine.n_ctx, args.parallel, budget["max_ram"]))
            uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0
