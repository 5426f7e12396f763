"""docs/architecture.md's module map is the tree: every module under edgespec/ is listed, under
the layer tests/test_layering.py gives it, and nothing listed is missing from the tree; every
path and every ``module.name`` the page names exists. No model, no network."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "edgespec"
DOC = ROOT / "docs" / "architecture.md"

MAP_HEADING = "## The module map"
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(.*?)\s*\|\s*$")
CODE_SPAN = re.compile(r"`([^`\n]+)`")


def layering():
    """tests/test_layering.py, loaded by path (its LAYERS are the layers' source of truth)."""
    spec = importlib.util.spec_from_file_location("_layering", ROOT / "tests" / "test_layering.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def module_map() -> dict[str, tuple[str, str]]:
    """{path of a module under edgespec/: (its layer's heading, its description)}, from the
    tables of the module map; a package is listed as ``name/`` for its ``__init__.py``."""
    text = DOC.read_text(encoding="utf-8")
    assert MAP_HEADING in text, f"{DOC.name} has no '{MAP_HEADING}' section"
    section = text.split(MAP_HEADING, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    layer = ""
    for line in section.splitlines():
        if line.startswith("### "):
            layer = line[4:].strip()
        elif m := ROW.match(line):
            path, job = m.groups()
            if path == "module":
                continue
            path = path + "__init__.py" if path.endswith("/") else path
            assert path not in rows, f"{path} is listed twice in {DOC.name}"
            rows[path] = (layer, job)
    return rows


def tree() -> set[str]:
    return {p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")}


def test_the_map_lists_every_module_and_only_those():
    listed, present = set(module_map()), tree()
    missing, extra = sorted(present - listed), sorted(listed - present)
    assert not missing and not extra, (
        f"docs/architecture.md's module map is not the tree: "
        f"not listed: {missing or 'none'}; listed but not in edgespec/: {extra or 'none'} "
        f"(add each new module with a one-line job, under its layer; remove the gone ones)")


def test_every_module_is_under_its_layer():
    mod = layering()
    rank = {name: layer for layer, names in mod.LAYERS for name in names}
    rows = module_map()
    headings = list(dict.fromkeys(layer for layer, _ in rows.values()))
    assert headings == [layer for layer, _ in mod.LAYERS], \
        f"the map's layers {headings} are not test_layering's {[n for n, _ in mod.LAYERS]}"
    wrong = []
    for path, (layer, job) in rows.items():
        top = path.split("/")[0].removesuffix(".py")
        top = "" if top == "__init__" else top
        if rank.get(top) != layer:
            wrong.append(f"{path} under {layer}, its layer is {rank.get(top)}")
        if not job:
            wrong.append(f"{path} has no description")
    assert not wrong, "; ".join(wrong)


def defined_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return names


def test_the_names_the_page_gives_exist():
    """Every path in a code span (``backend/model.py``, ``tests/test_layering.py``) exists
    under edgespec/ or the repository; every ``module.name`` whose module is a file of the
    package (``verify.verify_block``, ``cli.cmd_run``) is defined there."""
    text = DOC.read_text(encoding="utf-8")
    spans = set(CODE_SPAN.findall(text))
    bad, checked = [], 0
    for span in sorted(spans):
        if re.fullmatch(r"[\w./-]+(\.py|/)", span):
            checked += 1
            if not ((PKG / span).exists() or (ROOT / span).exists()):
                bad.append(f"`{span}`: no such file or folder")
        elif m := re.fullmatch(r"([a-z_]+(?:\.[a-z_]+)*)\.([A-Za-z_]\w*)", span):
            module, name = m.groups()
            file = PKG / (module.replace(".", "/") + ".py")
            if not file.exists():
                file = PKG / module.replace(".", "/") / "__init__.py"
            if file.exists():
                checked += 1
                if name not in defined_names(file):
                    bad.append(f"`{span}`: {file.relative_to(ROOT)} defines no {name}")
    assert checked > 20, "the page's names were not found (the check would be vacuous)"
    assert not bad, "docs/architecture.md names what does not exist: " + "; ".join(bad)
