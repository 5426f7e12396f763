"""Import rules from the architecture: the core loads no UI, hub or HTTP stack, and only the
backend touches llama_cpp."""

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "edgespec"


def test_core_does_not_load_shells():
    code = ("import sys, edgespec, edgespec.engine, edgespec.bench; "
            "bad = [m for m in ('prompt_toolkit', 'huggingface_hub', 'fastapi', 'uvicorn', "
            "'starlette') if m in sys.modules]; print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_backend_imports_llama_cpp():
    users = {p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")
             if "llama_cpp" in imports_of(p)}
    assert users == {"backend.py"}


def test_only_hub_imports_huggingface_hub():
    users = {p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")
             if "huggingface_hub" in imports_of(p)}
    assert users <= {"hub.py"}
