"""Each object's attributes are set by its own class (issue 56): inside edgespec/engine/ and
edgespec/drafting/ no statement assigns to an attribute of anything but ``self`` or ``cls``
(nor calls ``setattr`` on anything else), and no module of edgespec/ assigns, on anything but
``self``/``cls``, an attribute that only classes of those two packages have. What another
object should change, a method of its class says (``lane.draft_from(index)``, not
``lane.suffix = index``). Read from the source by AST; each check is shown to catch a
planted example, so that it cannot pass vacuously."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "edgespec"
OWNED = ("engine", "drafting")          # the packages whose objects keep their attributes
OWN = ("self", "cls")


@functools.lru_cache(maxsize=None)
def _parse(source: str) -> ast.Module:
    return ast.parse(source)


def _targets(node: ast.AST) -> list[ast.expr]:
    """The single targets an assignment statement binds (tuples unpacked)."""
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        found = [node.target]
    else:
        return []
    out: list[ast.expr] = []
    while found:
        t = found.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            found += t.elts
        elif isinstance(t, ast.Starred):
            found.append(t.value)
        else:
            out.append(t)
    return out


def _own(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Name) and expr.id in OWN


def foreign_assignments(source: str) -> list[tuple[int, str, str]]:
    """(line, attribute name, statement) of every assignment to an attribute of anything
    but ``self``/``cls`` (``o.x = …``, ``o.x += …``, ``self.a.x = …``, ``setattr(o, …)``)."""
    out = []
    for node in ast.walk(_parse(source)):
        for t in _targets(node):
            if isinstance(t, ast.Attribute) and not _own(t.value):
                out.append((node.lineno, t.attr, ast.unparse(t)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "setattr" and node.args and not _own(node.args[0]):
            name = node.args[1].value if len(node.args) > 1 and isinstance(
                node.args[1], ast.Constant) else "?"
            out.append((node.lineno, name, ast.unparse(node)))
    return out


def class_attributes(source: str) -> set[str]:
    """The attributes the classes of ``source`` give themselves: ``self.x = …`` in their
    methods, and the names their bodies bind (dataclass fields, class constants)."""
    out: set[str] = set()
    for cls in (n for n in ast.walk(_parse(source)) if isinstance(n, ast.ClassDef)):
        for node in cls.body:
            out |= {t.id for t in _targets(node) if isinstance(t, ast.Name)}
        for node in ast.walk(cls):
            out |= {t.attr for t in _targets(node)
                    if isinstance(t, ast.Attribute) and _own(t.value)}
    return out


def _modules() -> dict[str, str]:
    return {p.relative_to(PKG).as_posix(): p.read_text() for p in sorted(PKG.rglob("*.py"))}


def _owned(rel: str) -> bool:
    return rel.split("/")[0] in OWNED


def only_owned_attributes(modules: dict[str, str]) -> set[str]:
    """The attribute names that classes of engine/ and drafting/ have and no other
    class of edgespec/ does: set on anything else, they can only be set on those objects."""
    inside: set[str] = set()
    outside: set[str] = set()
    for rel, source in modules.items():
        (inside if _owned(rel) else outside).update(class_attributes(source))
    return inside - outside


# What the shells and apps call an Engine they hold.
ENGINE_NAMES = {"engine", "eng", "_engine"}
# What they call objects of no engine/drafting class whatever their attributes' names:
# argparse's namespace of options (``args.parallel``).
NOT_ENGINE = {"args"}


def engine_classes(modules: dict[str, str]) -> set[str]:
    """The names of the classes engine/ and drafting/ define."""
    return {n.name for rel, source in modules.items() if _owned(rel)
            for n in ast.walk(_parse(source)) if isinstance(n, ast.ClassDef)}


def bound_names(source: str, classes: set[str]) -> set[str]:
    """Names ``source`` binds to objects of ``classes`` (anywhere in it): parameters so
    annotated, results of their constructors or class methods (``Engine.load(...)``,
    ``with Engine.load(...) as eng``), and what it calls an Engine (:data:`ENGINE_NAMES`)."""
    def of_class(expr) -> bool:
        if isinstance(expr, ast.Call):
            expr = expr.func
        if isinstance(expr, ast.Attribute):
            expr = expr.value
        return isinstance(expr, ast.Name) and expr.id in classes
    out = set(ENGINE_NAMES)
    for node in ast.walk(_parse(source)):
        if isinstance(node, ast.arg) and node.annotation is not None:
            words = set(ast.unparse(node.annotation).replace("'", " ").replace('"', " ")
                        .replace("[", " ").replace("]", " ").replace(",", " ").split())
            if words & classes:
                out.add(node.arg)
        elif isinstance(node, ast.Assign) and of_class(node.value):
            out |= {t.id for t in _targets(node) if isinstance(t, ast.Name)}
        elif isinstance(node, ast.withitem) and of_class(node.context_expr) \
                and isinstance(node.optional_vars, ast.Name):
            out.add(node.optional_vars.id)
    return out


def assignments_on(source: str, names: set[str]) -> list[tuple[int, str, str]]:
    """The foreign assignments of ``source`` to an attribute of a name in ``names`` (or of
    an attribute so named: ``slot.engine.x``)."""
    def on_named(t: ast.Attribute) -> bool:
        base = t.value
        return (isinstance(base, ast.Name) and base.id in names
                or isinstance(base, ast.Attribute) and base.attr in names)
    out = []
    for line, name, text in foreign_assignments(source):
        target = ast.parse(text).body[0].value
        if isinstance(target, ast.Attribute) and on_named(target):
            out.append((line, name, text))
        elif isinstance(target, ast.Call) and isinstance(target.args[0], ast.Name) \
                and target.args[0].id in names:
            out.append((line, name, text))
    return out


def test_engine_and_drafting_assign_only_their_own_attributes():
    modules = {r: s for r, s in _modules().items() if _owned(r)}
    assert len(modules) > 20 and "engine/drafting.py" in modules       # the real packages
    bad = [f"{rel}:{line}: {text}" for rel, source in modules.items()
           for line, _, text in foreign_assignments(source)]
    assert not bad, "attributes assigned from outside their class:\n" + "\n".join(bad)


def test_no_module_assigns_an_engine_or_drafting_attribute():
    modules = _modules()
    names = only_owned_attributes(modules)
    classes = engine_classes(modules)
    assert {"turns", "on_advance", "costs"} <= names and "Engine" in classes  # not vacuous
    bad = [f"{rel}:{line}: {text}" for rel, source in modules.items() if not _owned(rel)
           for line, name, text in foreign_assignments(source)
           if name in names and text.split(".")[0] not in NOT_ENGINE]
    bad += [f"{rel}:{line}: {text}" for rel, source in modules.items() if not _owned(rel)
            for line, _, text in assignments_on(source, bound_names(source, classes))]
    assert not bad, ("engine/drafting attributes assigned from another module:\n"
                     + "\n".join(bad))


PLANTED = """
class Owner:
    limit: int = 3

    def __init__(self, other):
        self.mine = 1
        self.part, other.theirs = 2, 3

    def tweak(self, lane):
        lane.suffix = None
        lane.count += 1
        self.costs.position = len
        setattr(lane, "turns", None)
        setattr(self, "fine", 1)
