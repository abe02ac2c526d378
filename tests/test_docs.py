"""The README and the pages under docs/ link to files and headings that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "dev").glob("*.md")),
         ROOT / "edged" / "audio" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The anchors a page's headings get, as GitHub makes them: lower case, punctuation but - and _
    dropped, spaces as dashes, a repeated one numbered."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#+ (.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return found


def prose(page: Path) -> str:
    """A page without its code: fenced blocks and inline code spans hold no links."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def test_every_link_reaches_a_file_and_heading():
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page)):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if f"(docs/{p.name}" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_every_engineering_page_is_linked_from_its_index():
    index = (ROOT / "docs" / "dev" / "README.md").read_text()
    unlinked = [p.name for p in (ROOT / "docs" / "dev").glob("*.md") if p.name != "README.md" and f"({p.name}" not in index]
    assert not unlinked, f"docs/dev pages docs/dev/README.md does not link: {unlinked}"
