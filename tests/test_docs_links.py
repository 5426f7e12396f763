"""Every relative link in README.md and docs/*.md resolves: the file exists inside the
repository (the repository stands on its own: no link leaves it), and an ``#anchor`` names a
heading of that file (GitHub's slug) or an ``<a id>`` in it. No model, no network."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]+)\)")
ANCHOR_TAG = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def prose(text: str) -> str:
    """The text links can live in: fenced code blocks and code spans removed."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (links by their text, formatting dropped),
    lower case, punctuation removed, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    found, seen = set(ANCHOR_TAG.findall(text)), {}
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text(encoding="utf-8")))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]     # http:, https:, mailto: …


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if ROOT not in (dest, *dest.parents):
            broken.append(f"{target}: outside the repository")
        elif not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading or anchor '{fragment}' in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_checker_sees_links_and_anchors():
    """Not vacuous: the pages have links, and the slugs follow GitHub's rule."""
    assert sum(len(links(p)) for p in PAGES) > 50
    assert slug("`edgespec worker` and `--rpc`: when one machine is not enough") == \
        "edgespec-worker-and---rpc-when-one-machine-is-not-enough"
    assert slug("Numerics per logits row (Gemma: 262,144 entries)") == \
        "numerics-per-logits-row-gemma-262144-entries"
    assert "block-verification" in anchors(ROOT / "docs" / "decisions.md")
