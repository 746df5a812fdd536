"""The docs by reader: a short README, the guides on the mkdocs site, no pointer to a moved page.

`make docs` builds the site with ``mkdocs build --strict`` (broken links and anchors fail it); these
checks need no mkdocs, so the default suite runs them."""

from __future__ import annotations

import os
import re
import subprocess
import pytest

from tests.support.paths import REPO

ROOT = str(REPO)
README_MAX_BYTES = 8_000  # issue 61: under 8 kB
PAGE_MAX_BYTES = 40_000  # issue 61: no page under docs/ of 40 kB or more
CELL_MAX_CHARS = 160  # the README's results table: short cells, a link for the rest
LIMITATION_MAX_LINES = 4
CHANGELOG_SECTIONS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


@pytest.mark.fast
def test_the_readme_is_under_8_kb():
    size = len(_read("README.md").encode("utf-8"))
    assert size < README_MAX_BYTES, f"README.md is {size} bytes, expected under {README_MAX_BYTES}: move detail to docs/"


@pytest.mark.fast
def test_the_readme_results_table_has_short_cells():
    text = _read("README.md")
    table = text[text.index("## Results"):].split("\n## ")[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    assert len(rows) > 3, "the README's results table is missing"
    long = [c.strip() for ln in rows for c in ln.strip("|").split("|") if len(c.strip()) > CELL_MAX_CHARS]
    assert not long, f"README results cells over {CELL_MAX_CHARS} characters (link to docs/results.md instead): {long}"


def _pages():
    for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
        for f in files:
            if f.endswith(".md"):
                yield os.path.relpath(os.path.join(folder, f), ROOT)


@pytest.mark.fast
def test_no_page_under_docs_is_40_kb_or_more():
    big = {p: os.path.getsize(os.path.join(ROOT, p)) for p in _pages()}
    big = {p: n for p, n in big.items() if n >= PAGE_MAX_BYTES}
    assert not big, f"pages under docs/ of {PAGE_MAX_BYTES} bytes or more (move history to archive/): {big}"


@pytest.mark.fast
def test_the_lab_notebook_is_out_of_the_site():
    """Its conclusions are decision records in the site; the notebook itself is archive/lab-notebook.md
    (outside docs_dir), and the stub at its old path is excluded from the build."""
    config = _read("mkdocs.yml")
    assert "lab-notebook" not in config.split("nav:")[1], "the lab notebook is in the site's nav"
    assert re.search(r"^exclude_docs: \|\n\s+archive/$", config, re.M), "docs/archive/ is built into the site"
    assert os.path.isfile(os.path.join(ROOT, "archive", "lab-notebook.md"))
    records = [p for p in _pages() if p.startswith(os.path.join("docs", "decisions")) and not p.endswith("index.md")]
    assert len(records) >= 5
    for p in records:  # each record cites its evidence: the notebook's section and the commit
        assert re.search(r"\*\*Evidence\.\*\* `archive/lab-notebook\.md`, \".+\", commit `[0-9a-f]{7}`", " ".join(
            _read(p).split())), f"{p}: no evidence line naming the notebook's section and its commit"


@pytest.mark.fast
def test_each_known_limitation_is_at_most_4_lines_with_a_link():
    text = _read("docs", "guides", "known-limitations.md")
    body = text[text.index("## Not yet good enough"):text.index("## Known gaps")]
    items = re.split(r"^- ", body, flags=re.M)[1:]
    assert len(items) >= 5
    for item in items:
        lines = item.strip().splitlines()
        assert len(lines) <= LIMITATION_MAX_LINES, f"a limitation of {len(lines)} lines: {item[:80]!r}"
        assert "](" in item, f"a limitation without a link: {item[:80]!r}"


@pytest.mark.fast
def test_the_results_page_has_one_table_per_question_with_its_command():
    text = _read("docs", "results.md")
    for section in text.split("\n## ")[1:]:
        title = section.splitlines()[0]
        tables = re.findall(r"(?:^\|.*\n)+", section, re.M)
        assert len(tables) <= 1, f"results section {title!r} holds {len(tables)} tables, expected one per question"
        assert re.search(r"`[^`]*(scripts/|disco |make |python )[^`]*`|```bash", section), (
            f"results section {title!r} names no command that regenerates it")


@pytest.mark.fast
def test_the_changelog_keeps_a_changelog_one_line_per_change():
    text = _read("CHANGELOG.md")
    assert text.startswith("# Changelog\n") and "\n## [Unreleased]\n" in text
    sections = re.findall(r"^### (.+)$", text, re.M)
    assert sections and set(sections) <= set(CHANGELOG_SECTIONS), sections
    body = text[text.index("## [Unreleased]"):]
    entries = [ln for ln in body.splitlines() if ln.strip() and not ln.startswith("#")]
    continued = [ln for ln in entries if not ln.startswith("- ")]
    assert not continued, f"CHANGELOG entries over more than one line: {continued[:3]}"


@pytest.mark.fast
def test_every_page_in_the_site_nav_exists():
    pages = re.findall(r":\s*([\w/.-]+\.md)\s*$", _read("mkdocs.yml"), re.M)
    assert "index.md" in pages and "results.md" in pages and "architecture.md" in pages
    missing = [p for p in pages if not os.path.isfile(os.path.join(ROOT, "docs", p))]
    assert not missing, f"mkdocs.yml's nav names pages that docs/ lacks: {missing}"


@pytest.mark.fast
def test_the_readme_links_to_files_that_exist():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", _read("README.md"))
    missing = [p for p in links if not p.startswith("http") and not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, f"README.md links to missing files: {missing}"


def test_nothing_points_at_the_moved_lab_notebook():
    """docs/benchmarks.md moved to docs/archive/lab-notebook.md (current figures: docs/results.md)."""
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.cfg", "*.yml", "Makefile"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    # CHANGELOG.md records the move itself, and archive/ keeps its texts as they were written
    stale = [f for f in files if f not in ("CHANGELOG.md", "tests/docs/test_docs.py") and not f.startswith("archive/")
             and "docs/benchmarks.md" in _read(f)]
    assert not stale, f"files still naming docs/benchmarks.md: {stale}"
