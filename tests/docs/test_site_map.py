"""The site's page lists agree with its nav: mkdocs.yml's nav (four sections: Start, How-to, Reference,
Background) is the one list of pages; docs/index.md and README.md link each of them (recipes through their
overview), and the docs tests check each page, on their own or by the test named for it."""

from __future__ import annotations

import re
from pathlib import Path

from test_docs import CHECKED_ELSEWHERE, CHECKED_PAGES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

#: The nav's sections, in order.
SECTIONS = ("Start", "How-to", "Reference", "Background")
#: A nav line that names a page (`- Title: page.md`); read as text, as the bare environment has no YAML.
NAV_PAGE = re.compile(r"^\s*- [^:]+: (\S+\.md)$", re.M)
#: A top-level nav section (`  - Start:`).
NAV_SECTION = re.compile(r"^  - ([^:]+):$", re.M)
#: The recipe pages other than their overview: the lists reach them through recipes/index.md.
RECIPE_PAGE = re.compile(r"^recipes/(?!index\.md$)")


def nav_text() -> str:
    text = (ROOT / "mkdocs.yml").read_text()
    return text[text.index("\nnav:\n"):].split("\n\n")[0]


def nav_pages() -> list[str]:
    return NAV_PAGE.findall(nav_text())


def linked(text: str, prefix: str = "") -> set[str]:
    """The docs pages ``text`` links (relative to docs/), anchors dropped."""
    return {m.group(1) for m in re.finditer(rf"\]\({re.escape(prefix)}([\w/.-]+\.md)(?:#[\w-]*)?\)", text)}


def listed_pages() -> set[str]:
    """The nav's pages a page list must link: all but the home page and the recipes below their overview."""
    return {p for p in nav_pages() if p != "index.md" and not RECIPE_PAGE.match(p)}


def test_the_nav_has_four_sections_and_every_page_once():
    assert tuple(NAV_SECTION.findall(nav_text())) == SECTIONS
    pages = nav_pages()
    assert len(pages) == len(set(pages)), pages
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "examples" not in p.parts}
    assert set(pages) == on_disk, f"in the nav only: {set(pages) - on_disk}; on disk only: {on_disk - set(pages)}"


def test_the_home_page_lists_the_nav_s_pages():
    text = (DOCS / "index.md").read_text()
    shown = linked(text[text.index("## Read on"):])
    assert shown == listed_pages(), f"missing: {listed_pages() - shown}; not in the nav: {shown - listed_pages()}"


def test_the_readme_lists_the_nav_s_pages():
    text = (ROOT / "README.md").read_text()
    shown = linked(text[text.index("## Documentation"):], "docs/") - {"index.md"}
    assert shown == listed_pages(), f"missing: {listed_pages() - shown}; not in the nav: {shown - listed_pages()}"


def test_every_page_of_the_nav_is_checked_here_or_names_what_checks_it():
    checked = set(CHECKED_PAGES) | set(CHECKED_ELSEWHERE)
    assert not set(CHECKED_PAGES) & set(CHECKED_ELSEWHERE)
    assert checked == set(nav_pages()), (f"unchecked: {set(nav_pages()) - checked}; "
                                         f"not in the nav: {checked - set(nav_pages())}")


def test_a_page_missing_from_a_list_is_found():
    text = "- [Quickstart](quickstart.md#install) and [the matrix](matrix.md)\n"
    assert linked(text) == {"quickstart.md", "matrix.md"}
    assert linked("- [design](docs/design.md)", "docs/") == {"design.md"}
    assert "cluster.md" in listed_pages() and "recipes/lightning.md" not in listed_pages()
