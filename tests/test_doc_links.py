"""Every relative link of the three READMEs reaches a file of the repository,
and every `#anchor` a heading of the file it names (GitHub's anchors: the
heading in lower case, punctuation dropped, spaces as hyphens). README.md's
code map names every source file of the module."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.harness.envoy import REPO

READMES = ["README.md", "envoyfilter/README.md", "tests/README.md"]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", md.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug)
        seen[slug] = 0 if n is None else n + 1
        out.add(slug if n is None else f"{slug}-{n + 1}")
    return out


def links(md: Path) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", md.read_text()))
            if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("readme", READMES)
def test_relative_links_and_anchors_resolve(readme):
    md = REPO / readme
    broken = []
    for target in links(md):
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists() or REPO.resolve() not in (dest, *dest.parents):
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


def test_anchors_come_from_headings_outside_code_blocks(tmp_path):
    (tmp_path / "a.md").write_text("# One\n\n## Two words\n\n```sh\n# not a heading\n```\n")
    assert anchors(tmp_path / "a.md") == {"one", "two-words"}


def test_the_code_map_names_every_source_file():
    section = (REPO / "README.md").read_text().split("## Code map", 1)[1].split("\n## ", 1)[0]
    mapped = set(re.findall(r"^\| \[`(src/[\w/]+\.rs)`\]", section, re.M))
    sources = {p.relative_to(REPO).as_posix() for p in (REPO / "src").rglob("*.rs")
               if p.relative_to(REPO).as_posix() not in ("src/lib.rs", "src/host/mod.rs")}
    assert mapped == sources, f"missing: {sorted(sources - mapped)}, gone: {sorted(mapped - sources)}"
