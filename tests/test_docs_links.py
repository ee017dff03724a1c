"""Every relative link in README.md and docs/ points at a file that exists, and every #anchor at a heading
(or an explicit <a id>) of that file, as GitHub renders them. The docs cross-reference each other by
section; a renamed heading or a moved section would otherwise leave dead links behind silently."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = heading.replace("`", "")
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower(), flags=re.UNICODE)
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    found: set[str] = set()
    repeats: dict[str, int] = {}
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        found.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
        heading = re.match(r"^#{1,6}\s+(.*)$", line)
        if heading:
            s = slug(heading.group(1))
            n = repeats.get(s, 0)
            found.add(s if n == 0 else f"{s}-{n}")  # GitHub numbers repeated headings
            repeats[s] = n + 1
    return found


def links_of(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [m.group(1) for m in LINK.finditer(text) if not re.match(r"^[a-z]+:", m.group(1))]


def test_slug_follows_github():
    assert slug("Where it stands") == "where-it-stands"
    assert slug("A ceiling that yields to latency (2026-12-06, session 88)") == (
        "a-ceiling-that-yields-to-latency-2026-12-06-session-88")
    assert slug("Simulator (`sim.py`)") == "simulator-simpy"
    assert slug("Transfer Hotel → Social (the paper's §5.3, Figure 8)") == (
        "transfer-hotel--social-the-papers-53-figure-8")


def test_anchor_check_catches_a_dead_link(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# Title\n\n## Part one\n\n[ok](#part-one) [dead](#part-two)\n", encoding="utf-8")
    anchors = anchors_of(page)
    assert "part-one" in anchors and "part-two" not in anchors
    assert links_of(page) == ["#part-one", "#part-two"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    cache: dict[Path, set[str]] = {}
    dead = []
    for link in links_of(doc):
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc.resolve()
        if not target.exists():
            dead.append(f"{link} (no such file)")
            continue
        if anchor and target.suffix == ".md":
            if target not in cache:
                cache[target] = anchors_of(target)
            if anchor not in cache[target]:
                dead.append(f"{link} (no such heading)")
    assert not dead, f"{doc.relative_to(ROOT)}: " + "; ".join(dead)
