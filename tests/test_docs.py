"""The docs' shape: every guide fits 8 KB (written to the reader, the details in the code and the
results), and the README's pictures and the guides' relative links point at files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDES = sorted((ROOT / "docs" / "guide").glob("*.md"))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_every_guide_fits_8_kb(guide):
    assert guide.stat().st_size <= 8 * 1024, f"{guide.name}: {guide.stat().st_size} bytes"


@pytest.mark.parametrize("page", [ROOT / "README.md", *GUIDES], ids=lambda p: p.name)
def test_relative_links_and_pictures_exist(page):
    targets = [t for t in LINK.findall(page.read_text()) if "://" not in t and not t.startswith("mailto:")]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


def test_the_readme_shows_a_picture():
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", (ROOT / "README.md").read_text())
    assert pictures and all((ROOT / p).is_file() for p in pictures)
