"""The architecture's import rules (docs/architecture.md), each checked so that it cannot pass
vacuously: every optional stack has exactly the importer it is allowed, and that importer
exists; the package's import graph has no cycle, static or through importlib."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "edgespec"

# Third-party stack -> the modules (files or folders under edgespec/) allowed to import it.
RULES = {
    "llama_cpp": "backend/",
    "huggingface_hub": "registry/hub.py",
    "prompt_toolkit": "tui/",
    "starlette": "server/",
    "uvicorn": "server/",
    "llguidance": "constraints.py",
    "prometheus_client": "server/metrics.py",
}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def imports_of(path: Path) -> list[tuple[str, str]]:
    """(absolute module, imported name or '') for every import statement, at any depth."""
    tree = ast.parse(path.read_text())
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out += [(mod, a.name) for a in node.names]
    return out


def users_of(top: str) -> set[str]:
    return {p.relative_to(PKG).as_posix() for p in MODULES.values()
            if any(m.split(".")[0] == top for m, _ in imports_of(p))}


@pytest.mark.parametrize("stack,allowed", sorted(RULES.items()))
def test_each_stack_has_exactly_its_allowed_importer(stack, allowed):
    users = users_of(stack)
    assert users, f"nothing imports {stack}: the rule '{stack} only in {allowed}' is vacuous"
    outside = {u for u in users if not (u.startswith(allowed) if allowed.endswith("/")
                                        else u == allowed)}
    assert not outside, f"{stack} imported outside {allowed}: {sorted(outside)}"


def test_shells_import_shell_never_cli():
    users = {p.relative_to(PKG).as_posix() for p in MODULES.values()
             if any(m == "edgespec.cli" for m, _ in imports_of(p))}
    assert users == {"__main__.py"}


# The command-line shells: the only modules that may import `shell` (what the shells share).
SHELLS = ("cli.py", "worker.py", "model_commands.py", "bench/command.py", "server/command.py",
          "tui/")


def test_core_modules_never_import_the_shells():
    users = {p.relative_to(PKG).as_posix() for p in MODULES.values()
             if any(m == "edgespec.shell" or m == "edgespec" and name == "shell"
                    for m, name in imports_of(p))}
    assert "model_commands.py" in users and "cli.py" in users     # not vacuous
    outside = {u for u in users if not any(u == s or s.endswith("/") and u.startswith(s)
                                           for s in SHELLS)}
    assert not outside, f"core modules import edgespec.shell: {sorted(outside)}"


def edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for name, path in MODULES.items():
        for mod, imported in imports_of(path):
            if not mod.startswith("edgespec"):
                continue
            target = f"{mod}.{imported}" if f"{mod}.{imported}" in MODULES else mod
            if target in MODULES and target != name:
                graph[name].add(target)
    # edgespec/__init__.py loads these through importlib on first use.
    init = ast.parse((PKG / "__init__.py").read_text())
    lazy = next(ast.literal_eval(n.value) for n in init.body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", "") == "_LAZY")
    graph["edgespec"] |= {f"edgespec.{m}" for m in lazy.values()}
    return graph


def test_no_import_cycles():
    graph = edges()
    assert graph["edgespec.cli"] and graph["edgespec"], "the graph came out empty"
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):                       # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_importlib_only_in_the_package_face():
    users = {p.relative_to(PKG).as_posix() for p in MODULES.values()
             if any(m == "importlib" and i in ("", "import_module") for m, i in imports_of(p))}
    assert users == {"__init__.py"}


def test_core_does_not_load_shells():
    code = ("import sys, edgespec, edgespec.engine, edgespec.bench.runner; "
            "bad = [m for m in ('prompt_toolkit', 'huggingface_hub', 'fastapi', 'uvicorn', "
            "'starlette') if m in sys.modules]; print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_the_loop_and_drafters_run_without_llama_cpp():
    """speculative.py and drafting/ are typed against edgespec.lm's protocol: with llama_cpp
    made unimportable they import and decode on the tests' numpy model."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "tests")!r})

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "llama_cpp":
                    raise ImportError("llama_cpp is blocked in this test")
        sys.meta_path.insert(0, Block())

        import numpy as np
        from edgespec.config import SamplingParams
        from edgespec.drafting import (FixedLength, HybridDrafter, ModelDrafter,
                                       NgramDrafter)
        from edgespec.results import LoopStats
        from edgespec.speculative import decode
        from markov import MarkovLM

        rng = np.random.default_rng(0)
        logits = rng.normal(0, 2, (12, 12)).astype(np.float32)
        target, draft = MarkovLM(logits), MarkovLM(logits)
        drafter = HybridDrafter(ModelDrafter(draft, frozenset(), FixedLength(4)),
                                NgramDrafter(FixedLength(4)))
        context = [1, 2, 3]
        target.eval(context[:-1], 0)
        stats = LoopStats()
        out = [s.token for s in decode(target, context, params=SamplingParams(temperature=0),
                                       rng=rng, max_tokens=20, drafter=drafter, stats=stats)]
        assert len(out) == 20 and stats.accepted == stats.drafted > 0, (out, stats)
        assert "llama_cpp" not in sys.modules
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# The layers, lowest first: a module imports its own layer's and the ones below, never above.
# Every top-level name under edgespec/ is in exactly one (a new module must choose).
LAYERS = [
    ("foundation", {"errors", "config", "paths", "gguf_file", "lm", "cpuload", "textstream"}),
    ("backend", {"backend"}),
    ("loop", {"sampling", "verify", "speculative", "results", "drafting", "prompt_cache",
              "constraints", "embedding"}),
    ("prompts", {"chat_template", "thinking", "tools", "conversation"}),
    ("models", {"registry", "stores", "catalogue"}),
    ("runtime", {"engine"}),
    ("apps", {"shell", "cli", "__main__", "worker", "model_commands", "bench", "server",
              "tui", ""}),
]
RANK = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}


