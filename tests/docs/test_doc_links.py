"""Every relative link of every Markdown file of the repository reaches a file of the repository,
and every `#anchor` a heading of the file it names (GitHub's anchors: the heading in lower case,
punctuation dropped, spaces as hyphens, a repeated heading numbered); every alert's `runbook_url`
is such a link too. No Markdown file is over 700 lines, no topic page over 600. README.md's code
map names every source file of the module."""
from __future__ import annotations

import glob
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.harness.envoy import REPO

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
MAX_LINES = 700
# The operator's and the proofs' topic pages, each behind its index (envoyfilter/README.md, tests/README.md).
PAGES = ("envoyfilter/docs", "tests/docs")
MAX_PAGE_LINES = 600
# Every file an alert is defined in, with the runbook it points to.
RULE_FILES = ["envoyfilter/observability/drain-gate.rules.yaml", "envoyfilter/observability/drain-gate.prometheusrule.yaml",
              "envoyfilter/chart/files/drain-gate.rules.yaml", "tests/observability/drain-gate.rules.test.yaml"]


def markdown_files() -> list[str]:
    """The repository's Markdown files, as git sees them (tracked, or new and not ignored)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return sorted(f for f in set(out) if (REPO / f).exists())


MARKDOWN = markdown_files()


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


def broken(base: Path, target: str, origin: Path | None = None, root: Path = REPO) -> str | None:
    """Why `target` (relative to the directory `base`; a bare `#anchor` is in `origin`) does not resolve
    to a file under `root`, or to a heading of it."""
    path, _, anchor = target.partition("#")
    dest = (base / path).resolve() if path else origin
    if dest is None or not dest.exists() or root.resolve() not in (dest, *dest.parents):
        return f"{target}: no such file"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: no such heading"
    return None


def test_every_markdown_file_is_found():
    for readme in ("README.md", "envoyfilter/README.md", "tests/README.md"):
        assert readme in MARKDOWN
    for pages in PAGES:
        assert any(f.startswith(pages + "/") for f in MARKDOWN), f"no page under {pages}"


@pytest.mark.parametrize("md", MARKDOWN)
def test_relative_links_and_anchors_resolve(md):
    path = REPO / md
    bad = [why for target in links(path) if (why := broken(path.parent, target, path))]
    assert not bad, bad


@pytest.mark.parametrize("md", MARKDOWN)
def test_no_markdown_file_is_too_long(md):
    lines = len((REPO / md).read_text().splitlines())
    cap = MAX_PAGE_LINES if md.startswith(PAGES) else MAX_LINES
    assert lines <= cap, f"{md} has {lines} lines, over {cap}: split it by topic"


def runbook_urls(doc) -> list[str]:
    if isinstance(doc, dict):
        return ([doc["runbook_url"]] if isinstance(doc.get("runbook_url"), str) else []) + [
            u for v in doc.values() for u in runbook_urls(v)]
    if isinstance(doc, list):
        return [u for v in doc for u in runbook_urls(v)]
    return []


@pytest.mark.parametrize("rules", RULE_FILES)
def test_every_runbook_url_resolves(rules):
    urls = [u for doc in yaml.safe_load_all((REPO / rules).read_text()) for u in runbook_urls(doc)]
    assert urls, f"{rules} has no runbook_url"
    # A runbook_url is written from the repository's root.
    bad = [why for url in urls if (why := broken(REPO, url))]
    assert not bad, bad


# A page named in a comment or a message, with the title of the section meant:
# `envoyfilter/docs/forms.md, "Gateway API"`, `../docs/install.md ("Requirements")`.
PROSE_REF = re.compile(r'((?:\.\./)*[\w./-]*\.md),? \(?"([^"\n]{3,80})"')


def prose_refs(text: str) -> list[tuple[str, str]]:
    return PROSE_REF.findall(text)


def tracked_text_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return sorted(f for f in set(out) if not f.endswith((".md", ".svg", ".png", ".json", ".wasm", ".b64"))
                  and (REPO / f).is_file())


def test_every_section_a_file_names_is_a_heading_of_that_page():
    """A reference in a comment or a message (`../docs/install.md, "Go-live checklist"`) names a page that
    exists and the beginning of one of its headings (backticks dropped)."""
    bad = []
    for f in tracked_text_files():
        if f == "tests/docs/test_doc_links.py":  # its own examples
            continue
        try:
            text = (REPO / f).read_text()
        except UnicodeDecodeError:
            continue
        for page, title in prose_refs(text):
            # Relative to the file, else to the root; a chart template's, to its render
            # (envoyfilter/gateway-api/ holds the Gateway API options).
            candidates = [(REPO / f).parent / page, REPO / page, REPO / "envoyfilter" / "gateway-api" / page]
            dest = next((c for c in candidates if c.exists()), None)
            if dest is None:
                bad.append(f"{f}: {page} (no such file)")
                continue
            heads = [h.replace("`", "").lower() for h in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", dest.read_text()), re.M)]
            if not any(h.startswith(title.replace("`", "").lower()) for h in heads):
                bad.append(f"{f}: {page}, \"{title}\" (no such heading)")
    assert not bad, bad


def test_a_prose_reference_is_read_as_page_and_title():
    assert prose_refs('see ../docs/install.md, "Go-live checklist", step 4') == [("../docs/install.md", "Go-live checklist")]
    assert prose_refs('(../docs/forms.md ("Gateway API") shows') == [("../docs/forms.md", "Gateway API")]
    assert prose_refs('envoyfilter/docs/lb.md "F5 BIG-IP" states') == [("envoyfilter/docs/lb.md", "F5 BIG-IP")]


def test_a_link_to_a_missing_file_or_heading_is_caught(tmp_path):
    (tmp_path / "a.md").write_text("# One\n\n## Two words\n\n## Two words\n")
    assert broken(tmp_path, "a.md#two-words-1", root=tmp_path) is None
    assert broken(tmp_path, "a.md#three", root=tmp_path) == "a.md#three: no such heading"
    assert broken(tmp_path, "b.md", root=tmp_path) == "b.md: no such file"
    assert broken(tmp_path, "../a.md", root=tmp_path / "sub") == "../a.md: no such file"


def test_anchors_come_from_headings_outside_code_blocks(tmp_path):
    (tmp_path / "a.md").write_text("# One\n\n## Two words\n\n```sh\n# not a heading\n```\n")
    assert anchors(tmp_path / "a.md") == {"one", "two-words"}


def test_the_code_map_names_every_source_file():
    section = (REPO / "README.md").read_text().split("## Code map", 1)[1].split("\n## ", 1)[0]
    mapped = set(re.findall(r"^\| \[`(src/[\w/]+\.rs)`\]", section, re.M))
    sources = {p.relative_to(REPO).as_posix() for p in (REPO / "src").rglob("*.rs")
               if p.relative_to(REPO).as_posix() not in ("src/lib.rs", "src/host/mod.rs")}
    assert mapped == sources, f"missing: {sorted(sources - mapped)}, gone: {sorted(mapped - sources)}"


# A path into tests/ or envoyfilter/ named in any file: `tests/lb/test_prove.py`, `../../tests/lb/`,
# `tests/deploy/test_gateway_api*.py`, `envoyfilter/docs/lb.md`.
PATH_REF = re.compile(r"(?<![\w./-])((?:\.\./)*(?:tests|envoyfilter)/[\w./*-]*[\w*/])")
# Paths of Istio's own repository that a source note names, not of this one.
UPSTREAM = {"tests/integration/pilot/testdata/gateway-api-crd.yaml", "envoyfilter/listener_patch.go"}


def test_every_path_a_file_names_exists():
    bad = []
    for f in tracked_text_files() + MARKDOWN:
        try:
            text = (REPO / f).read_text()
        except UnicodeDecodeError:
            continue
        for ref in set(PATH_REF.findall(text)):
            if f == "tests/docs/test_doc_links.py" or "<" in ref or ref in UPSTREAM:
                continue
            here = (REPO / f).parent
            candidates = [REPO / ref, here / ref, REPO / "envoyfilter" / "gateway-api" / ref]
            if not any(glob.glob(str(c).rstrip("/")) for c in candidates):
                bad.append(f"{f}: {ref}")
    assert not bad, sorted(bad)
