"""mkdocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

The changelog page (``docs/changelog.md``) holds a marker line per package,
``<!-- changelog: capture -->``, replaced at build time by that package's ``CHANGELOG.md``
with its headings moved one level down, so the page always shows the files as they are.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- changelog: (?P<package>[a-z]+) -->$", re.M)


def _demoted(text: str) -> str:
    """Headings one level down, under the page's section of the package; the file's own title
    line dropped (the section names it)."""
    lines = text.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    out = []
    fenced = False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,4} ", line):
            line = "#" + line
        out.append(line)
    return "\n".join(out).strip() + "\n"


def changelog_section(match: re.Match[str]) -> str:
    path = ROOT / "packages" / match["package"] / "CHANGELOG.md"
    return _demoted(path.read_text(encoding="utf-8"))


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != "changelog.md":
        return markdown
    return MARKER.sub(changelog_section, markdown)