def top_name(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_has_a_layer():
    missing = {top_name(m) for m in MODULES} - set(RANK)
    assert not missing, f"modules with no layer in LAYERS: {sorted(missing)}"


def test_no_module_imports_a_layer_above_its_own():
    graph = edges()
    up = [(a, b) for a, targets in graph.items() for b in targets
          if RANK[top_name(b)] > RANK[top_name(a)]]
    assert sum(len(t) for t in graph.values()) > 200       # the graph is the real one
    assert not up, f"upward imports: {sorted(up)}"


def test_the_runtime_has_its_own_package():
    runtime = {m.split(".")[-1] for m in MODULES if m.startswith("edgespec.engine.")}
    assert {"engine", "request", "generation", "prompting", "drafting", "lanes", "rounds",
            "stream_model", "streams", "threads"} <= runtime
    flat = [p for p in PKG.glob("*.py")]
    assert len(flat) <= 26, f"{len(flat)} modules lie flat in edgespec/"



# The server's APIs, a package each under server/: an API's modules import their own package
# and the shared modules of server/, never another API's; only the app, which mounts every
# API's routes, imports them (docs/architecture.md).
SERVER_APIS = ("openai", "ollama", "anthropic", "llamacpp")
SERVER_ASSEMBLY = "edgespec.server.app"


def api_of(module: str) -> Optional[str]:
    """The API whose package holds ``module`` (None: not in one)."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["edgespec", "server"] and len(parts) > 2 \
        and parts[2] in SERVER_APIS else None


def api_crossings(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The (importer, imported) edges of ``graph`` into an API's package from outside it,
    the app's excepted."""
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if api_of(b) is not None and api_of(b) != api_of(a) and a != SERVER_ASSEMBLY)


def test_each_server_api_imports_no_other():
    graph = edges()
    for api in SERVER_APIS:     # not vacuous: each API is a package the app mounts
        modules = {m for m in MODULES if api_of(m) == api}
        assert {f"edgespec.server.{api}.{m}" for m in ("request", "replies", "routes")} <= modules
        assert any(api_of(b) == api for b in graph[SERVER_ASSEMBLY]), f"app.py mounts no {api}"
        assert any(b.startswith("edgespec.server.") and api_of(b) is None
                   for m in modules for b in graph[m]), f"{api} imports no shared module"
    assert not api_crossings(graph), f"imports across the server's APIs: {api_crossings(graph)}"


