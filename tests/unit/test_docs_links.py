"""The docs hang together: every page under docs/ is reachable from README.md by following
links, and every relative Markdown link in README.md and docs/ points to a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); the target ends at whitespace (a title may follow) or ')'.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _relative_links(page: Path) -> list[str]:
    """Link targets of a page outside code, without anchors; URLs and pure anchors left out."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", page.read_text()))
    targets = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def _resolve(page: Path, target: str) -> Path:
    return (page.parent / target).resolve()


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_every_relative_link_points_to_a_file():
    broken = []
    for page in _pages():
        for target in _relative_links(page):
            path = _resolve(page, target)
            if path.exists():
                continue
            broken.append(f"{_rel(page)}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_every_docs_page_is_reachable_from_the_readme():
    readme = REPO / "README.md"
    seen = {readme}
    todo = [readme]
    while todo:
        page = todo.pop()
        for target in _relative_links(page):
            path = _resolve(page, target)
            if path.suffix == ".md" and path.is_file() and path not in seen:
                seen.add(path)
                todo.append(path)
    unreachable = [_rel(p) for p in _pages() if p not in seen]
    assert not unreachable, "docs pages no link leads to from README.md:\n" + "\n".join(unreachable)


def test_the_checks_see_links():
    # Guards the regexes: the README's own links must be found, or both tests above pass vacuously.
    links = _relative_links(REPO / "README.md")
    assert "docs/commands.md" in links
    assert "docs/spec-reference.md" in links
