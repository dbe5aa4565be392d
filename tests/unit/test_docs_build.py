"""The README is a front door, and the docs under docs/ build in strict mode without a broken link."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# [text](target) outside code; images too. Targets with a scheme or a bare anchor are skipped below.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(project / "mkdocs.yml")]
        + ["-d", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _copy_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", project / "docs")
    return project


def _nav_pages(config: dict) -> list[str]:
    pages: list[str] = []
    for entry in config["nav"]:
        pages.extend(entry.values() if isinstance(entry, dict) else [entry])
    return pages


def _outside_code(text: str) -> str:
    """The Markdown without fenced blocks and inline code, where a link is only text."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _relative_links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(_outside_code(path.read_text()))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")
    ]


def _anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*$", path.read_text(), flags=re.M)
    return {slugify(heading.replace("`", ""), "-") for heading in headings}


def test_the_docs_build_in_strict_mode_and_every_page_is_in_the_nav(tmp_path: Path) -> None:
    result = _build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["strict"] is True
    pages = _nav_pages(config)
    assert sorted(pages) == sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    for page in pages:
        html = (tmp_path / "site" / page.replace(".md", ".html")).read_text()
        # offline: no script, style sheet or image from another host (plain <a> links may point out)
        assert not re.findall(r"<(?:script|link|img)[^>]+(?:src|href)=\"(?:https?:)?//", html), page


@pytest.mark.parametrize(
    ("page", "addition", "complaint"),
    [
        ("operations.md", "See [nowhere](no-such-page.md).", "no-such-page.md"),
        ("index.md", "See [a heading](architecture.md#no-such-heading).", "no-such-heading"),
        ("security.md", "See [a heading](#nor-this-one).", "nor-this-one"),
    ],
)
def test_a_broken_link_fails_the_build(
    tmp_path: Path, page: str, addition: str, complaint: str
) -> None:
    project = _copy_project(tmp_path)
    target = project / "docs" / page
    target.write_text(target.read_text() + "\n" + addition + "\n")
    result = _build(project, tmp_path / "site")
    assert result.returncode != 0
    assert complaint in result.stdout + result.stderr


def test_a_page_left_out_of_the_nav_fails_the_build(tmp_path: Path) -> None:
    project = _copy_project(tmp_path)
    (project / "docs" / "orphan.md").write_text("# An orphan\n")
    result = _build(project, tmp_path / "site")
    assert result.returncode != 0
    assert "orphan.md" in result.stdout + result.stderr


def test_the_readme_is_a_front_door_under_200_lines_with_the_two_commands_first() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 200
    first_block = re.search(r"^```sh\n(.*?)^```", text, flags=re.S | re.M)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["bash scripts/run", "bash scripts/test"]
    assert "bash scripts/test" in (ROOT / ".ci" / "run").read_text().splitlines()


@pytest.mark.parametrize("document", ["README.md", "bench/README.md"])
def test_every_relative_link_points_to_a_file_and_heading_that_exist(document: str) -> None:
    source = ROOT / document
    links = _relative_links(source)
    assert links
    broken = []
    for link in links:
        file_part, _, anchor = link.partition("#")
        target = (source.parent / file_part).resolve() if file_part else source
        if not target.exists():
            broken.append(link)
        elif anchor and (target.suffix != ".md" or anchor not in _anchors(target)):
            broken.append(link)
    assert broken == []
    bare = re.findall(r"\]\((#[^)\s]+)\)", _outside_code(source.read_text()))
    assert [a for a in bare if a[1:] not in _anchors(source)] == []
