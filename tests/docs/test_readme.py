"""The README stays a front page: at most 250 lines, and every link in it resolves (a file
of the repository, or a heading of the README itself)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).strip().replace(" ", "-")


def test_the_readme_is_at_most_250_lines():
    assert len(README.splitlines()) <= 250


def test_every_link_in_the_readme_resolves():
    headings = {_slug(h) for h in re.findall(r"^#+ (.*)$", README, re.M)}
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    assert len(links) >= 20
    broken = []
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        if not path:
            if anchor not in headings:
                broken.append(link)
        elif not (ROOT / path).exists():
            broken.append(link)
    assert not broken, f"links in README.md that lead nowhere: {broken}"
