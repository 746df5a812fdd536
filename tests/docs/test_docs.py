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
README_MAX_BYTES = 10_000


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


@pytest.mark.fast
def test_the_readme_is_at_most_10_kb():
    size = len(_read("README.md").encode("utf-8"))
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, expected at most {README_MAX_BYTES}: move detail to docs/"


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
    # CHANGELOG.md records the move itself
    stale = [f for f in files if f not in ("CHANGELOG.md", "tests/docs/test_docs.py") and "docs/benchmarks.md" in _read(f)]
    assert not stale, f"files still naming docs/benchmarks.md: {stale}"
