"""The README (the front door) and the documentation site (docs/, MkDocs):
every internal link leads somewhere, every ``make`` target and ``aistack``
command they show exists, every page is in the site's navigation, and the
site builds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

from aistack import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = (ROOT / "README.md", *sorted(DOCS.rglob("*.md")))

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_SPAN = re.compile(r"`([^`\n]+)`")
_MAKE = re.compile(r"(?:^|[\s;&|(])make ([a-z][a-z0-9-]*)")
_AISTACK = re.compile(r"(?:^|[\s;&|(])aistack ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (links in code are not links)."""
    return _FENCE.sub("", text)


def code(text: str) -> Iterator[str]:
    """Each fenced block's lines and each inline code span of ``text``."""
    for block in _FENCE.findall(text):
        yield from block.splitlines()[1:-1]
    yield from _SPAN.findall(prose(text))


def anchors(page: Path) -> set[str]:
    """The heading ids MkDocs gives ``page`` (its toc extension's slugify over
    each heading's text, inline code and emphasis marks dropped)."""
    ids = set()
    for line in prose(page.read_text()).splitlines():
        heading = re.match(r"^#{1,6} (.+)$", line)
        if heading:
            text = re.sub(r"[`*_]", "", heading.group(1))
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
            ids.add(slugify(text, "-"))
    return ids


def internal_links() -> Iterator[tuple[Path, str]]:
    for page in PAGES:
        for target in _LINK.findall(prose(page.read_text())):
            if not re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                yield page, target


def test_every_internal_link_leads_to_a_page_and_heading_that_exist() -> None:
    broken = []
    for page, target in internal_links():
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_readme_leads_into_the_site() -> None:
    targets = {target for page, target in internal_links() if page.name == "README.md"}
    assert {"docs/index.md", "docs/settings.md", "docs/your-model.md"} <= targets


@cache
def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z0-9-]*):", text, re.MULTILINE))


def test_every_make_target_shown_exists() -> None:
    shown = {
        (page.relative_to(ROOT), target)
        for page in PAGES
        for snippet in code(page.read_text())
        for target in _MAKE.findall(snippet)
    }
    assert shown, "the pages show no make target at all: the pattern is wrong"
    targets = make_targets()
    missing = sorted(f"{page}: make {target}" for page, target in shown if target not in targets)
    assert missing == []


def _subcommands(command: object) -> dict[str, object]:
    """A command group's subcommands by name ({} for a single command)."""
    return dict(getattr(command, "commands", {}))


def test_every_aistack_command_shown_exists() -> None:
    top = _subcommands(cli.command())
    wrong = []
    shown = 0
    for page in PAGES:
        for snippet in code(page.read_text()):
            for first, second in _AISTACK.findall(snippet):
                shown += 1
                if first not in top:
                    wrong.append(f"{page.relative_to(ROOT)}: aistack {first}")
                    continue
                below = _subcommands(top[first])
                if second and below and second not in below:
                    wrong.append(f"{page.relative_to(ROOT)}: aistack {first} {second}")
    assert shown, "the pages show no aistack command at all: the pattern is wrong"
    assert wrong == []


def nav_pages(entries: object) -> Iterator[str]:
    if isinstance(entries, str):
        yield entries
    elif isinstance(entries, list):
        for entry in entries:
            yield from nav_pages(entry)
    elif isinstance(entries, dict):
        for value in entries.values():
            yield from nav_pages(value)


def test_every_page_is_in_the_navigation_and_every_entry_is_a_page() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = list(nav_pages(config["nav"]))
    pages = sorted(str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md"))
    assert sorted(listed) == pages


def test_the_site_builds_with_no_warning(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed here (make setup installs the docs group)")
    built = subprocess.run(
        # Not --quiet: it hides the warnings that --strict would count.
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "settings" / "index.html").exists()