"""


def test_the_checks_catch_planted_assignments():
    found = {(name, text) for _, name, text in foreign_assignments(PLANTED)}
    assert found == {("theirs", "other.theirs"), ("suffix", "lane.suffix"),
                     ("count", "lane.count"), ("position", "self.costs.position"),
                     ("turns", "setattr(lane, 'turns', None)")}
    assert class_attributes(PLANTED) == {"limit", "mine", "part"}
    names = only_owned_attributes({"engine/planted.py": PLANTED,
                                   "shell.py": "class Other:\n    part = 0\n"})
    assert names == {"limit", "mine"}
    outside = "def load(engine):\n    engine.mine = 2\n    engine.part = 3\n"
    assert [(n, t) for _, n, t in foreign_assignments(outside) if n in names] == \
        [("mine", "engine.mine")]
    shell = ("def load(args, ask: Optional['Owner']):\n    e = Owner.load(args)\n"
             "    e.other = 1\n    ask.other = 2\n    slot.engine.other = 3\n"
             "    args.other = 4\n    with Owner(1) as o:\n        setattr(o, 'other', 5)\n")
    bound = bound_names(shell, {"Owner"})
    assert bound == ENGINE_NAMES | {"e", "ask", "o"}
    assert [t for _, _, t in assignments_on(shell, bound)] == [
        "e.other", "ask.other", "slot.engine.other", "setattr(o, 'other', 5)"]