def test_api_crossings_are_caught():
    """The rule finds a planted import from one API into another, and from a shared module
    into an API, but not the app's nor an API's own."""
    graph = {m: set(t) for m, t in edges().items()}
    planted = [("edgespec.server.openai.routes", "edgespec.server.ollama.replies"),
               ("edgespec.server.llamacpp.replies", "edgespec.server.openai"),
               ("edgespec.server.generation", "edgespec.server.anthropic.request")]
    for a, b in planted:
        graph[a].add(b)
    graph["edgespec.server.ollama.routes"].add("edgespec.server.ollama.options")
    assert api_crossings(graph) == sorted(planted)


# A module a reader can hold in mind at once (docs/architecture.md).
MAX_LINES = 400


def test_no_module_is_over_the_line_limit():
    long = {p.relative_to(PKG).as_posix(): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert len(MODULES) > 100
    assert not long, f"modules over {MAX_LINES} lines: {long}"


# A function a reader can follow at once: the speculative loop's ~60 lines of algorithm (and
# its docstring) fit; what a function does besides its own steps goes to named helpers.
MAX_FUNCTION_LINES = 80


def test_no_function_is_over_the_line_limit():
    long = {}
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(PKG).as_posix()}:{node.lineno} {node.name}"] = n
    assert len(MODULES) > 100
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


# The server's modules that answer no HTTP themselves: the parsers, what they share, the
# replies (docs/architecture.md: "plain Python"); and the command, which loads uvicorn only
# inside the functions that serve.
HTTP_STACK = ("starlette", "uvicorn")


def http_free(rel: str) -> bool:
    return rel.startswith("server/") and rel.rsplit("/", 1)[-1] in (
        "request.py", "replies.py", "options.py", "wire.py")


def third_party_imports(source: str, top_level_only: bool = False) -> set[str]:
    """The top packages ``source`` imports absolutely, at any depth (or only at its top
    level, not inside a function)."""
    nodes = ast.parse(source).body if top_level_only else ast.walk(ast.parse(source))
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def http_leaks(sources: dict[str, str]) -> list[str]:
    """Of ``sources`` ({path under edgespec/: text}): the parsers and replies that import the
    HTTP stack at all, and a server command that imports it at its top level."""
    bad = [rel for rel, text in sources.items()
           if http_free(rel) and third_party_imports(text) & set(HTTP_STACK)]
    command = sources.get("server/command.py")
    if command is not None and third_party_imports(command, top_level_only=True) \
            & set(HTTP_STACK):
        bad.append("server/command.py")
    return sorted(bad)


def test_the_parsers_and_replies_are_plain_python():
    sources = {p.relative_to(PKG).as_posix(): p.read_text() for p in MODULES.values()}
    free = [rel for rel in sources if http_free(rel)]
    assert len(free) >= 9 and "server/wire.py" in free     # each API's parser and replies
    assert "uvicorn" in third_party_imports(sources["server/command.py"])   # (when it serves)
    assert not http_leaks(sources), f"the HTTP stack imported by: {http_leaks(sources)}"


def test_http_leaks_are_caught():
    """A parser importing Starlette anywhere, and the command importing uvicorn at its top
    level, are found; the command's import inside a function, and the app's, are not."""
    planted = {"server/openai/request.py": "def f():\n    from starlette.requests import Request\n",
               "server/ollama/replies.py": "import json\n",
               "server/command.py": "import uvicorn\n",
               "server/app.py": "from starlette.applications import Starlette\n"}
    assert http_leaks(planted) == ["server/command.py", "server/openai/request.py"]
    planted["server/command.py"] = "def serve():\n    import uvicorn\n"
    assert http_leaks(planted) == ["server/openai/request.py"]


# The loop runs without llama.cpp; the one loop module that imports the backend is
# embedding.py (docs/architecture.md, "The layers").
LOOP_BACKEND_IMPORTERS = {"edgespec.embedding"}


def loop_backend_importers(graph: dict[str, set[str]]) -> set[str]:
    loop = dict(LAYERS)["loop"]
    return {a for a, targets in graph.items() if top_name(a) in loop
            and any(top_name(b) == "backend" for b in targets)}


def test_only_embedding_imports_the_backend_from_the_loop():
    graph = edges()
    assert loop_backend_importers(graph) == LOOP_BACKEND_IMPORTERS
    graph["edgespec.drafting.model"].add("edgespec.backend.model")      # planted
    assert loop_backend_importers(graph) == LOOP_BACKEND_IMPORTERS | {"edgespec.drafting.model"}
